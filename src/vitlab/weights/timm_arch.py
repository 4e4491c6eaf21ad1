"""The ViTConfig fields a timm architecture name fixes, with where each one came from; never guessed.

A timm Hub folder's config.json names its architecture ("vit_so400m_patch14_siglip_gap_224") and, when the model
was created with keyword arguments, carries them as "model_args". timm builds the model from the function
registered under that name: its constructor arguments (`ARCHS`, from the data file timm_arch_table.json beside this
module, generated from timm's source by tools/gen_timm_arch_table.py), then the config's model_args over them, then
what the pretrained config supplies (class count, input size), then VisionTransformer's own defaults. `fields_for`
follows the same order and turns the result into ViTConfig fields (`FIELDS`), each with a label saying which of
those fixed it.

Arguments that switch on something vitlab's ViT does not have (QK normalisation, RMSNorm, parallel blocks, 'prr'
pooling, ...) raise WeightsError naming it. Architectures of timm's Eva class (eva.py: EVA-02, DINOv3, with RoPE)
are read by `vitlab.weights.eva.arch_fields`. An architecture the table does not know gives only what its name
and model_args state; the tensor shapes settle the rest (`vitlab.weights.infer`). timm is not imported here.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

from .eva import arch_fields as _eva_fields
from .report import WeightsError


def _table() -> tuple[str, dict[str, dict[str, Any]]]:
    """(timm's version, architecture -> {"module", "class", "tag", "default_img_size", "default_num_classes",
    "args": constructor arguments}) from the shipped timm_arch_table.json."""
    text = resources.files(__package__).joinpath("timm_arch_table.json").read_text(encoding="utf-8")
    data = json.loads(text)
    return data["timm_version"], data["archs"]


TIMM_VERSION, ARCHS = _table()

FIELDS = ("embed_dim", "depth", "num_heads", "mlp_dim", "patch_size", "img_size", "class_token", "pool", "act",
          "mlp", "mlp_norm", "layer_scale", "reg_tokens", "no_embed_class", "distilled", "fc_norm", "pre_norm",
          "patch_bias", "qkv_bias", "layer_norm_eps", "pos_embed", "num_classes")

# timm VisionTransformer's constructor defaults (timm 1.0.31) for the arguments that change the numbers.
_DEFAULTS: dict[str, Any] = dict(
    img_size=224, patch_size=16, num_classes=1000, global_pool="token", embed_dim=768, depth=12, num_heads=12,
    mlp_ratio=4.0, qkv_bias=True, qk_norm=False, scale_attn_norm=False, scale_mlp_norm=False, proj_bias=True,
    init_values=None, class_token=True, pos_embed="learn", no_embed_class=False, reg_tokens=0, pre_norm=False,
    final_norm=True, fc_norm=None, pool_include_prefix=False, embed_layer=None, embed_norm_layer=None,
    norm_layer=None, act_layer=None, block_fn=None, mlp_layer=None, attn_layer=None, use_naflex=None)
# Arguments that leave a trained model's outputs at its own input size unchanged (dropout, initialisation,
# on-the-fly position-embedding resampling, input channels: the patch projection's shape fixes those).
_INERT = {"drop_rate", "pos_drop_rate", "patch_drop_rate", "proj_drop_rate", "attn_drop_rate", "drop_path_rate",
          "weight_init", "fix_init", "dynamic_img_size", "dynamic_img_pad", "in_chans", "device", "dtype"}
_ACTS = {None: "gelu", "gelu": "gelu", "gelu_tanh": "gelu_tanh", "quick_gelu": "quick_gelu", "silu": "silu",
         "swish": "silu"}
_POOLS = {"token": "token", "avg": "gap", "map": "map"}
_POOL_REFUSED = {"": "no pooling (global_pool='': the head reads every token)", "avgmax": "avg+max pooling",
                 "max": "max pooling", "prr": "'prr' attention pooling"}
_TIMM_LN_EPS = 1e-6  # timm.layers.LayerNorm, what timm's ViT and the string "layernorm" give

# argument -> the types a value may have (bool is checked apart: True is an int to Python)
_TYPES: dict[str, tuple[type, ...]] = {
    **dict.fromkeys(("class_token", "qkv_bias", "no_embed_class", "pre_norm", "scale_mlp_norm", "qk_norm",
                     "scale_attn_norm", "proj_bias", "final_norm", "pool_include_prefix"), (bool,)),
    "fc_norm": (bool, type(None)),
    **dict.fromkeys(("embed_dim", "depth", "num_heads", "reg_tokens", "num_classes"), (int,)),
    "patch_size": (int, list, tuple), "img_size": (int, list, tuple), "mlp_ratio": (int, float),
    "init_values": (int, float, type(None)), "global_pool": (str,), "pos_embed": (str,),
    "act_layer": (str, type(None)),
}
# where a timm argument came from, best first
_ORIGINS = ("model_args", "global_pool", "arch", "pretrained_cfg", "default")


def architectures() -> list[str]:
    """Every architecture name the table knows (refused ones included)."""
    return list(ARCHS)


def fields_for(architecture: str, model_args: dict[str, Any] | None, source: str, *,
               pretrained_cfg: dict[str, Any] | None = None, num_classes: Any = None,
               global_pool: Any = None) -> dict[str, tuple[Any, str]]:
    """ViTConfig field -> (value, where it came from) for a timm architecture.

    Args:
        architecture: timm's registered name ("vit_base_patch16_224"); a ".tag" suffix is ignored.
        model_args: config.json's "model_args" (keyword arguments the model was created with), or None.
        source: Names the file in messages.
        pretrained_cfg: config.json's "pretrained_cfg" (its num_classes, global_pool and, when fixed_input_size,
            input_size stand in for the arguments the architecture does not set, as in timm); default: the
            architecture's default pretrained config, recorded in the table.
        num_classes: config.json's top-level "num_classes" (timm's loader puts it over pretrained_cfg's).
        global_pool: config.json's top-level "global_pool": the pooling the exported model had (below model_args).

    Raises:
        WeightsError: the architecture, or an argument, needs a feature vitlab's ViT does not have (the message
            names it), or model_args holds a value of the wrong type.
    """
    arch = architecture.split(".", 1)[0]
    row = ARCHS.get(arch)
    args = dict(model_args or {})
    if row is not None and "refuse" in row:
        raise WeightsError(f"{source}: timm architecture {arch!r} needs what vitlab's ViT does not have: "
                           + "; ".join(row["refuse"]))
    kw: dict[str, tuple[Any, str]] = {k: (v, "model_args") for k, v in args.items()}
    if global_pool is not None and "global_pool" not in kw:
        kw["global_pool"] = (global_pool, "global_pool")
    if row is not None:
        for k, v in row["args"].items():
            kw.setdefault(k, (v, "arch"))
    cfg_label = "pretrained_cfg"
    if pretrained_cfg is None and row is not None:
        pretrained_cfg = {"num_classes": row["default_num_classes"], "fixed_input_size": True,
                          "input_size": [3, *_hw(row["default_img_size"])]} if row["default_img_size"] else {
            "num_classes": row["default_num_classes"]}
        cfg_label = "default_cfg"
    pc = dict(pretrained_cfg or {})
    if isinstance(num_classes, int) and not isinstance(num_classes, bool):
        pc["num_classes"] = num_classes
    _cfg_defaults(kw, pc)
    labels = _Labels(arch, row, cfg_label, num_classes is not None)
    if row is None:
        return _unknown(arch, kw, labels, source)
    if row["class"] == "Eva":  # timm's eva.py (EVA-02, DINOv3: RoPE): vitlab.weights.eva
        return _eva_fields(arch, kw, labels, source)
    for k, v in _DEFAULTS.items():
        kw.setdefault(k, (v, "default"))
    return _fields(arch, kw, labels, source, distilled=row["class"] == "VisionTransformerDistilled",
                   cls=row["class"])


class _Labels:
    """The words for where a field came from."""

    def __init__(self, arch: str, row: dict[str, Any] | None, cfg_label: str, top_num_classes: bool) -> None:
        tag = f".{row['tag']}" if row and row.get("tag") else ""
        self.text = {
            "model_args": "config.json model_args",
            "global_pool": "config.json global_pool (the exported model's pooling)",
            "arch": f"timm architecture {arch} (timm {TIMM_VERSION} model_args)",
            "pretrained_cfg": "config.json pretrained_cfg",
            "default_cfg": f"timm's default pretrained_cfg of {arch}{tag}",
            "default": f"timm architecture {arch} (VisionTransformer default)",
        }
        self.cfg_label = cfg_label
        self.top_num_classes = top_num_classes

    def __call__(self, kw: dict[str, tuple[Any, str]], *keys: str) -> str:
        origins = [kw[k][1] for k in keys if k in kw]
        best = min(origins, key=_ORIGINS.index) if origins else "default"
        if best == "pretrained_cfg":
            if keys[0] == "num_classes" and self.top_num_classes:
                return "config.json num_classes"
            return self.text[self.cfg_label] + (".input_size" if keys[0] == "img_size" else f".{keys[0]}")
        return self.text[best]


def _hw(size: Any) -> list[int]:
    return [size, size] if isinstance(size, int) else list(size)


def _cfg_defaults(kw: dict[str, tuple[Any, str]], pc: dict[str, Any]) -> None:
    """What timm's builder takes from the pretrained config for arguments not set yet (_update_default_model_kwargs:
    num_classes unless negative, global_pool, and img_size unless the input size is not fixed)."""
    n = pc.get("num_classes")
    if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
        kw.setdefault("num_classes", (n, "pretrained_cfg"))
    if pc.get("global_pool") is not None:
        kw.setdefault("global_pool", (pc["global_pool"], "pretrained_cfg"))
    size = pc.get("input_size")  # a config.json without fixed_input_size (older timm): its input size all the same
    if pc.get("fixed_input_size") is not False and isinstance(size, list | tuple) and len(size) == 3:
        kw.setdefault("img_size", (list(size[1:]), "pretrained_cfg"))


def _refuse(source: str, arch: str, kw: dict[str, tuple[Any, str]], key: str, feature: str) -> WeightsError:
    where = "config.json model_args" if kw[key][1] == "model_args" else f"timm architecture {arch!r}"
    return WeightsError(f"{source}: {where} uses {feature} ({key}={kw[key][0]!r}), which vitlab's ViT does not have")


def _layer(value: Any) -> tuple[str | None, dict[str, Any]]:
    """A layer argument as (class name, facts): the table's {"layer": ..., "eps": ...} or a string timm accepts."""
    if value is None:
        return None, {}
    if isinstance(value, dict) and isinstance(value.get("layer"), str):
        return value["layer"], value
    if isinstance(value, str):
        return value, {}
    return repr(value), {}


