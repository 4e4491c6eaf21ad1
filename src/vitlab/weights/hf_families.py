"""transformers' other ViT families to our (timm's) names and back: DINOv2 (with and without registers), CLIP,
SigLIP, MAE and DeiT, read from a `save_pretrained` folder by config.json's `model_type`.

Each family gives the ViTConfig fields its config.json fixes (`config_fields`, with where each came from:
`field_sources`) and its tensors in our names (`to_ours`); `from_ours` writes a model back for the class of
transformers that computes it (`model_type_for` picks it from the config). What transformers stores:

    dinov2                 LayerScale (`layer_scale1.lambda1`), SwiGLU (`mlp.weights_in` = [gate; value], silu)
    dinov2_with_registers  + `register_tokens` after the class token; the class row of the position table is
                           added to the class token only, so it is folded into cls_token (no_embed_class), as
                           timm's vit_*_reg4_dinov2 keep it
    clip_vision_model      `pre_layrnorm` (norm_pre), patch convolution without bias, `post_layernorm` on the
                           class token (norm), `visual_projection` (no bias) as the head; "clip": the vision half
    siglip_vision_model    no class token, `post_layernorm` (norm), MAP head (`head.probe`, nn.MultiheadAttention's
                           `in_proj` = [q; k; v] -> attn_pool.q / attn_pool.kv); "siglip": the vision half
    vit_mae                the encoder (ViT names; `vit.` prefix and `decoder.*` of ViTMAEForPreTraining)
    deit                   `distillation_token`, `cls_classifier` / `distillation_classifier` (head, head_dist)

Both spellings of the tensors are read: the files' (`encoder.layer.{i}.attention.attention.query`) and the
module names of recent releases (`layers.{i}.attention.q_proj`, `mlp.gate_proj` / `up_proj` / `down_proj`).
Keys a config.json leaves out take the transformers config class's default, as transformers reads them.
Refused, in one line naming the reason: BEiT (relative position bias), SigLIP 2 NaFlex. DINOv3 ("dinov3_vit", with
RoPE) is read by `vitlab.weights.hf_dinov3`.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

import torch

from ..models.config import FAMILY_DEFAULTS, ViTConfig
from ..models.posembed import sincos_2d
from . import hf_dinov3
from .converted import Converted
from .report import WeightsError, bad_transformers_config

log = logging.getLogger("vitlab.weights")

READ = ("dinov2", "dinov2_with_registers", "clip_vision_model", "clip", "siglip_vision_model", "siglip", "vit_mae",
        "deit", hf_dinov3.MODEL_TYPE)
WRITE = ("dinov2", "dinov2_with_registers", "clip_vision_model", "siglip_vision_model", "vit_mae", "deit")
REFUSED = {
    "beit": ("use_relative_position_bias", "BEiT's attention adds a learned relative position bias "
             "(use_relative_position_bias / use_shared_relative_position_bias, on in the released checkpoints), "
             "which vitlab's ViT does not have"),
    "data2vec-vision": ("use_relative_position_bias", "data2vec-vision is BEiT's architecture: a learned relative "
                        "position bias in every attention map, which vitlab's ViT does not have"),
    "siglip2_vision_model": ("num_patches", "SigLIP 2 NaFlex embeds a variable number of patches per image (up to "
                             "num_patches, at each image's own aspect ratio, position table resized per image, "
                             "attention mask), which a fixed-grid ViT does not compute; the fixed-resolution "
                             "SigLIP 2 checkpoints (model_type 'siglip') load"),
}
REFUSED["siglip2"] = REFUSED["siglip2_vision_model"]

# transformers' hidden_act -> ViTConfig.act (only the exact equivalents)
ACTS = {"gelu": "gelu", "gelu_python": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
        "quick_gelu": "quick_gelu", "silu": "silu", "swish": "silu"}
_ACT_OUT = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "quick_gelu": "quick_gelu", "silu": "silu"}

_COMMON = dict(image_size=224, patch_size=16, num_channels=3, hidden_size=768, num_hidden_layers=12,
               num_attention_heads=12, intermediate_size=3072, hidden_act="gelu", layer_norm_eps=1e-12, qkv_bias=True)
# The config classes' defaults (transformers 4.x-5.x), for keys a config.json leaves out.
DEFAULTS: dict[str, dict[str, Any]] = {
    "dinov2": {**_COMMON, "patch_size": 14, "mlp_ratio": 4, "layer_norm_eps": 1e-6, "layerscale_value": 1.0,
               "use_swiglu_ffn": False},
    "dinov2_with_registers": {**_COMMON, "mlp_ratio": 4, "layer_norm_eps": 1e-6, "layerscale_value": 1.0,
                              "use_swiglu_ffn": False, "num_register_tokens": 4},
    "clip_vision_model": {**_COMMON, "patch_size": 32, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5},
    "siglip_vision_model": {**_COMMON, "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6,
                            "vision_use_head": True},
    "vit_mae": dict(_COMMON),
    "deit": dict(_COMMON),
}
_CLASS = {"dinov2": "Dinov2Config", "dinov2_with_registers": "Dinov2WithRegistersConfig",
          "clip_vision_model": "CLIPVisionConfig", "siglip_vision_model": "SiglipVisionConfig",
          "vit_mae": "ViTMAEConfig", "deit": "DeiTConfig"}
_VISION = {"clip": "clip_vision_model", "siglip": "siglip_vision_model"}  # full models: their vision_config
# How transformers resamples the position table at another input size (vitlab.models.posembed's modes):
# Dinov2WithRegisters antialiases (timm's "bicubic"), the others do not ("hf").
_RESIZE = {"dinov2_with_registers": "bicubic"}


def handles(config: Any) -> bool:
    """True for a transformers config.json this module reads or refuses (others: `vitlab.weights.hf`)."""
    return isinstance(config, dict) and config.get("model_type") in (*READ, *REFUSED)


def matches(keys: set[str]) -> bool:
    """True for tensor names of a transformers vision model (patch embedding under `embeddings.`)."""
    return any("embeddings.patch_embedding" in k for k in keys)


# -- config.json -> ViTConfig fields -------------------------------------------------------------------------------


def _family(config: dict[str, Any], source: str) -> tuple[str, dict[str, Any], str]:
    """(vision model_type, the vision config dict, the key prefix for messages); refusals raise here."""
    kind = config.get("model_type")
    if kind in REFUSED:
        key, why = REFUSED[kind]
        raise WeightsError(f"{source}: model_type {kind!r} ({key}): {why}")
    if kind in _VISION:
        vision = config.get("vision_config") or {}
        if not isinstance(vision, dict):
            raise WeightsError(f"{source}: vision_config must be a JSON object, got {type(vision).__name__}")
        return _VISION[kind], vision, "vision_config."
    if kind not in DEFAULTS:
        raise WeightsError(f"{source}: model_type {kind!r} is not a ViT family vitlab reads ({', '.join(READ)})")
    return str(kind), config, ""


def _read_config(config: dict[str, Any], source: str) -> tuple[dict[str, Any], dict[str, str]]:
    if config.get("model_type") == hf_dinov3.MODEL_TYPE:
        return hf_dinov3.config_fields(config, source), hf_dinov3.field_sources(config, source)
    kind, c, prefix = _family(config, source)
    fields: dict[str, Any] = {}
    sources: dict[str, str] = {}
    fixed = f"transformers config.json (model_type {config.get('model_type')!r})"

    def get(key: str) -> Any:
        return c[key] if key in c else DEFAULTS[kind][key]

    def put(name: str, value: Any, key: str | None = None) -> None:
        fields[name] = value
        if key is None:
            sources[name] = fixed
        elif key in c:
            sources[name] = f"transformers config.json ({prefix}{key})"
        else:
            sources[name] = f"transformers config.json ({prefix}{key} absent: {_CLASS[kind]}'s default)"

    for name, key in (("embed_dim", "hidden_size"), ("depth", "num_hidden_layers"),
                      ("num_heads", "num_attention_heads"), ("in_chans", "num_channels")):
        put(name, _int(get(key), f"{source}: {prefix}{key}"), key)
    put("layer_norm_eps", float(get("layer_norm_eps")), "layer_norm_eps")
    patch = get("patch_size")
    if isinstance(patch, list | tuple):
        if len(set(patch)) != 1:
            raise WeightsError(f"{source}: {prefix}patch_size={patch}: non-square patches are not supported")
        patch = patch[0]
    put("patch_size", _int(patch, f"{source}: {prefix}patch_size"), "patch_size")
    img = get("image_size")
    if isinstance(img, list | tuple):
        img = img[0] if len(img) == 2 and img[0] == img[1] else tuple(_int(v, f"{source}: image_size") for v in img)
    put("img_size", img if isinstance(img, tuple) else _int(img, f"{source}: {prefix}image_size"), "image_size")
    put("pos_embed", "learned")
    put("pos_embed_resize", _RESIZE.get(kind, "hf"))
    if kind in _VISION.values():
        put("qkv_bias", True)  # CLIP's and SigLIP's q, k, v always have biases
    else:
        put("qkv_bias", bool(get("qkv_bias")), "qkv_bias")
    if kind.startswith("dinov2"):
        _dinov2(kind, get, put, source, prefix)
    else:
        put("act", _act(get("hidden_act"), source, prefix), "hidden_act")
        put("mlp_dim", _int(get("intermediate_size"), f"{source}: {prefix}intermediate_size"), "intermediate_size")
    if kind == "siglip_vision_model":
        put("class_token", False)
        put("pool", "map" if get("vision_use_head") else "gap", "vision_use_head")
    else:
        put("class_token", True)
        put("pool", "token")
    if kind == "clip_vision_model":
        put("pre_norm", True)
        put("patch_bias", False)
    if kind == "deit":
        put("distilled", True)
    for name, value in {**FAMILY_DEFAULTS, "representation_size": None}.items():  # what the family does not have
        if name not in fields:
            put(name, value)
    return fields, sources


def _dinov2(kind: str, get: Any, put: Any, source: str, prefix: str) -> None:
    D = _int(get("hidden_size"), f"{source}: hidden_size")
    hidden = int(D * float(get("mlp_ratio")))
    if get("use_swiglu_ffn"):  # Dinov2SwiGLUFFN: two thirds of the MLP size, rounded up to a multiple of 8, silu
        put("mlp", "swiglu", "use_swiglu_ffn")
        put("mlp_dim", 2 * ((int(hidden * 2 / 3) + 7) // 8 * 8), "mlp_ratio")
        put("act", "silu", "use_swiglu_ffn")  # the gate's activation is fixed; hidden_act is not used
    else:
        put("mlp", "mlp", "use_swiglu_ffn")
        put("mlp_dim", hidden, "mlp_ratio")
        put("act", _act(get("hidden_act"), source, prefix), "hidden_act")
    scale = float(get("layerscale_value"))
    put("layer_scale", scale if scale > 0 else 1.0, "layerscale_value")  # the initial value; the tensors hold it
    if kind == "dinov2_with_registers":
        put("reg_tokens", _int(get("num_register_tokens"), f"{source}: num_register_tokens"), "num_register_tokens")
        put("no_embed_class", True)


def config_fields(config: dict[str, Any], source: str) -> dict[str, Any]:
    """The ViTConfig fields a transformers config.json of a family fixes. Raises WeightsError, naming the field,
    for what vitlab cannot compute."""
    return _read_config(config, source)[0]


def field_sources(config: dict[str, Any], source: str) -> dict[str, str]:
    """ViTConfig field -> where `config_fields` took it from ("transformers config.json (hidden_size)")."""
    return _read_config(config, source)[1]


def _act(name: Any, source: str, prefix: str) -> str:
    if name not in ACTS:
        raise WeightsError(f"{source}: {prefix}hidden_act={name!r} is not an activation vitlab's MLP computes "
                           f"(it reads transformers' {', '.join(ACTS)})")
    return ACTS[name]


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise WeightsError(f"{what}={value!r} is not an integer")
    return int(value)


def class_names(config: dict[str, Any]) -> list[str] | None:
    """A DeiT classifier's class names from id2label (None for transformers' LABEL_i placeholders; the other
    families have no classifier: CLIP's projection is an embedding)."""
    id2label = config.get("id2label") if config.get("model_type") == "deit" else None
    if not isinstance(id2label, dict) or not id2label:
        return None
    labels = [str(id2label[k]) for k in sorted(id2label, key=int)]
    return None if all(re.fullmatch(r"LABEL_\d+", lab) for lab in labels) else labels


