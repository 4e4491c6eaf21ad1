"""transformers' DINOv3 ViT (model_type "dinov3_vit": `DINOv3ViTModel`, `DINOv3ViTBackbone`; Simeoni et al. 2025)
to our (timm's) names, read from a `save_pretrained` folder (dispatched from `vitlab.weights.hf_families`).

DINOv3 is a pre-norm ViT with a class token, `num_register_tokens` registers after it, LayerScale on both branches,
no position table and 2-D RoPE on the patch tokens (ViTConfig rope="dinov3", rope_theta = config.rope_theta;
`vitlab.models.rope`). What transformers stores -> ours:

    embeddings.cls_token, register_tokens             cls_token, reg_token; mask_token (pre-training only): dropped
    embeddings.patch_embeddings                       patch_embed.proj
    layer.{i}.attention.{q,k,v}_proj                  blocks.{i}.attn.qkv = [q; k; v]; a bias switched off in the
                                                      config (key_bias=False in the released models) is a zero part
    layer.{i}.attention.o_proj                        blocks.{i}.attn.proj
    layer.{i}.layer_scale{1,2}.lambda1                blocks.{i}.ls{1,2}.gamma
    layer.{i}.mlp.up_proj / down_proj                 mlp.fc1 / fc2; gated (use_gated_mlp): fc1 = [gate_proj; up_proj]
    layer.{i}.norm1 / norm2, norm                     the same
A bias the config switches off (proj_bias, mlp_bias) is stored as zeros: the same function. The pooled output is the
normalised class token (pool="token", no head). Keys a config.json leaves out take DINOv3ViTConfig's defaults. The
coordinate augmentation transformers applies in training mode (pos_embed_shift / jitter / rescale) changes nothing in
eval mode and is not reproduced.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from .converted import Converted
from .report import WeightsError, bad_transformers_config

MODEL_TYPE = "dinov3_vit"
# DINOv3ViTConfig's defaults (transformers 5.x) for the keys that change the numbers.
DEFAULTS: dict[str, Any] = dict(
    patch_size=16, hidden_size=384, intermediate_size=1536, num_hidden_layers=12, num_attention_heads=6,
    hidden_act="gelu", layer_norm_eps=1e-5, rope_theta=100.0, image_size=224, num_channels=3, query_bias=True,
    key_bias=False, value_bias=True, layerscale_value=1.0, use_gated_mlp=False, num_register_tokens=0)
_ACTS = {"gelu": "gelu", "gelu_python": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
         "quick_gelu": "quick_gelu", "silu": "silu", "swish": "silu"}  # transformers' hidden_act -> ViTConfig.act
_LAYER = re.compile(r"(?:model\.)?layer\.(\d+)\.(.+)")
_TOP = {"embeddings.cls_token": "cls_token", "embeddings.register_tokens": "reg_token",
        "embeddings.patch_embeddings.weight": "patch_embed.proj.weight",
        "embeddings.patch_embeddings.bias": "patch_embed.proj.bias", "norm.weight": "norm.weight",
        "norm.bias": "norm.bias"}
_DROPPED = ("embeddings.mask_token", "rope_embeddings.")  # pre-training's mask token; RoPE's recomputed frequencies
_SAME = {"norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"}


def _read(config: dict[str, Any], source: str) -> tuple[dict[str, Any], dict[str, str]]:
    fields: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def get(key: str) -> Any:
        return config[key] if key in config else DEFAULTS[key]

    def put(name: str, value: Any, key: str | None = None) -> None:
        fields[name] = value
        if key is None:
            sources[name] = f"transformers config.json (model_type {MODEL_TYPE!r})"
        elif key in config:
            sources[name] = f"transformers config.json ({key})"
        else:
            sources[name] = f"transformers config.json ({key} absent: DINOv3ViTConfig's default)"

    for name, key in (("embed_dim", "hidden_size"), ("depth", "num_hidden_layers"),
                      ("num_heads", "num_attention_heads"), ("in_chans", "num_channels"),
                      ("reg_tokens", "num_register_tokens")):
        put(name, _int(get(key), f"{source}: {key}"), key)
    patch = get("patch_size")
    if isinstance(patch, list | tuple):
        if len(patch) != 2 or patch[0] != patch[1]:
            raise WeightsError(f"{source}: patch_size={patch}: non-square patches are not supported")
        patch = patch[0]
    put("patch_size", _int(patch, f"{source}: patch_size"), "patch_size")
    img = get("image_size")
    if isinstance(img, list | tuple):
        img = _int(img[0], f"{source}: image_size") if len(img) == 2 and img[0] == img[1] else tuple(
            _int(v, f"{source}: image_size") for v in img)
    put("img_size", img if isinstance(img, tuple) else _int(img, f"{source}: image_size"), "image_size")
    put("layer_norm_eps", float(get("layer_norm_eps")), "layer_norm_eps")
    act = get("hidden_act")
    if act not in _ACTS:
        raise WeightsError(f"{source}: hidden_act={act!r} is not an activation vitlab's MLP computes (it reads "
                           f"transformers' {', '.join(_ACTS)})")
    put("act", _ACTS[act], "hidden_act")
    hidden = _int(get("intermediate_size"), f"{source}: intermediate_size")
    gated = bool(get("use_gated_mlp"))
    put("mlp", "swiglu" if gated else "mlp", "use_gated_mlp")
    put("mlp_dim", 2 * hidden if gated else hidden, "intermediate_size")  # ours counts the gate's rows too
    scale = float(get("layerscale_value"))
    put("layer_scale", scale if scale > 0 else 1.0, "layerscale_value")  # the initial value; the tensors hold it
    put("qkv_bias", any(bool(get(k)) for k in ("query_bias", "key_bias", "value_bias")), "query_bias")
    put("rope", "dinov3")
    put("rope_theta", float(get("rope_theta")), "rope_theta")
    for name, value in dict(pos_embed="none", class_token=True, pool="token", rope_ref_grid=None, mlp_norm=False,
                            no_embed_class=False, distilled=False, fc_norm=False, pre_norm=False, patch_bias=True,
                            representation_size=None, num_classes=0).items():
        put(name, value)
    return fields, sources


def config_fields(config: dict[str, Any], source: str) -> dict[str, Any]:
    """The ViTConfig fields a DINOv3 config.json fixes (WeightsError, naming the key, for what vitlab cannot
    compute)."""
    return _read(config, source)[0]


def field_sources(config: dict[str, Any], source: str) -> dict[str, str]:
    """ViTConfig field -> where `config_fields` took it from ("transformers config.json (rope_theta)")."""
    return _read(config, source)[1]


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise WeightsError(f"{what}={value!r} is not an integer")
    return int(value)


def to_ours(state: dict[str, torch.Tensor], source: str, notes: list[str] | None = None) -> dict[str, torch.Tensor]:
    """Rename a DINOv3 checkpoint's tensors to ours; biases switched off become zeros; what is dropped goes to
    `notes`."""
    notes = notes if notes is not None else []
    out: dict[str, torch.Tensor] = {}
    layers: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        if m := _LAYER.fullmatch(key):
            layers.setdefault(int(m.group(1)), {})[m.group(2)] = value
        elif key in _TOP:
            if _TOP[key] != "reg_token" or value.shape[1]:  # transformers keeps a (1, 0, D) tensor without registers
                out[_TOP[key]] = value
        elif key.startswith(_DROPPED):
            notes.append(f"dropped {key} (pre-training only / recomputed)")
        else:
            raise WeightsError(f"{source}: tensor {key!r} is not part of a DINOv3 ViT vitlab reads")
    for i, parts in sorted(layers.items()):
        out.update(_layer(i, parts, source))
    return out


def _layer(i: int, b: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    p, a = f"blocks.{i}.", "attention."
    try:
        out = {p + "attn.qkv.weight": torch.cat([b.pop(f"{a}{n}_proj.weight") for n in "qkv"]),
               p + "attn.proj.weight": b.pop(f"{a}o_proj.weight"), p + "ls1.gamma": b.pop("layer_scale1.lambda1"),
               p + "ls2.gamma": b.pop("layer_scale2.lambda1"), p + "mlp.fc2.weight": b.pop("mlp.down_proj.weight")}
        up = b.pop("mlp.up_proj.weight")
    except KeyError as e:
        raise WeightsError(f"{source}: layer {i} has no {e.args[0]}") from e
    gate = b.pop("mlp.gate_proj.weight", None)
    out[p + "mlp.fc1.weight"] = up if gate is None else torch.cat([gate, up])  # ours: [gate; value]
    biases = [b.pop(f"{a}{n}_proj.bias", None) for n in "qkv"]
    given = [t for t in biases if t is not None]
    if given:
        out[p + "attn.qkv.bias"] = torch.cat([t if t is not None else torch.zeros_like(given[0]) for t in biases])
    weight = out[p + "attn.proj.weight"]
    zeros = weight.new_zeros  # proj_bias / mlp_bias off: a zero bias computes the same
    proj_b, down_b = b.pop(f"{a}o_proj.bias", None), b.pop("mlp.down_proj.bias", None)
    up_b, gate_b = b.pop("mlp.up_proj.bias", None), b.pop("mlp.gate_proj.bias", None)
    out[p + "attn.proj.bias"] = proj_b if proj_b is not None else zeros(weight.shape[0])
    out[p + "mlp.fc2.bias"] = down_b if down_b is not None else zeros(weight.shape[0])
    fc1 = [t if t is not None else zeros(up.shape[0]) for t in ([up_b] if gate is None else [gate_b, up_b])]
    out[p + "mlp.fc1.bias"] = torch.cat(fc1)
    for name in list(b):
        if name in _SAME:
            out[p + name] = b.pop(name)
    if b:
        raise WeightsError(f"{source}: tensor {'layer.' + str(i) + '.' + sorted(b)[0]!r} is not part of a DINOv3 ViT "
                           "vitlab reads")
    return out


def convert(tensors: dict[str, torch.Tensor], config: dict[str, Any], source: str, config_source: str) -> Converted:
    """A DINOv3 checkpoint as `vitlab.weights.checkpoint` takes it: our tensors and the fields its config.json
    (`config_source`) fixes, with where each came from."""
    with bad_transformers_config(config_source):
        fields, where = _read(config, config_source)
    out = Converted(to_ours(tensors, source))
    out.fix_all(fields, where)
    return out
