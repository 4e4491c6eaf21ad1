"""Hugging Face `transformers` ViT (`ViTModel`, `ViTForImageClassification`) checkpoints to our names.

Two spellings exist: the files on the Hub and what `save_pretrained` writes use the original names
(`vit.encoder.layer.{i}.attention.attention.query`, `...intermediate.dense`, `...output.dense`); recent
transformers releases name the modules in memory `vit.layers.{i}.attention.q_proj`, `...mlp.fc1`. Both are read.
q, k and v are separate (D, D) projections; ours (timm's) are one (3D, D) `qkv`, concatenated in that order.
`ViTModel`'s pooler (Dense + tanh on the class token) is the paper's pre-logits layer.

Writing (`from_ours`, `config_to_hf`, `preprocessor_config`) gives a directory `ViTForImageClassification`
loads: only what it can compute is written (no hybrids, no pre-logits layer, class-token pooling).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from ..models.config import ViTConfig
from ..models.posembed import sincos_2d
from ..models.preprocess import Preprocess
from .report import WeightsError

_TOP = {
    "embeddings.cls_token": "cls_token",
    "embeddings.position_embeddings": "pos_embed",
    "embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
    "embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias",
    "layernorm.weight": "norm.weight",
    "layernorm.bias": "norm.bias",
    "classifier.weight": "head.weight",
    "classifier.bias": "head.bias",
    "pooler.dense.weight": "pre_logits.fc.weight",
    "pooler.dense.bias": "pre_logits.fc.bias",
}
# Per block: HF sub-name -> ours (None: part of qkv).
_BLOCK = {
    "layernorm_before": "norm1",
    "layernorm_after": "norm2",
    "attention.output.dense": "attn.proj",
    "attention.o_proj": "attn.proj",
    "intermediate.dense": "mlp.fc1",
    "output.dense": "mlp.fc2",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
}
_QKV = {"attention.attention.query": 0, "attention.attention.key": 1, "attention.attention.value": 2,
        "attention.q_proj": 0, "attention.k_proj": 1, "attention.v_proj": 2}
_BLOCK_RE = re.compile(r"(?:encoder\.layer|layers)\.(\d+)\.(.+)\.(weight|bias)")

# HF config.json field -> ViTConfig field.
CONFIG_FIELDS = _CONFIG = {
    "image_size": "img_size",
    "patch_size": "patch_size",
    "num_channels": "in_chans",
    "hidden_size": "embed_dim",
    "num_hidden_layers": "depth",
    "num_attention_heads": "num_heads",
    "intermediate_size": "mlp_dim",
    "layer_norm_eps": "layer_norm_eps",
    "qkv_bias": "qkv_bias",
}


def matches(keys: set[str]) -> bool:
    """True for a transformers ViT state dict (with or without the `vit.` prefix of the classifier)."""
    return any(k.removeprefix("vit.").startswith("embeddings.patch_embeddings.") for k in keys)


def is_hf_config(config: dict[str, Any]) -> bool:
    return isinstance(config, dict) and "model_type" in config


def config_from_hf(config: dict[str, Any], source: str) -> dict[str, Any]:
    """The ViTConfig fields a transformers `config.json` fixes (plus "class_names" from id2label)."""
    if config.get("model_type") != "vit":
        raise WeightsError(f"{source}: config.json is for model_type={config.get('model_type')!r}; only 'vit' is read")
    act = config.get("hidden_act", "gelu")
    if act != "gelu":
        raise WeightsError(f"{source}: hidden_act={act!r}; vitlab's MLP uses exact GELU ('gelu') as the paper does")
    if config.get("pooler_act", "tanh") != "tanh":
        raise WeightsError(f"{source}: pooler_act={config['pooler_act']!r}; the pre-logits layer is Dense + tanh")
    out: dict[str, Any] = {}
    for hf_name, ours in _CONFIG.items():
        if hf_name in config:
            value = config[hf_name]
            out[ours] = tuple(value) if isinstance(value, list) else value
    if isinstance(out.get("patch_size"), tuple):
        ph, pw = out["patch_size"]
        if ph != pw:
            raise WeightsError(f"{source}: non-square patches {ph}x{pw} are not supported")
        out["patch_size"] = ph
    if isinstance(out.get("img_size"), tuple) and out["img_size"][0] == out["img_size"][1]:
        out["img_size"] = out["img_size"][0]
    id2label = config.get("id2label")
    if isinstance(id2label, dict) and id2label:
        labels = [id2label[k] for k in sorted(id2label, key=int)]
        if not all(re.fullmatch(r"LABEL_\d+", str(lab)) for lab in labels):
            out["class_names"] = labels
    return out


def to_ours(state: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """Rename a transformers ViT state dict to ours, fusing q, k, v into qkv."""
    out: dict[str, torch.Tensor] = {}
    qkv: dict[tuple[str, str], list[torch.Tensor | None]] = {}
    for key, value in state.items():
        k = key.removeprefix("vit.")
        if k in _TOP:
            out[_TOP[k]] = value
            continue
        if k == "embeddings.mask_token":
            continue  # only used for masked-image pre-training (ViTForMaskedImageModeling)
        m = _BLOCK_RE.fullmatch(k)
        if m is None:
            raise WeightsError(f"{source}: unknown transformers ViT tensor {key!r}")
        i, sub, kind = m.groups()
        if sub in _QKV:
            qkv.setdefault((i, kind), [None, None, None])[_QKV[sub]] = value
        elif sub in _BLOCK:
            out[f"blocks.{i}.{_BLOCK[sub]}.{kind}"] = value
        else:
            raise WeightsError(f"{source}: unknown transformers ViT tensor {key!r}")
    for (i, kind), parts in qkv.items():
        if any(p is None for p in parts):
            raise WeightsError(f"{source}: block {i} lacks one of query/key/value {kind}")
        q_k_v = [p for p in parts if p is not None]  # all three (checked above)
        if len({tuple(p.shape) for p in q_k_v}) != 1:
            raise WeightsError(f"{source}: block {i}'s query/key/value {kind} differ in shape: "
                               f"{[tuple(p.shape) for p in q_k_v]}")
        out[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat(q_k_v, dim=0)  # (3D, D) / (3D,): q, k, v
    return out


# -- writing: ours -> transformers' ViTForImageClassification ------------------------------------------------

# PIL's resampling enum, as preprocessor_config.json stores it.
_RESAMPLE = {"nearest": 0, "bilinear": 2, "bicubic": 3}


def check_writable(cfg: ViTConfig, source: str) -> None:
    """Raise WeightsError when `ViTForImageClassification` cannot compute what a model with `cfg` computes."""
    why = None
    if cfg.hybrid_layers is not None:
        why = ("it is a hybrid (ResNet stem before the patch embedding); transformers' ViT embeds pixels with one "
               "linear projection (its ViTHybrid is deprecated and does not follow vit_jax's ResNet). Use --to timm "
               "or --to npz")
    elif cfg.representation_size is not None:
        why = (f"it has a pre-logits layer (representation_size={cfg.representation_size}, Dense + tanh before the "
               "head); ViTForImageClassification puts its classifier straight on the class token (ViTModel's "
               "pooler is Dense + tanh, but the classifier does not use it). Fine-tune a new head without "
               "pre-logits, or use --to torchvision / npz")
    elif cfg.pool != "token":
        why = (f"it pools with pool={cfg.pool!r}; ViTForImageClassification classifies the class token only")
    if why:
        raise WeightsError(f"{source}: cannot write a transformers ViTForImageClassification: {why}")


def from_ours(state: dict[str, torch.Tensor], cfg: ViTConfig, source: str = "model") -> tuple[
        dict[str, torch.Tensor], list[str]]:
    """Our tensors in the names of transformers' files (`save_pretrained`'s spelling, read by every release),
    q, k, v split from qkv; plus notes on anything made explicit."""
    check_writable(cfg, source)
    notes: list[str] = []
    if cfg.drop_path:
        notes.append(f"drop_path={cfg.drop_path} (stochastic depth, training only) has no setting in transformers' ViT")
    D = cfg.embed_dim
    out = {
        "vit.embeddings.cls_token": state["cls_token"],
        "vit.embeddings.patch_embeddings.projection.weight": state["patch_embed.proj.weight"],
        "vit.embeddings.patch_embeddings.projection.bias": state["patch_embed.proj.bias"],
        "vit.embeddings.position_embeddings": _position_table(state, cfg, notes),
        "vit.layernorm.weight": state["norm.weight"],
        "vit.layernorm.bias": state["norm.bias"],
    }
    if "head.weight" in state:
        out["classifier.weight"] = state["head.weight"]
        out["classifier.bias"] = state["head.bias"]
    inverse = {"norm1": "layernorm_before", "norm2": "layernorm_after", "attn.proj": "attention.output.dense",
               "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense"}
    for i in range(cfg.depth):
        b, h = f"blocks.{i}.", f"vit.encoder.layer.{i}."
        for ours, theirs in inverse.items():
            for kind in ("weight", "bias"):
                out[f"{h}{theirs}.{kind}"] = state[f"{b}{ours}.{kind}"]
        for kind in ("weight", "bias") if cfg.qkv_bias else ("weight",):
            q, k, v = state[f"{b}attn.qkv.{kind}"].split(D)  # (3D, ...) -> q, k, v in that order
            for name, part in (("query", q), ("key", k), ("value", v)):
                out[f"{h}attention.attention.{name}.{kind}"] = part.clone()  # a view would share storage
    return out, notes


def _position_table(state: dict[str, torch.Tensor], cfg: ViTConfig, notes: list[str]) -> torch.Tensor:
    """The learned table, or the fixed one written out (transformers' ViT only has a learned table)."""
    if "pos_embed" in state:
        return state["pos_embed"]
    dtype = state["cls_token"].dtype
    pos = torch.zeros(1, cfg.seq_len, cfg.embed_dim, dtype=dtype)
    if cfg.pos_embed == "sincos2d":
        pos[0, cfg.num_prefix_tokens :] = sincos_2d(*cfg.grid_size, cfg.embed_dim).to(dtype)
        notes.append("wrote the fixed sin-cos table as a learned position_embeddings (class-token row zero): "
                     f"equal at {cfg.img_size}; at other sizes transformers interpolates it bicubically")
    else:
        notes.append("the model has no position embeddings: wrote a zero position_embeddings table")
    return pos


def config_to_hf(cfg: ViTConfig, class_names: list[str] | None = None) -> dict[str, Any]:
    """A transformers `config.json` (model_type "vit") for `ViTForImageClassification` with `cfg`'s architecture."""
    h, w = cfg.img_hw
    names = list(class_names) if class_names and len(class_names) == cfg.num_classes else \
        [f"LABEL_{i}" for i in range(cfg.num_classes)]
    return {
        "architectures": ["ViTForImageClassification"],
        "model_type": "vit",
        "hidden_size": cfg.embed_dim,
        "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.mlp_dim,
        "hidden_act": "gelu",  # transformers' "gelu" is the exact (erf) GELU, as ours
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.attn_dropout,
        "layer_norm_eps": cfg.layer_norm_eps,
        "image_size": h if h == w else [h, w],
        "patch_size": cfg.patch_size,
        "num_channels": cfg.in_chans,
        "qkv_bias": cfg.qkv_bias,
        "encoder_stride": cfg.patch_size,
        "initializer_range": 0.02,
        "id2label": {str(i): str(n) for i, n in enumerate(names)},
        "label2id": {str(n): i for i, n in enumerate(names)},
    }


def preprocessor_config(p: Preprocess) -> dict[str, Any]:
    """`preprocessor_config.json` for transformers' image processors, doing what `p` describes:

    resize="resize", crop_fraction 1: `ViTImageProcessor` (squash to img_size). resize="resize" with a crop:
    `DeiTImageProcessor` (squash to img_size / crop_fraction, centre crop). resize="center_crop":
    `BitImageProcessor` (shorter side to img_size / crop_fraction, centre crop), as torchvision evaluates.
    """
    (h, w), (rh, rw) = p.hw, p.resize_size
    out: dict[str, Any] = {
        "do_resize": True,
        "resample": _RESAMPLE[p.interpolation],
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(p.mean),
        "image_std": list(p.std),
        "do_convert_rgb": p.channels != "grey",  # a grey_to_rgb model sees the grey image repeated to RGB
    }
    crop = {"do_center_crop": True, "crop_size": {"height": h, "width": w}}
    if p.resize == "center_crop":
        return {"image_processor_type": "BitImageProcessor", **out, "size": {"shortest_edge": min(rh, rw)}, **crop}
    if p.crop_fraction < 1.0:
        return {"image_processor_type": "DeiTImageProcessor", **out, "size": {"height": rh, "width": rw}, **crop}
    return {"image_processor_type": "ViTImageProcessor", **out, "size": {"height": h, "width": w}}