# -- tensors -> ours -------------------------------------------------------------------------------------------------

# Per block: transformers' sub-name (files' and modules' spellings) -> ours.
_BLOCK = {
    "layernorm_before": "norm1", "layernorm_after": "norm2", "norm1": "norm1", "norm2": "norm2",
    "layer_norm1": "norm1", "layer_norm2": "norm2",
    "attention.output.dense": "attn.proj", "attention.o_proj": "attn.proj", "self_attn.out_proj": "attn.proj",
    "intermediate.dense": "mlp.fc1", "output.dense": "mlp.fc2", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2",
    "mlp.weights_in": "mlp.fc1", "mlp.weights_out": "mlp.fc2", "mlp.down_proj": "mlp.fc2",
    "layer_scale1": "ls1", "layer_scale2": "ls2",
}
_QKV = {"attention.attention.query": 0, "attention.attention.key": 1, "attention.attention.value": 2,
        "attention.q_proj": 0, "attention.k_proj": 1, "attention.v_proj": 2,
        "self_attn.q_proj": 0, "self_attn.k_proj": 1, "self_attn.v_proj": 2}
_GLU = {"mlp.gate_proj": 0, "mlp.up_proj": 1}  # Dinov2SwiGLUFFN's modules: fc1 = [gate; value]
_BLOCK_RE = re.compile(r"(?:encoder\.layers?|layers)\.(\d+)\.(.+)\.(weight|bias|lambda1)")
# transformers' module -> ours, for the modules with a weight and a bias outside the blocks
_TOP_MODULES = {
    "embeddings.patch_embeddings.projection": "patch_embed.proj", "embeddings.patch_embedding": "patch_embed.proj",
    "layernorm": "norm", "post_layernorm": "norm", "pre_layrnorm": "norm_pre", "cls_classifier": "head",
    "distillation_classifier": "head_dist", "head.attention.out_proj": "attn_pool.proj",
    "head.layernorm": "attn_pool.norm", "head.mlp.fc1": "attn_pool.mlp.fc1", "head.mlp.fc2": "attn_pool.mlp.fc2",
}
_TOP = {
    "embeddings.cls_token": "cls_token",
    "embeddings.distillation_token": "dist_token",
    "embeddings.register_tokens": "reg_token",
    "embeddings.position_embeddings": "pos_embed",
    "visual_projection.weight": "head.weight",  # CLIP's: no bias
    "head.probe": "attn_pool.latent",
    **{f"{theirs}.{p}": f"{ours}.{p}" for theirs, ours in _TOP_MODULES.items() for p in ("weight", "bias")},
}
_PREFIXES = ("dinov2_with_registers.", "dinov2.", "deit.", "vit.", "vision_model.")
# Tensors of other parts of a checkpoint: the text tower of CLIP / SigLIP, MAE's decoder, the mask token of masked
# image modelling, DeiTModel's unused pooler. Dropped; each kind is named in the notes.
_OTHER = {"text_model.": "the text tower", "text_projection.": "the text tower", "logit_scale": "the text tower",
          "logit_bias": "the text tower", "decoder.": "MAE's decoder (pre-training only)",
          "embeddings.mask_token": None, "pooler.": "DeiTModel's pooler (Dense + tanh, used by no head)",
          "classifier.": "Dinov2ForImageClassification's classifier (it reads [class token, mean of the patch "
                         "tokens]; vitlab's head reads one vector): loaded as features (num_classes=0)"}