def _check_types(arch: str, kw: dict[str, tuple[Any, str]], source: str) -> None:
    """Raise for a value of the wrong type ("false" for a bool would read as True)."""
    for key, (value, origin) in kw.items():
        types = _TYPES.get(key)
        if types is None:
            continue
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            where = "config.json model_args" if origin == "model_args" else f"timm architecture {arch!r}"
            names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise WeightsError(f"{source}: {where}: {key} must be {names}, got {value!r}")


def _check_unsupported(arch: str, kw: dict[str, tuple[Any, str]], source: str) -> None:
    """Raise for any argument that switches on what vitlab's ViT does not have."""
    _check_types(arch, kw, source)

    def val(k: str) -> Any:
        return kw[k][0] if k in kw else _DEFAULTS.get(k)

    for key, ok, feature in (("block_fn", ("Block",), "a different transformer block"),
                             ("attn_layer", ("", "attn", "Attention"), "a different attention layer"),
                             ("embed_layer", ("PatchEmbed",), "a different patch embedding"),
                             ("embed_norm_layer", (), "a normalisation inside the patch embedding")):
        name, _ = _layer(val(key))
        if name is not None and name not in ok:
            raise _refuse(source, arch, kw, key, f"{feature} ({name})")
    norm, _ = _layer(val("norm_layer"))
    if norm is not None and norm.lower() not in ("layernorm",):
        raise _refuse(source, arch, kw, "norm_layer", f"{norm} normalisation instead of LayerNorm")
    flags = {"qk_norm": "QK normalisation", "scale_attn_norm": "a LayerNorm inside attention",
             "use_naflex": "NaFlexViT (variable-resolution patches)"}
    for key, feature in flags.items():
        if val(key):
            raise _refuse(source, arch, kw, key, feature)
    if val("proj_bias") is False:
        raise _refuse(source, arch, kw, "proj_bias", "attention and MLP projections without biases")
    if val("final_norm") is False:
        raise _refuse(source, arch, kw, "final_norm", "no LayerNorm after the blocks")
    if val("pool_include_prefix") and val("global_pool") != "token":
        raise _refuse(source, arch, kw, "pool_include_prefix", "pooling over the prefix tokens too")
    pool = val("global_pool")
    if pool in _POOL_REFUSED:
        raise _refuse(source, arch, kw, "global_pool", _POOL_REFUSED[pool])
    if val("act_layer") not in _ACTS:
        raise _refuse(source, arch, kw, "act_layer", "an activation other than GELU, tanh-GELU, QuickGELU, SiLU")
    mlp, facts = _layer(val("mlp_layer"))
    if mlp not in (None, "Mlp") and not (mlp == "GluMlp" and facts.get("gate_last") is False):
        raise _refuse(source, arch, kw, "mlp_layer", f"the MLP {mlp}")
    if val("pos_embed") not in ("learn", "", "none"):
        raise _refuse(source, arch, kw, "pos_embed", "another position embedding")


