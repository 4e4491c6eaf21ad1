"""torchvision's `VisionTransformer` state dicts (`vit_b_16` and friends) to and from our names.

torchvision keeps q, k, v fused as `in_proj_weight` (3D, D) in the same order as timm's `qkv`, so the
conversion is a renaming. Its MLP is an `nn.Sequential`: `mlp.0` / `mlp.3` (older releases: `linear_1` /
`linear_2`).
"""

from __future__ import annotations

import re

import torch

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