def convert(tensors: dict[str, torch.Tensor], config: dict[str, Any], source: str, config_source: str) -> Converted:
    """A family's checkpoint as `vitlab.weights.checkpoint` takes it: our tensors, the fields its config.json
    (`config_source`) fixes and where each came from, and transformers' position resampling mode. What is dropped
    (a text tower, a decoder) is logged."""
    if config.get("model_type") == hf_dinov3.MODEL_TYPE:
        return hf_dinov3.convert(tensors, config, source, config_source)
    notes: list[str] = []
    with bad_transformers_config(config_source):
        fields, where = _read_config(config, config_source)
    out = Converted(to_ours(tensors, config, source, notes))
    out.fix_all(fields, where)
    out.default_resize = fields["pos_embed_resize"]
    for note in notes:
        log.info("%s: %s", source, note)
    return out


def to_ours(state: dict[str, torch.Tensor], config: dict[str, Any], source: str,
            notes: list[str] | None = None) -> dict[str, torch.Tensor]:
    """Rename the tensors of a transformers family's checkpoint to ours; what is dropped is added to `notes`."""
    if config.get("model_type") == hf_dinov3.MODEL_TYPE:
        return hf_dinov3.to_ours(state, source, notes)
    kind = _family(config, source)[0]
    notes = notes if notes is not None else []
    out: dict[str, torch.Tensor] = {}
    parts: dict[tuple[str, str], dict[int, torch.Tensor]] = {}  # (our name, kind) -> index -> q/k/v or gate/value
    dropped: set[str] = set()
    for key, value in state.items():
        k = next((key.removeprefix(p) for p in _PREFIXES if key.startswith(p)), key)
        if kind == "deit" and k.startswith("classifier."):  # DeiTForImageClassification: the class token only
            out[k.replace("classifier.", "head.")] = 2 * value  # (2 W cls + 0 dist) / 2: exactly its logits
            out[k.replace("classifier.", "head_dist.")] = torch.zeros_like(value)
            dropped.add("DeiTForImageClassification classifies the class token only: head = 2 x its classifier, "
                        "head_dist = 0, so that their mean is its logits")
            continue
        other = next((o for o in _OTHER if k.startswith(o)), None)
        if other is not None:
            if _OTHER[other]:
                dropped.add(f"dropped {_OTHER[other]}")
            continue
        if k in _TOP:
            out[_TOP[k]] = value
        elif k == "embeddings.class_embedding":  # CLIP: (D,)
            out["cls_token"] = value.reshape(1, 1, -1)
        elif k == "embeddings.position_embedding.weight":  # CLIP / SigLIP: an nn.Embedding (rows, D)
            out["pos_embed"] = value[None]
        elif k in ("head.attention.in_proj_weight", "head.attention.in_proj_bias"):  # [q; k; v] of the MAP head
            D = value.shape[0] // 3
            kind_ = k.rsplit("_", 1)[1]
            out[f"attn_pool.q.{kind_}"], out[f"attn_pool.kv.{kind_}"] = value[:D], value[D:]
        elif m := _BLOCK_RE.fullmatch(k):
            i, sub, what = m.groups()
            b = f"blocks.{i}."
            if sub in _QKV:
                parts.setdefault((f"{b}attn.qkv", what), {})[_QKV[sub]] = value
            elif sub in _GLU:
                parts.setdefault((f"{b}mlp.fc1", what), {})[_GLU[sub]] = value
            elif sub in _BLOCK and (what == "lambda1") == sub.startswith("layer_scale"):
                out[f"{b}{_BLOCK[sub]}.{'gamma' if what == 'lambda1' else what}"] = value
            else:
                raise WeightsError(f"{source}: unknown tensor {key!r} for model_type {config.get('model_type')!r}")
        else:
            raise WeightsError(f"{source}: unknown tensor {key!r} for model_type {config.get('model_type')!r}")
    for (name, what), pieces in parts.items():
        n = 3 if name.endswith("qkv") else 2
        if sorted(pieces) != list(range(n)):
            what_parts = "q/k/v" if n == 3 else "gate/up"
            raise WeightsError(f"{source}: {name}.{what} is missing one of its {what_parts} parts")
        out[f"{name}.{what}"] = torch.cat([pieces[j] for j in range(n)], dim=0)
    if "visual_projection.weight" in {k.removeprefix("vision_model.") for k in state}:
        w = out["head.weight"]
        out["head.bias"] = torch.zeros(w.shape[0], dtype=w.dtype)  # CLIP's projection has no bias
    if kind == "dinov2_with_registers" and "pos_embed" in out and "cls_token" in out:
        pos = out["pos_embed"]  # the class row is added to the class token only (registers get none): fold it
        out["cls_token"] = out["cls_token"] + pos[:, :1]
        out["pos_embed"] = pos[:, 1:]
    notes.extend(sorted(dropped))
    if kind == "vit_mae":
        mask = config.get("mask_ratio", 0.75)
        notes.append(f"MAE encoder: vitlab encodes every patch in order (ViTMAEModel with mask_ratio=0 and noise "
                     f"= arange); this config.json has mask_ratio={mask}")
    return out