def _fields(arch: str, kw: dict[str, tuple[Any, str]], label: _Labels, source: str, distilled: bool,
            cls: str = "VisionTransformer") -> dict[str, tuple[Any, str]]:
    """Every field of FIELDS from a full set of timm arguments (defaults filled in)."""
    for k in kw:
        if k not in _DEFAULTS and k not in _INERT:
            raise _refuse(source, arch, kw, k, "a timm argument vitlab does not know")
    _check_unsupported(arch, kw, source)

    def v(k: str) -> Any:
        return kw[k][0]

    try:
        embed_dim, ratio = int(v("embed_dim")), float(v("mlp_ratio"))
        pool = v("global_pool")
        eps = _layer(v("norm_layer"))[1].get("eps", _TIMM_LN_EPS)
        size = v("img_size")
        img = size if isinstance(size, int) else (tuple(size) if size[0] != size[1] else size[0])
        out: dict[str, tuple[Any, str]] = {
            "embed_dim": (embed_dim, label(kw, "embed_dim")),
            "depth": (int(v("depth")), label(kw, "depth")),
            "num_heads": (int(v("num_heads")), label(kw, "num_heads")),
            "mlp_dim": (int(embed_dim * ratio), label(kw, "mlp_ratio", "embed_dim")),
            "patch_size": (_side(v("patch_size")), label(kw, "patch_size")),
            "img_size": (img, label(kw, "img_size")),
            "class_token": (bool(v("class_token")), label(kw, "class_token")),
            "pool": (_POOLS[pool], label(kw, "global_pool")),
            "act": (_ACTS[v("act_layer")], label(kw, "act_layer")),
            "mlp": ("swiglu" if _layer(v("mlp_layer"))[0] == "GluMlp" else "mlp", label(kw, "mlp_layer")),
            "mlp_norm": (bool(v("scale_mlp_norm")), label(kw, "scale_mlp_norm")),
            "layer_scale": (float(v("init_values")) if v("init_values") else None, label(kw, "init_values")),
            "reg_tokens": (int(v("reg_tokens")), label(kw, "reg_tokens")),
            "no_embed_class": (bool(v("no_embed_class")), label(kw, "no_embed_class")),
            "distilled": (distilled, f"timm architecture {arch} (class {cls})"),
            "fc_norm": (pool in ("avg", "avgmax", "max") if v("fc_norm") is None else bool(v("fc_norm")),
                        label(kw, "fc_norm", "global_pool")),
            "pre_norm": (bool(v("pre_norm")), label(kw, "pre_norm")),
            "patch_bias": (not v("pre_norm"), label(kw, "pre_norm")),
            "qkv_bias": (bool(v("qkv_bias")), label(kw, "qkv_bias")),
            "layer_norm_eps": (float(eps), label(kw, "norm_layer")),
            "pos_embed": ("learned" if v("pos_embed") == "learn" else "none", label(kw, "pos_embed")),
            "num_classes": (int(v("num_classes")), label(kw, "num_classes")),
        }
    except (TypeError, ValueError, KeyError, IndexError) as e:
        raise WeightsError(f"{source}: timm architecture {arch!r}: bad argument value: {type(e).__name__}: {e}") from e
    if distilled and out["pool"][0] != "token":
        raise WeightsError(f"{source}: timm's distilled DeiT reads the class and distillation tokens; "
                           f"global_pool={pool!r} does not fit it")
    return out


