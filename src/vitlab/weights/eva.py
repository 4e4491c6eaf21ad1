"""timm's eva.py models (its class `Eva`: EVA-02, Fang et al. 2023; DINOv3, Simeoni et al. 2025) in our names,
the ViTConfig fields their timm architecture fixes, and back (`vitlab convert --to timm` of a model with RoPE).

What timm's Eva stores differently from its VisionTransformer (ours):

    blocks.i.attn.q_bias, v_bias          beside qkv.weight (no bias): qkv.bias = [q_bias; 0; v_bias] (timm keeps the
                                          key bias as a zero buffer, not in the file)
    blocks.i.attn.q_proj, k_proj, v_proj  unfused (eva02_base / large): stacked into qkv, biases as above
    blocks.i.gamma_1, gamma_2             LayerScale: ls1.gamma, ls2.gamma
    blocks.i.mlp.fc1_g, fc1_x             SwiGLU with separate gate and value (EVA-02 B/L with its sub-LN mlp.norm,
                                          DINOv3 S+/H+/7B): fc1 = [gate; value]; the packed GluMlp's fc1 (EVA-02
                                          Ti/S) already is (gate first, gate_last=False)
    rope.*                                the rotary tables, recomputed from the config (`vitlab.models.rope`)

The rest (cls_token, reg_token, pos_embed, patch_embed.proj, norm1/2, attn.proj, mlp.fc2, mlp.norm, norm_pre, norm,
fc_norm, head) has our names. A bare state dict does not say whether or which RoPE it uses, its LayerNorm eps (1e-6
for EVA-02, 1e-5 for DINOv3) or, without fc_norm, its pooling: loading refuses each by name unless it is passed
(or a timm Hub folder's config.json names the architecture: `arch_fields`). Refused by name: QK normalisation,
a LayerNorm inside attention (EVA-02 CLIP), post-norm blocks, grouped key/value heads, LayerScale on attention
only, other RoPE kinds (mixed, M-RoPE, offset or xy grids), MAP pooling, BEiT's relative position bias.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

from ..models.config import ViTConfig
from ..models.posembed import sincos_2d
from .converted import Converted
from .report import WeightsError

# Tensors (ends of names under blocks.i.) only timm's Eva writes.
_MARKERS = ("attn.q_bias", "attn.v_bias", "attn.q_proj.weight", "gamma_1", "mlp.fc1_g.weight")
_UNSUPPORTED = {"relative_position": "a relative position bias (BEiT)", "attn.q_norm.": "QK normalisation",
                "attn.k_norm.": "QK normalisation", "attn.norm.": "a LayerNorm inside attention (scale_attn_inner)",
                "attn.gate.": "gated attention", "attn_pool.": "timm Eva's attention pooling (global_pool='map')"}
_BLOCK = re.compile(r"blocks\.(\d+)\.(.+)")


def matches(keys: set[str]) -> bool:
    """True for a state dict of timm's Eva class (EVA-02, DINOv3, ...): tensors its VisionTransformer has not."""
    return "patch_embed.proj.weight" in keys and any(
        k.startswith("blocks.") and k.endswith(_MARKERS) for k in keys)


# -- tensors --------------------------------------------------------------------------------------------------------