# -- ours -> transformers ------------------------------------------------------------------------------------------

ARCHITECTURES = {"dinov2": "Dinov2Model", "dinov2_with_registers": "Dinov2WithRegistersModel",
                 "clip_vision_model": ("CLIPVisionModel", "CLIPVisionModelWithProjection"),
                 "siglip_vision_model": "SiglipVisionModel", "vit_mae": "ViTMAEModel",
                 "deit": ("DeiTModel", "DeiTForImageClassificationWithTeacher")}


def architecture(model_type: str, cfg: ViTConfig) -> str:
    """The transformers class `from_ours`'s folder is for."""
    arch = ARCHITECTURES[model_type]
    return arch if isinstance(arch, str) else arch[bool(cfg.num_classes)]


def model_type_for(cfg: ViTConfig, source: str = "model", wanted: str | None = None) -> str:
    """The transformers model_type that computes `cfg`'s network: "vit" for the paper's ViT (`vitlab.weights.hf`
    writes it), a family of WRITE for the others (`wanted` picks vit_mae, or checks a choice).

    Raises:
        WeightsError: no transformers class computes it (one line naming the option).
    """
    opts = cfg.family_options()
    shown = ", ".join(f"{k}={v!r}" for k, v in opts.items())
    if wanted is not None and wanted != "vit" and wanted not in WRITE:
        raise WeightsError(f"{source}: transformers model_type {wanted!r} is not written; one of vit, "
                           f"{', '.join(WRITE)}")
    if wanted == "vit" or (wanted is None and (cfg.hybrid_layers is not None or not opts)):
        if opts:
            raise WeightsError(f"{source}: cannot write a transformers ViTForImageClassification: it computes the "
                               f"paper's ViT, without {shown}")
        return "vit"
    if wanted is not None:
        kind = wanted
    elif cfg.distilled:
        kind = "deit"
    elif cfg.pool == "map":
        kind = "siglip_vision_model"
    elif cfg.pre_norm:
        kind = "clip_vision_model"
    elif cfg.reg_tokens:
        kind = "dinov2_with_registers"
    elif cfg.layer_scale is not None or cfg.mlp == "swiglu":
        kind = "dinov2"
    else:
        raise WeightsError(f"{source}: no transformers model computes a ViT with {shown}; use --to timm or vitlab")
    _check_writable(cfg, kind, source)
    return kind


