"""torchvision's `VisionTransformer` state dicts (`vit_b_16` and friends) to and from our names.

torchvision keeps q, k, v fused as `in_proj_weight` (3D, D) in the same order as timm's `qkv`, so the
conversion is a renaming. Its MLP is an `nn.Sequential`: `mlp.0` / `mlp.3` (older releases: `linear_1` /
`linear_2`).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from ..models.config import ViTConfig
from ..models.posembed import sincos_2d
from .report import WeightsError

_TOP = {
    "class_token": "cls_token",
    "conv_proj.weight": "patch_embed.proj.weight",
    "conv_proj.bias": "patch_embed.proj.bias",
    "encoder.pos_embedding": "pos_embed",
    "encoder.ln.weight": "norm.weight",
    "encoder.ln.bias": "norm.bias",
    "heads.head.weight": "head.weight",
    "heads.head.bias": "head.bias",
    "heads.pre_logits.weight": "pre_logits.fc.weight",
    "heads.pre_logits.bias": "pre_logits.fc.bias",
}
_LAYER = {
    "ln_1": "norm1",
    "self_attention.in_proj_weight": "attn.qkv.weight",
    "self_attention.in_proj_bias": "attn.qkv.bias",
    "self_attention.out_proj": "attn.proj",
    "ln_2": "norm2",
    "mlp.0": "mlp.fc1",
    "mlp.linear_1": "mlp.fc1",
    "mlp.3": "mlp.fc2",
    "mlp.linear_2": "mlp.fc2",
}
_LAYER_RE = re.compile(r"encoder\.layers\.encoder_layer_(\d+)\.(.+)")


def matches(keys: set[str]) -> bool:
    """True for a torchvision ViT state dict."""
    return "encoder.pos_embedding" in keys or "conv_proj.weight" in keys


def to_ours(state: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """Rename torchvision's tensors to ours."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key in _TOP:
            out[_TOP[key]] = value
            continue
        m = _LAYER_RE.fullmatch(key)
        if m is None:
            if key.startswith("conv_proj."):
                raise WeightsError(f"{source}: {key!r} is a convolutional stem (conv_stem_configs); not supported")
            raise WeightsError(f"{source}: unknown torchvision ViT tensor {key!r}")
        i, rest = m.groups()
        for old, new in _LAYER.items():
            if rest == old or rest.startswith(old + "."):
                out[f"blocks.{i}.{new}{rest[len(old):]}"] = value
                break
        else:
            raise WeightsError(f"{source}: unknown torchvision ViT tensor {key!r}")
    return out



# -- writing: ours -> torchvision.models.vision_transformer.VisionTransformer ---------------------------------

TORCHVISION_EPS = 1e-6  # vit_b_16 & co. build their LayerNorms as partial(nn.LayerNorm, eps=1e-6)
# torchvision's builders: (patch_size, num_layers, num_heads, hidden_dim, mlp_dim) -> name
_BUILDERS = {(16, 12, 12, 768, 3072): "vit_b_16", (32, 12, 12, 768, 3072): "vit_b_32",
             (16, 24, 16, 1024, 4096): "vit_l_16", (32, 24, 16, 1024, 4096): "vit_l_32",
             (14, 32, 16, 1280, 5120): "vit_h_14"}