def _side(patch: Any) -> int:
    if isinstance(patch, int):
        return patch
    if isinstance(patch, list | tuple) and len(patch) == 2 and patch[0] == patch[1]:
        return int(patch[0])
    raise ValueError(f"patch_size {patch!r} is not square")


# the timm arguments an unknown architecture's file must give -> the ViTConfig fields they fix
_STATED_BY: tuple[tuple[frozenset[str], tuple[str, ...]], ...] = (
    *((frozenset({arg}), (fld,)) for arg, fld in (
        ("embed_dim", "embed_dim"), ("depth", "depth"), ("num_heads", "num_heads"), ("patch_size", "patch_size"),
        ("class_token", "class_token"), ("reg_tokens", "reg_tokens"), ("no_embed_class", "no_embed_class"),
        ("qkv_bias", "qkv_bias"), ("num_classes", "num_classes"), ("init_values", "layer_scale"),
        ("scale_mlp_norm", "mlp_norm"), ("act_layer", "act"), ("img_size", "img_size"), ("global_pool", "pool"),
        ("norm_layer", "layer_norm_eps"), ("mlp_layer", "mlp"))),
    (frozenset({"pre_norm"}), ("pre_norm", "patch_bias")),
    (frozenset({"global_pool", "fc_norm"}), ("fc_norm",)),
    (frozenset({"embed_dim", "mlp_ratio"}), ("mlp_dim",)),
)