def _check_writable(cfg: ViTConfig, kind: str, source: str) -> None:
    """One line naming the first option `kind`'s transformers class does not compute."""
    allowed = {  # options the class computes (patch_bias / qkv_bias off: zero biases; no_embed_class: zero rows)
        "dinov2": {"act", "mlp", "layer_scale", "no_embed_class", "patch_bias"},
        "dinov2_with_registers": {"act", "mlp", "layer_scale", "reg_tokens", "no_embed_class", "patch_bias"},
        "clip_vision_model": {"act", "pre_norm", "patch_bias", "no_embed_class"},
        "siglip_vision_model": {"act", "pool", "patch_bias"},
        "vit_mae": {"act", "no_embed_class", "patch_bias"},
        "deit": {"act", "distilled", "no_embed_class", "patch_bias"},
    }[kind]
    bad = {k: v for k, v in cfg.family_options().items() if k not in allowed}
    why = None
    needed = {"clip_vision_model": ("pre_norm", cfg.pre_norm), "deit": ("distilled", cfg.distilled),
              "dinov2_with_registers": ("reg_tokens", cfg.reg_tokens)}.get(kind)
    if cfg.hybrid_layers is not None:
        why = "it is a hybrid (ResNet stem)"
    elif needed is not None and not needed[1]:
        why = f"{needed[0]}={needed[1]!r}: it always has that option"
    elif bad:
        why = ", ".join(f"{k}={v!r}" for k, v in bad.items()) + " (no such option there)"
    elif cfg.representation_size is not None:
        why = f"representation_size={cfg.representation_size} (a pre-logits layer)"
    elif kind == "siglip_vision_model" and (cfg.class_token or cfg.pool != "map"):
        why = "SiglipVisionModel has no class token and pools with its MAP head (pool='map', class_token=False)"
    elif kind != "siglip_vision_model" and (not cfg.class_token or cfg.pool != "token"):
        why = f"pool={cfg.pool!r}, class_token={cfg.class_token}: it reads the class token"
    elif kind == "clip_vision_model" and cfg.patch_bias:
        why = "patch_bias=True: CLIP's patch convolution has no bias"
    elif kind in ("dinov2", "dinov2_with_registers") and cfg.mlp == "swiglu" and cfg.act != "silu":
        why = f"act={cfg.act!r} in its SwiGLU MLP: Dinov2's SwiGLU gates with silu"
    elif cfg.num_classes and kind not in ("clip_vision_model", "deit"):
        why = (f"a head (num_classes={cfg.num_classes}): {architecture(kind, cfg)} has none that reads what vitlab's "
               "does; pass --num-classes 0 (num_classes=0) to write the backbone")
    elif kind == "vit_mae" and cfg.pos_embed == "none":
        why = "pos_embed='none': ViTMAEModel adds its position table"
    if why:
        raise WeightsError(f"{source}: cannot write a transformers {architecture(kind, cfg)}: {why}")