def to_ours(state: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """Rename an Eva state dict to ours (see the module docstring); WeightsError for what we do not compute."""
    out: dict[str, torch.Tensor] = {}
    blocks: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        for frag, what in _UNSUPPORTED.items():
            if frag in key:
                raise WeightsError(f"{source}: tensor {key!r} belongs to {what}, which vitlab's ViT does not have")
        if m := _BLOCK.fullmatch(key):
            blocks.setdefault(int(m.group(1)), {})[m.group(2)] = value
        elif not key.startswith("rope."):  # rope.*: tables, recomputed
            out[key] = value
    for i, parts in sorted(blocks.items()):
        out.update(_block(f"blocks.{i}.", parts, source))
    return out


def _block(p: str, b: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    def take(*names: str) -> torch.Tensor | None:
        found = [b.pop(n) for n in names if n in b]
        return found[0] if found else None

    out: dict[str, torch.Tensor] = {}
    weight = take("attn.qkv.weight")
    if weight is None and "attn.q_proj.weight" in b:
        weight = torch.cat([b.pop(f"attn.{n}_proj.weight") for n in "qkv"])
    if weight is not None:
        out[p + "attn.qkv.weight"] = weight
    biases = [take(f"attn.{n}_bias", f"attn.{n}_proj.bias") for n in "qkv"]
    fused = take("attn.qkv.bias")
    if fused is not None and any(t is not None for t in biases):
        raise WeightsError(f"{source}: {p}attn has both a fused qkv.bias and separate q / k / v biases")
    present = [t for t in biases if t is not None]
    if fused is not None:
        out[p + "attn.qkv.bias"] = fused
    elif present:
        out[p + "attn.qkv.bias"] = torch.cat([t if t is not None else torch.zeros_like(present[0]) for t in biases])
    if "gamma_1" in b and "gamma_2" not in b:
        raise WeightsError(f"{source}: {p}gamma_1 without gamma_2: LayerScale on the attention branch only "
                           "(attn_only_layer_scale), which vitlab's ViT does not have")
    for theirs, ours in (("gamma_1", "ls1.gamma"), ("gamma_2", "ls2.gamma")):
        if theirs in b:
            out[p + ours] = b.pop(theirs)
    for what in ("weight", "bias"):
        gate, value = take(f"mlp.fc1_g.{what}"), take(f"mlp.fc1_x.{what}")
        if (gate is None) != (value is None):
            raise WeightsError(f"{source}: {p}mlp has only one of fc1_g.{what} / fc1_x.{what}")
        if gate is not None and value is not None:
            out[p + f"mlp.fc1.{what}"] = torch.cat([gate, value])  # ours: [gate; value]
    out.update({p + k: v for k, v in b.items()})
    return out


def convert(tensors: dict[str, torch.Tensor], source: str) -> Converted:
    """An Eva state dict as `vitlab.weights.checkpoint` takes it: our tensors, the activation the layout fixes, and
    the fields it leaves open (refused by `vitlab.weights.infer` unless passed or stated by a config.json)."""
    state = to_ours(tensors, source)
    out = Converted(state)
    out.unfixed("rope", "timm's Eva layout does not store its rotary embedding: rope='eva02' (EVA-02, with "
                        "rope_ref_grid=(16, 16) at patch 14), 'dinov3' (DINOv3) or None (EVA-01)")
    out.unfixed("layer_norm_eps", "timm's Eva uses 1e-6 (EVA-02), its DINOv3 models 1e-5")
    if "cls_token" in state and "fc_norm.weight" not in state:
        out.unfixed("pool", "timm's Eva averages the patch tokens unless built with global_pool='token' (its DINOv3 "
                            "models: 'avg' by default, 'token' as DINOv3 itself): pool='gap' or 'token'")
    fc1, fc2 = state.get("blocks.0.mlp.fc1.weight"), state.get("blocks.0.mlp.fc2.weight")
    if fc1 is not None and fc2 is not None and fc1.dim() == fc2.dim() == 2:
        swiglu = fc1.shape[0] == 2 * fc2.shape[1]
        out.fix("act", "silu" if swiglu else "gelu",
                "timm's Eva (its " + ("SwiGLU gate's SiLU" if swiglu else "MLP's GELU") + " is fixed)")
    return out


# -- a timm architecture (config.json of a timm Hub folder) -> ViTConfig fields -------------------------------------

# timm's Eva constructor defaults (timm 1.0.31) for the arguments that change the numbers; norm_layer None: timm's
# LayerNorm, eps 1e-6.
_DEFAULTS: dict[str, Any] = dict(
    img_size=224, patch_size=16, num_classes=1000, global_pool="avg", embed_dim=768, depth=12, num_heads=12,
    num_kv_heads=None, qkv_bias=True, qkv_fused=True, qk_norm=False, mlp_ratio=4.0, swiglu_mlp=False,
    swiglu_align_to=0, scale_mlp=False, scale_attn_inner=False, attn_type="eva", norm_layer=None, init_values=None,
    attn_only_layer_scale=False, class_token=True, num_reg_tokens=0, no_embed_class=False, use_abs_pos_emb=True,
    use_rot_pos_emb=False, rope_type="cat", rope_grid_offset=0.0, rope_grid_indexing="ij", rope_temperature=10000.0,
    rope_rotate_half=False, rope_mrope_section=None, use_post_norm=False, use_pre_transformer_norm=False,
    use_post_transformer_norm=None, use_fc_norm=None, attn_pool_num_heads=None, attn_pool_mlp_ratio=None,
    ref_feat_shape=None, use_naflex=None)
# Arguments that change training or initialisation only (dropout, patch dropout, RoPE coordinate augmentation), or
# nothing at the model's own input size.
_INERT = {"drop_rate", "pos_drop_rate", "patch_drop_rate", "proj_drop_rate", "attn_drop_rate", "drop_path_rate",
          "dynamic_img_size", "dynamic_img_pad", "head_init_scale", "in_chans", "device", "dtype",
          "rope_shift_coords", "rope_jitter_coords", "rope_rescale_coords"}
_BOOLS = ("qkv_bias", "qkv_fused", "qk_norm", "swiglu_mlp", "scale_mlp", "scale_attn_inner", "attn_only_layer_scale",
          "class_token", "no_embed_class", "use_abs_pos_emb", "use_rot_pos_emb", "rope_rotate_half", "use_post_norm",
          "use_pre_transformer_norm")
_ROPES = {"cat": ("eva02", False), "dinov3": ("dinov3", True)}  # timm rope_type -> (ours, its rotate_half)


def arch_fields(arch: str, kw: dict[str, tuple[Any, str]], label: Callable[..., str],
                source: str) -> dict[str, tuple[Any, str]]:
    """ViTConfig field -> (value, where it came from) for a timm Eva architecture.

    Args:
        arch: The architecture name.
        kw: Its constructor arguments so far as (value, origin), origins as `vitlab.weights.timm_arch` labels them
            (config.json model_args over its global_pool over the architecture over the pretrained config).
        label: `vitlab.weights.timm_arch`'s labeller: label(kw, *keys) -> where the first of `keys` came from.
        source: Names the file in messages.

    Raises:
        WeightsError: an argument needs what vitlab's ViT does not have (named), or has a value of the wrong type.
    """
    for key, value in _DEFAULTS.items():
        kw.setdefault(key, (value, "default"))
    unknown = sorted(k for k in kw if k not in _DEFAULTS and k not in _INERT)

    def refuse(key: str, feature: str) -> WeightsError:
        where = "config.json model_args" if kw[key][1] == "model_args" else f"timm architecture {arch!r}"
        return WeightsError(f"{source}: {where} uses {feature} ({key}={kw[key][0]!r}), which vitlab's ViT does not "
                            "have")

    if unknown:
        raise refuse(unknown[0], "a timm Eva argument vitlab does not know")
    for key in _BOOLS:
        if not isinstance(kw[key][0], bool):
            raise refuse(key, "a value that is not true or false")

    def v(k: str) -> Any:
        return kw[k][0]

    def where(*keys: str) -> str:
        text = label(kw, *keys)
        return text.replace("(VisionTransformer default)", "(Eva default)")

    _check(v, refuse)
    try:
        D, pool, swiglu = int(v("embed_dim")), v("global_pool"), v("swiglu_mlp")
        fc_norm = pool == "avg" if v("use_fc_norm") is None else bool(v("use_fc_norm"))
        img, patch = _input_size(v)
        norm = v("norm_layer")
        rope, ref = _rope(v)
        out: dict[str, tuple[Any, str]] = {
            "embed_dim": (D, where("embed_dim")), "depth": (int(v("depth")), where("depth")),
            "num_heads": (int(v("num_heads")), where("num_heads")),
            "mlp_dim": (_mlp_dim(v), where("mlp_ratio", "embed_dim")),
            "patch_size": (patch, where("patch_size")), "img_size": (img, where("img_size")),
            "class_token": (v("class_token"), where("class_token")),
            "pool": ({"avg": "gap", "token": "token"}[pool], where("global_pool")),
            "act": ("silu" if swiglu else "gelu", where("swiglu_mlp")),
            "mlp": ("swiglu" if swiglu else "mlp", where("swiglu_mlp")),
            "mlp_norm": (v("scale_mlp"), where("scale_mlp")),
            "layer_scale": (float(v("init_values")) if v("init_values") else None, where("init_values")),
            "reg_tokens": (int(v("num_reg_tokens")), where("num_reg_tokens")),
            "no_embed_class": (v("no_embed_class"), where("no_embed_class")),
            "distilled": (False, f"timm architecture {arch} (class Eva)"),
            "fc_norm": (fc_norm, where("use_fc_norm", "global_pool")),
            "pre_norm": (v("use_pre_transformer_norm"), where("use_pre_transformer_norm")),
            "patch_bias": (not v("use_pre_transformer_norm"), where("use_pre_transformer_norm")),
            "qkv_bias": (v("qkv_bias"), where("qkv_bias")),
            "layer_norm_eps": (float(norm.get("eps", 1e-6)) if isinstance(norm, dict) else 1e-6, where("norm_layer")),
            "pos_embed": ("learned" if v("use_abs_pos_emb") else "none", where("use_abs_pos_emb")),
            "num_classes": (int(v("num_classes")), where("num_classes")),
            "rope": (rope, where("use_rot_pos_emb", "rope_type")),
            "rope_theta": (float(v("rope_temperature")) if rope else None, where("rope_temperature")),
            "rope_ref_grid": (ref, where("ref_feat_shape")),
        }
    except (TypeError, ValueError, KeyError, IndexError) as e:
        raise WeightsError(f"{source}: timm architecture {arch!r}: bad argument value: {type(e).__name__}: {e}") from e
    return out


def _mlp_dim(v: Callable[[str], Any]) -> int:
    """The MLP's hidden width as our mlp_dim (SwiGLU: its two fc1 halves together)."""
    hidden = int(int(v("embed_dim")) * float(v("mlp_ratio")))
    if v("swiglu_mlp") and (v("scale_mlp") or v("swiglu_align_to")):  # timm's SwiGLU (separate fc1_g / fc1_x) aligns
        hidden += -hidden % int(v("swiglu_align_to")) if v("swiglu_align_to") else 0
    return 2 * hidden if v("swiglu_mlp") else hidden


def _input_size(v: Callable[[str], Any]) -> tuple[Any, int]:
    """(img_size: an int, or (H, W) when not square; the square patch's side)."""
    size, patch = v("img_size"), v("patch_size")
    img = size if isinstance(size, int) else (tuple(size) if size[0] != size[1] else size[0])
    if not isinstance(patch, int):
        if len(patch) != 2 or patch[0] != patch[1]:
            raise ValueError(f"patch_size {patch!r} is not square")
        patch = patch[0]
    return img, int(patch)


def _rope(v: Callable[[str], Any]) -> tuple[str | None, tuple[int, ...] | None]:
    """(our rope kind, its reference grid: EVA-02's ref_feat_shape, None for DINOv3's), or (None, None)."""
    if not v("use_rot_pos_emb"):
        return None, None
    rope = _ROPES[v("rope_type")][0]
    ref = v("ref_feat_shape") if rope == "eva02" else None
    return rope, (ref, ref) if isinstance(ref, int) else (tuple(int(r) for r in ref) if ref is not None else None)


def _check(v: Callable[[str], Any], refuse: Callable[[str, str], WeightsError]) -> None:
    """Raise for an Eva argument that switches on what vitlab's ViT does not compute."""
    flags = {"qk_norm": "QK normalisation", "scale_attn_inner": "a LayerNorm inside attention",
             "use_post_norm": "post-norm blocks", "attn_only_layer_scale": "LayerScale on the attention branch only",
             "use_naflex": "NaFlexViT (variable-resolution patches)"}
    for key, feature in flags.items():
        if v(key):
            raise refuse(key, feature)
    if v("num_kv_heads") is not None:
        raise refuse("num_kv_heads", "grouped key/value heads")
    if v("attn_type") != "eva":
        raise refuse("attn_type", "another attention layer")
    norm = v("norm_layer")
    if norm is not None and not (isinstance(norm, dict) and norm.get("layer") == "LayerNorm"):
        raise refuse("norm_layer", "a normalisation other than LayerNorm")
    if v("global_pool") not in ("avg", "token"):
        raise refuse("global_pool", "pooling other than the class token or the patch average")
    fc_norm = v("global_pool") == "avg" if v("use_fc_norm") is None else bool(v("use_fc_norm"))
    post = (not fc_norm) if v("use_post_transformer_norm") is None else bool(v("use_post_transformer_norm"))
    if post == fc_norm:
        raise refuse("use_post_transformer_norm", "both or neither of the final LayerNorms (before and after pooling)")
    if v("use_rot_pos_emb"):
        if v("rope_type") not in _ROPES:
            raise refuse("rope_type", "a rotary embedding other than EVA-02's ('cat') and DINOv3's")
        if v("rope_rotate_half") != _ROPES[v("rope_type")][1]:
            raise refuse("rope_rotate_half", f"the other channel layout for rope_type={v('rope_type')!r}")
        if v("rope_grid_offset") != 0:
            raise refuse("rope_grid_offset", "RoPE positions with an offset")
        if v("rope_grid_indexing") != "ij":
            raise refuse("rope_grid_indexing", "RoPE with the grid's axes swapped")


# -- ours -> timm's Eva (`vitlab convert --to timm`) ---------------------------------------------------------------

# timm architectures whose registered arguments hold what JSON keyword arguments cannot (the LayerNorm's eps);
# `timm_args`' keyword arguments set everything else.
_BASES = {1e-6: "eva02_tiny_patch14_224", 1e-5: "vit_small_patch16_dinov3"}


def timm_args(cfg: ViTConfig, source: str = "model") -> tuple[str, dict[str, Any], list[str]]:
    """timm's Eva architecture and `create_model` keyword arguments that build `cfg` (a model with RoPE).

    Raises:
        WeightsError: timm's Eva cannot compute it (the message says why).
    """
    def refuse(why: str) -> WeightsError:
        return WeightsError(f"{source}: cannot write a timm Eva model (RoPE): {why}")

    if cfg.rope is None:
        raise refuse("the model has no RoPE; write it as a timm VisionTransformer")
    for bad, why in ((cfg.hybrid_layers is not None, "it has a ResNet stem (hybrid)"),
                     (cfg.representation_size is not None, "it has a pre-logits layer"),
                     (cfg.distilled, "it has a distillation token"), (cfg.pool == "map", "it has a MAP head"),
                     (cfg.patch_bias == cfg.pre_norm, "timm's patch projection has a bias exactly when pre_norm is "
                                                      "off")):
        if bad:
            raise refuse(why)
    swiglu = cfg.mlp == "swiglu"
    if cfg.act != ("silu" if swiglu else "gelu"):
        raise refuse(f"act={cfg.act!r}: timm's Eva fixes the MLP's activation (GELU; SwiGLU's gate SiLU)")
    notes: list[str] = []
    arch = _BASES.get(cfg.layer_norm_eps)
    if arch is None:
        arch = _BASES[1e-6]
        notes.append(f"the model's LayerNorm eps is {cfg.layer_norm_eps:g} but timm builds 1e-6: logits differ "
                     "slightly unless the timm model is built with norm_layer=partial(LayerNorm, "
                     f"eps={cfg.layer_norm_eps:g})")
    D = cfg.embed_dim
    hidden = cfg.mlp_dim // 2 if swiglu else cfg.mlp_dim
    ratio = hidden / D
    if int(D * ratio) != hidden:
        raise refuse(f"MLP width {hidden} is not int(embed_dim * mlp_ratio) for any float ratio")
    h, w = cfg.img_hw
    ref = cfg.rope_ref_grid
    kwargs: dict[str, Any] = {
        "img_size": h if h == w else [h, w], "patch_size": cfg.patch_size, "in_chans": cfg.in_chans,
        "num_classes": cfg.num_classes, "embed_dim": D, "depth": cfg.depth, "num_heads": cfg.num_heads,
        "mlp_ratio": ratio, "qkv_bias": cfg.qkv_bias, "qkv_fused": True, "swiglu_mlp": swiglu, "swiglu_align_to": 0,
        "scale_mlp": cfg.mlp_norm, "init_values": cfg.layer_scale, "class_token": cfg.class_token,
        "num_reg_tokens": cfg.reg_tokens, "no_embed_class": cfg.no_embed_class,
        "use_abs_pos_emb": cfg.pos_embed != "none", "use_rot_pos_emb": True,
        "rope_type": "cat" if cfg.rope == "eva02" else "dinov3", "rope_temperature": cfg.rope_base,
        "rope_rotate_half": cfg.rope == "dinov3", "ref_feat_shape": list(ref) if ref is not None else None,
        "global_pool": "token" if cfg.pool == "token" else "avg", "use_fc_norm": cfg.fc_norm,
        "use_post_transformer_norm": not cfg.fc_norm, "use_pre_transformer_norm": cfg.pre_norm,
    }
    if cfg.pos_embed == "sincos2d":
        notes.append("wrote the fixed sin-cos table as timm's learned pos_embed")
    return arch, kwargs, notes


def from_ours(state: dict[str, torch.Tensor], cfg: ViTConfig, source: str = "model") -> dict[str, torch.Tensor]:
    """Our tensors in the names of timm's Eva as `timm_args` builds it (fused qkv with q_bias / v_bias, gamma_1/2,
    SwiGLU with sub-LN split into fc1_g / fc1_x)."""
    out: dict[str, torch.Tensor] = {}
    split = cfg.mlp == "swiglu" and cfg.mlp_norm  # timm's SwiGLU (separate fc1_g / fc1_x); else the packed GluMlp
    for key, value in state.items():
        m = _BLOCK.fullmatch(key)
        rest = m.group(2) if m else ""
        p = key[: len(key) - len(rest)]
        if rest == "attn.qkv.bias":
            q, k, v = value.chunk(3)
            if bool(k.any()):
                raise WeightsError(f"{source}: cannot write a timm Eva model: {key}'s key part is not zero, and "
                                   "timm's Eva has no key bias")
            out[p + "attn.q_bias"], out[p + "attn.v_bias"] = q, v
        elif rest in ("ls1.gamma", "ls2.gamma"):
            out[p + ("gamma_1" if rest == "ls1.gamma" else "gamma_2")] = value
        elif split and rest in ("mlp.fc1.weight", "mlp.fc1.bias"):
            gate, val = value.chunk(2)
            what = rest.rsplit(".", 1)[1]
            out[p + f"mlp.fc1_g.{what}"], out[p + f"mlp.fc1_x.{what}"] = gate, val
        else:
            out[key] = value
    if cfg.pos_embed == "sincos2d":  # the fixed table as the learned one timm adds (prefix rows zero)
        rows = cfg.num_patches + cfg.pos_prefix_rows
        pos = torch.zeros(1, rows, cfg.embed_dim, dtype=state["patch_embed.proj.weight"].dtype)
        pos[0, cfg.pos_prefix_rows:] = sincos_2d(*cfg.grid_size, cfg.embed_dim).to(pos.dtype)
        out["pos_embed"] = pos
    return out
