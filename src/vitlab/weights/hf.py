"""Hugging Face `transformers` ViT (`ViTModel`, `ViTForImageClassification`) checkpoints to our names.

Two spellings exist: the files on the Hub and what `save_pretrained` writes use the original names
(`vit.encoder.layer.{i}.attention.attention.query`, `...intermediate.dense`, `...output.dense`); recent
transformers releases name the modules in memory `vit.layers.{i}.attention.q_proj`, `...mlp.fc1`. Both are read.
q, k and v are separate (D, D) projections; ours (timm's) are one (3D, D) `qkv`, concatenated in that order.
`ViTModel`'s pooler (Dense + tanh on the class token) is the paper's pre-logits layer.
"""

from __future__ import annotations

import re
from typing import Any

import torch

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
_CONFIG = {
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
        out[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat(parts, dim=0)  # (3D, D) / (3D,): q, k, v
    return out