def _position_table(state: dict[str, torch.Tensor], cfg: ViTConfig, notes: list[str]) -> torch.Tensor:
    """(1, prefix rows + N, D) as our model adds it: the fixed sin-cos table written out, zero rows where none."""
    dtype = state["patch_embed.proj.weight"].dtype
    if "pos_embed" in state:
        return state["pos_embed"]
    pos = torch.zeros(1, cfg.num_patches + cfg.pos_prefix_rows, cfg.embed_dim, dtype=dtype)
    if cfg.pos_embed == "sincos2d":
        pos[0, cfg.pos_prefix_rows :] = sincos_2d(*cfg.grid_size, cfg.embed_dim).to(dtype)
        notes.append(f"wrote the fixed sin-cos table as a learned one: equal at {cfg.img_size}")
    else:
        notes.append("the model has no position embeddings: wrote a zero table")
    return pos


def from_ours(state: dict[str, torch.Tensor], cfg: ViTConfig, source: str = "model", model_type: str | None = None,
              notes: list[str] | None = None, class_names: list[str] | None = None) -> tuple[
        dict[str, torch.Tensor], dict[str, Any]]:
    """Our tensors in the file names of transformers' class for `cfg` (`model_type_for`) and its config.json.

    Prefix tokens that get no position row in ours get a zero one there, and position rows of prefix tokens
    that transformers does not add are folded into the tokens, so the function is the same. `notes` receives
    what was made explicit and how the sizes differ.
    """
    kind = model_type_for(cfg, source, model_type)
    if kind == "vit":
        raise WeightsError(f"{source}: the paper's ViT is written by vitlab.weights.hf (model_type 'vit')")
    notes = notes if notes is not None else []
    D, R = cfg.embed_dim, cfg.reg_tokens
    pos = _position_table(state, cfg, notes)
    prefix = [state[n] for n in ("cls_token", "dist_token") if n in state]
    if cfg.no_embed_class:  # ours adds no row to the prefix tokens: zero rows there
        pos = torch.cat([pos.new_zeros(1, len(prefix), D), pos], dim=1)
        regs = state.get("reg_token")
    else:  # ours: [cls][dist][reg x R][patches] rows; transformers adds none to registers: fold theirs in
        regs = state["reg_token"] + pos[:, len(prefix) : len(prefix) + R] if R else None
        pos = torch.cat([pos[:, : len(prefix)], pos[:, len(prefix) + R :]], dim=1)
    patch_b = state.get("patch_embed.proj.bias", torch.zeros(D, dtype=pos.dtype))
    out: dict[str, torch.Tensor] = {}
    blocks = _blocks_out(state, cfg, kind)
    if kind in ("clip_vision_model", "siglip_vision_model"):
        e = "vision_model.embeddings."
        out[f"{e}patch_embedding.weight"] = state["patch_embed.proj.weight"]
        out[f"{e}position_embedding.weight"] = pos[0]
        if kind == "clip_vision_model":
            out[f"{e}class_embedding"] = prefix[0].reshape(D)
            out["vision_model.pre_layrnorm.weight"] = state["norm_pre.weight"]
            out["vision_model.pre_layrnorm.bias"] = state["norm_pre.bias"]
            if cfg.num_classes:
                if state["head.bias"].any():
                    raise WeightsError(f"{source}: cannot write a transformers CLIPVisionModelWithProjection: "
                                       "head.bias is not zero and visual_projection has no bias")
                out["visual_projection.weight"] = state["head.weight"]
        else:
            out[f"{e}patch_embedding.bias"] = patch_b
            out.update(_map_head_out(state, D))
        out["vision_model.post_layernorm.weight"] = state["norm.weight"]
        out["vision_model.post_layernorm.bias"] = state["norm.bias"]
        out.update({f"vision_model.encoder.layers.{k}": v for k, v in blocks.items()})
    else:
        top = "deit." if kind == "deit" and cfg.num_classes else ""
        e = f"{top}embeddings."
        out[f"{e}cls_token"] = prefix[0]
        out[f"{e}patch_embeddings.projection.weight"] = state["patch_embed.proj.weight"]
        out[f"{e}patch_embeddings.projection.bias"] = patch_b
        out[f"{e}position_embeddings"] = pos
        if kind.startswith("dinov2"):
            out[f"{e}mask_token"] = torch.zeros(1, D, dtype=pos.dtype)
        if kind == "dinov2_with_registers":
            assert regs is not None
            out[f"{e}register_tokens"] = regs
        if kind == "deit":
            out[f"{e}distillation_token"] = prefix[1]
            if cfg.num_classes:
                for ours, theirs in (("head", "cls_classifier"), ("head_dist", "distillation_classifier")):
                    out[f"{theirs}.weight"], out[f"{theirs}.bias"] = state[f"{ours}.weight"], state[f"{ours}.bias"]
            else:
                notes.append("DeiTModel's pooler (Dense + tanh) is not in the folder: transformers initialises it "
                             "at random; last_hidden_state is the model's")
        out[f"{top}layernorm.weight"], out[f"{top}layernorm.bias"] = state["norm.weight"], state["norm.bias"]
        out.update({f"{top}encoder.layer.{k}": v for k, v in blocks.items()})
    if kind == "vit_mae":
        notes.append("ViTMAEModel masks and shuffles the patches: the folder says mask_ratio=0.0; pass "
                     "noise=torch.arange(N).expand(B, N) to get the tokens in order")
    want = _RESIZE.get(kind, "hf")
    if cfg.pos_embed_resize != want:
        notes.append(f"at other input sizes transformers resamples the position table as pos_embed_resize={want!r}, "
                     f"this model as {cfg.pos_embed_resize!r}: outputs differ there")
    return {k: v.contiguous() for k, v in out.items()}, _config_out(cfg, kind, class_names, source)