def _unknown(arch: str, kw: dict[str, tuple[Any, str]], label: _Labels, source: str) -> dict[str, tuple[Any, str]]:
    """An architecture the table does not know: what its name and the given arguments state, nothing assumed.

    Fields follow only from arguments that are present (model_args, config.json's global_pool and pretrained_cfg);
    the name gives the patch and input size of a plain "..._patch16_224" name (not a hybrid's, which names the
    ResNet). The tensor shapes settle the rest, and vitlab.weights.infer reports what they cannot."""
    _check_unsupported(arch, kw, source)
    out: dict[str, tuple[Any, str]] = {}
    m = re.search(r"patch(\d+)_(\d+)", arch)
    if m and not re.search(r"_r\d+_|resnet", arch):
        name = f"the architecture name {arch} (not in vitlab's table of timm {TIMM_VERSION} architectures)"
        out["patch_size"] = (int(m.group(1)), name)
        out["img_size"] = (int(m.group(2)), name)
    present = {k for k, (_, origin) in kw.items() if origin != "default"}
    full = _fields(arch, {**{k: (v, "default") for k, v in _DEFAULTS.items()}, **kw}, label, source, False)
    for needs, fields in _STATED_BY:
        if needs <= present:
            out.update({f: full[f] for f in fields})
    return out


def _from_name(label: str) -> bool:
    """Whether a field's label says the architecture name (its table row or timm's defaults) fixed it."""
    return label.startswith(("timm architecture ", "timm's default pretrained_cfg", "the architecture name "))


def trusted(fields: dict[str, tuple[Any, str]], state: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """`fields` without what the architecture name fixed and the tensors (our names) cannot confirm, when they
    contradict any of it.

    A model created with other keyword arguments and saved without model_args (older timm, a hand-written
    config.json) still names its architecture: where its width, depth, tokens, norms or head differ from the name's,
    the name does not describe it, so neither are its heads, activation or eps taken from the name; the tensor shapes
    and the file's own statements (model_args, pretrained_cfg) decide, and `vitlab.weights.infer` refuses by name
    what they cannot."""
    w = state.get("patch_embed.proj.weight")
    if w is None or getattr(w, "ndim", 0) != 4:
        return fields
    blocks = {int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k))}
    fc1, head = state.get("blocks.0.mlp.fc1.weight"), state.get("head.weight")
    facts: dict[str, Any] = dict(
        embed_dim=int(w.shape[0]), patch_size=int(w.shape[-1]), class_token="cls_token" in state,
        distilled="dist_token" in state, reg_tokens=int(state["reg_token"].shape[1]) if "reg_token" in state else 0,
        fc_norm="fc_norm.weight" in state, pre_norm="norm_pre.weight" in state,
        patch_bias="patch_embed.proj.bias" in state, qkv_bias="blocks.0.attn.qkv.bias" in state,
        mlp_norm="blocks.0.mlp.norm.weight" in state, layer_scale="blocks.0.ls1.gamma" in state,
        pool="attn_pool.latent" in state, num_classes=int(head.shape[0]) if head is not None and head.ndim == 2 else 0)
    if blocks:
        facts["depth"] = max(blocks) + 1
    if fc1 is not None and fc1.ndim == 2:
        facts["mlp_dim"] = int(fc1.shape[0])
    seen = {k: v for k, (v, _) in fields.items()}
    seen["layer_scale"], seen["pool"] = seen.get("layer_scale") is not None, seen.get("pool") == "map"
    if any(_from_name(fields[k][1]) and seen[k] != v for k, v in facts.items() if k in fields):
        return {k: v for k, v in fields.items() if not _from_name(v[1]) or (k in facts and seen[k] == facts[k])}
    return fields