def model_args(cfg: ViTConfig, source: str = "model") -> dict[str, Any]:
    """The arguments of torchvision's `VisionTransformer(...)` that build `cfg`'s network.

    Raises:
        WeightsError: torchvision's ViT cannot compute it (hybrid, non-square input, not 3 channels, no class
            token or average pooling, no head).
    """
    why = None
    if cfg.hybrid_layers is not None:
        why = ("it is a hybrid (ResNet stem before the patch embedding); torchvision's conv_stem_configs build a "
               "plain conv stem, not the BiT ResNet. Use --to timm or --to npz")
    elif cfg.img_hw[0] != cfg.img_hw[1]:
        why = f"its input is {cfg.img_hw[0]}x{cfg.img_hw[1]}; torchvision's image_size is one side (square only)"
    elif cfg.in_chans != 3:
        why = f"it has {cfg.in_chans} input channels; torchvision's conv_proj takes 3"
    elif cfg.pool != "token":
        why = f"it pools with pool={cfg.pool!r}; torchvision's VisionTransformer classifies the class token"
    elif cfg.num_classes == 0:
        why = "it has no head (num_classes=0); torchvision's VisionTransformer always has one (pass --num-classes)"
    elif cfg.family_options():  # later families' options (RoPE, LayerScale, registers, ...): not in torchvision's ViT
        why = f"it uses {cfg.family_options()}, which torchvision's VisionTransformer does not have"
    if why:
        raise WeightsError(f"{source}: cannot write a torchvision VisionTransformer: {why}")
    return {"image_size": cfg.img_hw[0], "patch_size": cfg.patch_size, "num_layers": cfg.depth,
            "num_heads": cfg.num_heads, "hidden_dim": cfg.embed_dim, "mlp_dim": cfg.mlp_dim,
            "dropout": cfg.dropout, "attention_dropout": cfg.attn_dropout, "num_classes": cfg.num_classes,
            "representation_size": cfg.representation_size}


def builder_name(cfg: ViTConfig) -> str | None:
    """The torchvision builder with `cfg`'s shape ("vit_b_16", ...), or None."""
    return _BUILDERS.get((cfg.patch_size, cfg.depth, cfg.num_heads, cfg.embed_dim, cfg.mlp_dim))


def from_ours(state: dict[str, torch.Tensor], cfg: ViTConfig, source: str = "model") -> tuple[
        dict[str, torch.Tensor], list[str]]:
    """Our tensors in torchvision's names (`mlp.0` / `mlp.3`, the current spelling), plus notes on what was
    made explicit or differs."""
    model_args(cfg, source)
    notes: list[str] = []
    if cfg.drop_path:
        notes.append(f"drop_path={cfg.drop_path} (stochastic depth, training only) has no setting in torchvision's ViT")
    if cfg.layer_norm_eps != TORCHVISION_EPS:
        notes.append(f"the model's LayerNorm eps is {cfg.layer_norm_eps:g} but torchvision builds 1e-6: logits "
                     "differ slightly unless the torchvision model is built with "
                     f"norm_layer=partial(nn.LayerNorm, eps={cfg.layer_norm_eps:g})")
    out = {theirs: state[ours] for theirs, ours in _TOP.items() if ours in state}
    if "pos_embed" not in state:  # torchvision has only a learned table: write the fixed one out
        pos = torch.zeros(1, cfg.seq_len, cfg.embed_dim, dtype=state["cls_token"].dtype)
        if cfg.pos_embed == "sincos2d":
            pos[0, 1:] = sincos_2d(*cfg.grid_size, cfg.embed_dim).to(pos.dtype)
        out["encoder.pos_embedding"] = pos
        notes.append(f"wrote the model's {cfg.pos_embed!r} position embeddings as torchvision's learned table")
    writer = {"norm1": "ln_1", "attn.qkv": "self_attention.in_proj_", "attn.proj": "self_attention.out_proj",
              "norm2": "ln_2", "mlp.fc1": "mlp.0", "mlp.fc2": "mlp.3"}
    for i in range(cfg.depth):
        b, t = f"blocks.{i}.", f"encoder.layers.encoder_layer_{i}."
        for ours, theirs in writer.items():
            sep = "" if theirs.endswith("_") else "."  # in_proj_weight / in_proj_bias
            for kind in ("weight", "bias"):
                if f"{b}{ours}.{kind}" in state:
                    out[f"{t}{theirs}{sep}{kind}"] = state[f"{b}{ours}.{kind}"]
        if not cfg.qkv_bias:  # nn.MultiheadAttention always has q/k/v biases: zeros compute the same
            out[f"{t}self_attention.in_proj_bias"] = torch.zeros(3 * cfg.embed_dim, dtype=state["cls_token"].dtype)
            if i == 0:
                notes.append("the model has no q/k/v biases: wrote zero in_proj_bias")
    return out, notes