def _blocks_out(state: dict[str, torch.Tensor], cfg: ViTConfig, kind: str) -> dict[str, torch.Tensor]:
    """Per block, "{i}.{their sub-name}.{weight|bias}" in the files' spelling of `kind`."""
    D = cfg.embed_dim
    clip_like = kind in ("clip_vision_model", "siglip_vision_model")
    vit_like = kind in ("vit_mae", "deit")
    names = {"norm1": "layer_norm1" if clip_like else "layernorm_before" if vit_like else "norm1",
             "norm2": "layer_norm2" if clip_like else "layernorm_after" if vit_like else "norm2",
             "attn.proj": "self_attn.out_proj" if clip_like else "attention.output.dense",
             "mlp.fc1": "intermediate.dense" if vit_like else "mlp.weights_in" if cfg.mlp == "swiglu" else "mlp.fc1",
             "mlp.fc2": "output.dense" if vit_like else "mlp.weights_out" if cfg.mlp == "swiglu" else "mlp.fc2"}
    qkv = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj") if clip_like else \
        tuple(f"attention.attention.{n}" for n in ("query", "key", "value"))
    out: dict[str, torch.Tensor] = {}
    for i in range(cfg.depth):
        b = f"blocks.{i}."
        for ours, theirs in names.items():
            for what in ("weight", "bias"):
                out[f"{i}.{theirs}.{what}"] = state[f"{b}{ours}.{what}"]
        for what in ("weight", "bias"):
            fused = state.get(f"{b}attn.qkv.{what}")
            if fused is None:  # qkv_bias=False: zero biases where the class always has them (CLIP, SigLIP)
                if kind in ("dinov2", "dinov2_with_registers", "vit_mae", "deit"):
                    continue
                fused = torch.zeros(3 * D, dtype=state[f"{b}attn.qkv.weight"].dtype)
            for name, part in zip(qkv, fused.split(D)):
                out[f"{i}.{name}.{what}"] = part.clone()
        if kind.startswith("dinov2"):
            ones = torch.ones(D, dtype=state[f"{b}norm1.weight"].dtype)  # no LayerScale: a scale of ones
            for j in (1, 2):
                g = state.get(f"{b}ls{j}.gamma")
                out[f"{i}.layer_scale{j}.lambda1"] = g if g is not None else ones.clone()
    return out


def _map_head_out(state: dict[str, torch.Tensor], D: int) -> dict[str, torch.Tensor]:
    h, a = "vision_model.head.", "attn_pool."
    out = {f"{h}probe": state[f"{a}latent"],
           f"{h}attention.in_proj_weight": torch.cat([state[f"{a}q.weight"], state[f"{a}kv.weight"]]),
           f"{h}attention.in_proj_bias": torch.cat([state[f"{a}q.bias"], state[f"{a}kv.bias"]])}
    for ours, theirs in (("proj", "attention.out_proj"), ("norm", "layernorm"), ("mlp.fc1", "mlp.fc1"),
                         ("mlp.fc2", "mlp.fc2")):
        for what in ("weight", "bias"):
            out[f"{h}{theirs}.{what}"] = state[f"{a}{ours}.{what}"]
    return out


def _config_out(cfg: ViTConfig, kind: str, class_names: list[str] | None, source: str) -> dict[str, Any]:
    """config.json for transformers' `kind` with `cfg`'s architecture."""
    h, w = cfg.img_hw
    if h != w and kind != "deit":
        raise WeightsError(f"{source}: cannot write a transformers {architecture(kind, cfg)}: img_size={cfg.img_size} "
                           "is not square and it takes one image_size")
    D = cfg.embed_dim
    out: dict[str, Any] = {
        "architectures": [architecture(kind, cfg)], "model_type": kind, "hidden_size": D,
        "num_hidden_layers": cfg.depth, "num_attention_heads": cfg.num_heads, "num_channels": cfg.in_chans,
        "image_size": h if h == w else [h, w], "patch_size": cfg.patch_size, "layer_norm_eps": cfg.layer_norm_eps,
        "hidden_act": _ACT_OUT[cfg.act], "initializer_range": 0.02,
    }
    if kind.startswith("dinov2"):
        hidden = cfg.mlp_dim // 2 if cfg.mlp == "swiglu" else cfg.mlp_dim
        out.update(mlp_ratio=_mlp_ratio(D, hidden, cfg.mlp == "swiglu", source), qkv_bias=cfg.qkv_bias,
                   layerscale_value=cfg.layer_scale or 1.0, use_swiglu_ffn=cfg.mlp == "swiglu", drop_path_rate=0.0,
                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        if kind == "dinov2":
            out["use_mask_token"] = True
        else:
            out["num_register_tokens"] = cfg.reg_tokens
    else:
        out["intermediate_size"] = cfg.mlp_dim
    if kind == "clip_vision_model" and cfg.num_classes:
        out["projection_dim"] = cfg.num_classes
    if kind == "siglip_vision_model":
        out["vision_use_head"] = True
    if kind in ("vit_mae", "deit"):
        out.update(qkv_bias=cfg.qkv_bias, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    if kind == "vit_mae":
        out["mask_ratio"] = 0.0
    if kind == "deit" and cfg.num_classes:
        names = list(class_names) if class_names and len(class_names) == cfg.num_classes else \
            [f"LABEL_{i}" for i in range(cfg.num_classes)]
        out["id2label"] = {str(i): n for i, n in enumerate(names)}
        out["label2id"] = {n: i for i, n in enumerate(names)}
    return out


def _mlp_ratio(D: int, hidden: int, swiglu: bool, source: str) -> int:
    """The whole mlp_ratio (transformers 5 types it an int) from which Dinov2 builds `hidden` units (SwiGLU:
    int(int(D * r) * 2 / 3) rounded up to a multiple of 8)."""
    for ratio in range(1, 4 * max(1, math.ceil(hidden / D)) + 2):
        n = D * ratio
        if (((int(n * 2 / 3) + 7) // 8 * 8) if swiglu else n) == hidden:
            return ratio
    kind = "SwiGLU hidden width" if swiglu else "MLP width"
    raise WeightsError(f"{source}: cannot write a transformers Dinov2 model: no whole mlp_ratio (its config's type) "
                       f"gives the {kind} {hidden} at hidden_size {D}")
