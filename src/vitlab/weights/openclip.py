"""OpenCLIP's image tower (`open_clip.model.CLIP.visual`, a `open_clip.transformer.VisionTransformer`) in our names.

Read from a whole CLIP state dict (`visual.` prefix; the text tower is ignored) or the image tower's own, as
`torch.save(model.state_dict())`, `open_clip_pytorch_model.bin` or `open_clip_model.safetensors` write them, and
from a Hub-style folder whose `open_clip_config.json` holds `model_cfg` (`vision_cfg`, `quick_gelu`) and
`preprocess_cfg`.

Names: `conv1` (no bias) -> `patch_embed.proj`; `class_embedding` (D,) -> `cls_token`; `positional_embedding`
(1 + N, D) -> `pos_embed`; `ln_pre` -> `norm_pre`; `transformer.resblocks.{i}.` -> `blocks.{i}.` with `ln_1`/`ln_2`
-> `norm1`/`norm2`, `attn.in_proj_*` -> `attn.qkv.*` (q, k, v stacked in that order, as timm's), `attn.out_proj` ->
`attn.proj`, `mlp.c_fc`/`mlp.c_proj` -> `mlp.fc1`/`mlp.fc2`, `ls_1`/`ls_2` -> `ls1`/`ls2`; `ln_post` -> `norm`
(`fc_norm` when it follows average pooling); `proj` (D, E) -> a head (E, D) with a zero bias, so the model's
output is `encode_image`'s (unnormalised) embedding.

What the tensors do not fix: the MLP's activation (QuickGELU for OpenAI's weights, `quick_gelu` in the config
name; GELU for most LAION ones) and the number of heads (width // head_width, head_width 64 unless the config
says otherwise: 80 for H/14, 88 for g/14, 104 for bigG/14). They come from `open_clip_config.json`; without it
the heads come from OpenCLIP's published configs when width, depth and patch size are one of theirs, and the
activation never from a guess: `load_model` then needs `act=` (and `num_heads=` for another shape).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from ..models import preprocess as pp
from .converted import Converted
from .report import WeightsError

CONFIG_FILE = "open_clip_config.json"
WEIGHT_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.safetensors", "open_clip_pytorch_model.bin",
                "open_clip_pytorch_model.pth")

# (width, layers, patch_size) -> (OpenCLIP config names, heads = width // head_width), from open_clip 3.3.0's
# model_configs/*.json (every config of a key has the same heads; the -quickgelu, -336/-378, -worldwide, -CLIPA
# and multilingual variants share their base model's row).
KNOWN_MODELS: dict[tuple[int, int, int], tuple[str, int]] = {
    (384, 12, 16): ("ViT-S-16", 6),
    (384, 12, 32): ("ViT-S-32", 6),
    (512, 12, 16): ("ViT-M-16", 8),
    (512, 12, 32): ("ViT-M-32", 8),
    (768, 12, 16): ("ViT-B-16", 12),
    (768, 12, 32): ("ViT-B-32", 12),
    (896, 12, 16): ("ViT-B-16-plus", 14),
    (896, 12, 32): ("ViT-B-32-plus-256", 14),
    (1024, 24, 14): ("ViT-L-14 / ViT-L-14-336", 16),
    (1024, 24, 16): ("ViT-L-16", 16),
    (1280, 32, 14): ("ViT-H-14", 16),  # head_width 80
    (1280, 32, 16): ("ViT-H-16", 16),
    (1408, 40, 14): ("ViT-g-14", 16),  # head_width 88
    (1664, 48, 14): ("ViT-bigG-14", 16),  # head_width 104
    (1792, 56, 14): ("ViT-e-14", 16),  # head_width 112
}

# OpenCLIP names inside a block / the tower -> ours (applied to the part after the prefix).
_BLOCK = {"ln_1.": "norm1.", "ln_2.": "norm2.", "attn.in_proj_weight": "attn.qkv.weight",
          "attn.in_proj_bias": "attn.qkv.bias", "attn.out_proj.": "attn.proj.", "mlp.c_fc.": "mlp.fc1.",
          "mlp.c_proj.": "mlp.fc2.", "ls_1.gamma": "ls1.gamma", "ls_2.gamma": "ls2.gamma"}
_TOP = {"conv1.weight": "patch_embed.proj.weight", "conv1.bias": "patch_embed.proj.bias",
        "ln_pre.weight": "norm_pre.weight", "ln_pre.bias": "norm_pre.bias"}
_BLOCK_RE = re.compile(r"transformer\.resblocks\.(\d+)\.(.+)")
# vision_cfg keys that change the function and that our ViT cannot express (when true / not the default).
_REFUSED_CFG = {"attentional_pool": "attentional pooling (CoCa's AttentionalPooler)", "qk_norm": "QK normalisation",
                "scaled_cosine_attn": "scaled cosine attention", "scale_heads": "per-head attention scales",
                "scale_attn_inner": "a LayerNorm inside attention", "scale_attn": "a LayerNorm after attention",
                "scale_fc": "a LayerNorm inside the MLP", "act_kwargs": "activation arguments",
                "timm_model_name": "a timm image tower (visual.trunk)"}
_INTERPOLATIONS = {"bicubic": "bicubic", "bilinear": "bilinear", "nearest": "nearest"}


def prefix_of(keys: set[str]) -> str | None:
    """"visual." for a whole CLIP state dict, "" for the image tower's own, None for anything else."""
    for prefix in ("visual.", ""):
        if f"{prefix}class_embedding" in keys and f"{prefix}positional_embedding" in keys and (
                f"{prefix}conv1.weight" in keys or f"{prefix}transformer.resblocks.0.ln_1.weight" in keys):
            return prefix
    return None


def matches(keys: set[str]) -> bool:
    """True for an OpenCLIP ViT state dict (whole CLIP or image tower); its ResNets (`visual.attnpool`) and timm
    towers (`visual.trunk.`) are refused by `convert` with a message rather than left to 'unknown layout'."""
    return prefix_of(keys) is not None or any(k.startswith(("visual.trunk.", "visual.attnpool.")) for k in keys)


def convert(tensors: dict[str, torch.Tensor], source: str, config: dict[str, Any] | None = None,
            config_source: str = CONFIG_FILE) -> Converted:
    """The image tower of an OpenCLIP state dict in our names, with the ViTConfig fields the file fixes.

    Args:
        tensors: The state dict as saved (prefixes of DDP / torch.compile already removed).
        source: The file, for messages.
        config: The parsed `open_clip_config.json` (with `model_cfg`) or a bare model config, if there is one.
        config_source: Names the config in `sources` and messages.

    Raises:
        WeightsError: a ResNet or timm image tower, attention pooling, a tensor we have no place for, or a
            config option our ViT cannot express.
    """
    keys = set(tensors)
    if any(k.startswith("visual.attnpool.") for k in keys):
        raise WeightsError(f"{source}: an OpenCLIP ResNet image tower (visual.attnpool: ModifiedResNet), not a ViT")
    if any(k.startswith("visual.trunk.") for k in keys):
        raise WeightsError(f"{source}: an OpenCLIP image tower built on a timm model (visual.trunk.*); load the "
                           "timm model's own weights instead")
    prefix = prefix_of(keys)
    if prefix is None:
        raise WeightsError(f"{source}: not an OpenCLIP ViT state dict (no class_embedding / positional_embedding)")
    vision, model_cfg = _vision_cfg(config, config_source)
    avg, final_ln = _pooling(vision, config_source)
    state = _rename(tensors, prefix, source, norm="fc_norm" if avg and final_ln else "norm")
    out = Converted(state, default_resize="bicubic")  # open_clip.model.resize_pos_embed: bicubic, antialiased
    tensor_src = "the tensors (OpenCLIP layout)"
    fix = out.fix
    fix("patch_bias", "patch_embed.proj.bias" in state, tensor_src)
    fix("pre_norm", "norm_pre.weight" in state, tensor_src)
    fix("class_token", True, tensor_src)
    fix("layer_norm_eps", 1e-5, "OpenCLIP's LayerNorm (torch default eps 1e-5)")
    if "blocks.0.ls1.gamma" in state:
        init = vision.get("ls_init_value") if vision is not None else None
        fix("layer_scale", float(init) if init else 1e-5,
            config_source if init else "the tensors (ls_1.gamma; the init value does not change the loaded model)")
    width, depth, patch = _shape(state, source)
    if vision is not None:
        _from_config(out, vision, model_cfg, config_source, width, depth, patch, avg, final_ln)
    else:
        _bare(out, state, width, depth, patch, source)
    return out


def _vision_cfg(config: dict[str, Any] | None, where: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(vision_cfg, model_cfg) of an open_clip_config.json ({"model_cfg": ...}) or a bare model config."""
    if config is None:
        return None, {}
    model_cfg = config.get("model_cfg", config) if isinstance(config, dict) else None
    vision = model_cfg.get("vision_cfg") if isinstance(model_cfg, dict) else None
    if not isinstance(model_cfg, dict) or not isinstance(vision, dict):
        raise WeightsError(f"{where}: no model_cfg.vision_cfg (an OpenCLIP config has model_cfg: {{vision_cfg, "
                           "text_cfg, embed_dim}})")
    for key, what in _REFUSED_CFG.items():
        if vision.get(key):
            raise WeightsError(f"{where}: vision_cfg.{key}={vision[key]!r} ({what}) is not supported by vitlab's ViT")
    if isinstance(vision.get("layers"), list | tuple):
        raise WeightsError(f"{where}: vision_cfg.layers={vision['layers']} is an OpenCLIP ResNet, not a ViT")
    return vision, model_cfg


def _pooling(vision: dict[str, Any] | None, where: str) -> tuple[bool, bool]:
    """(average pooling, ln_post after pooling) from vision_cfg; (False, False) without a config."""
    if vision is None:
        return False, False
    pool = vision.get("pool_type", "tok")
    if pool not in ("tok", "avg"):
        raise WeightsError(f"{where}: vision_cfg.pool_type={pool!r} (no pooled output) is not supported; vitlab's "
                           "ViT pools the class token ('tok') or averages the patch tokens ('avg')")
    return pool == "avg", bool(vision.get("final_ln_after_pool", False))


def _rename(tensors: dict[str, torch.Tensor], prefix: str, source: str, norm: str) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for key, t in tensors.items():
        if not key.startswith(prefix):
            continue  # the text tower, logit_scale
        name = key[len(prefix):]
        if name == "class_embedding":
            state["cls_token"] = t.reshape(1, 1, -1)
        elif name == "positional_embedding":
            state["pos_embed"] = t.reshape(1, *t.shape[-2:])
        elif name == "proj":
            if t.dim() != 2:
                raise WeightsError(f"{source}: {key} has shape {tuple(t.shape)}; OpenCLIP's projection is (D, E)")
            state["head.weight"] = t.t().contiguous()
            state["head.bias"] = torch.zeros(t.shape[1], dtype=t.dtype)
        elif name in ("ln_post.weight", "ln_post.bias"):
            state[f"{norm}.{name.split('.')[1]}"] = t
        elif name in _TOP:
            state[_TOP[name]] = t
        elif (m := _BLOCK_RE.fullmatch(name)) and (rest := _block_name(m.group(2))) is not None:
            state[f"blocks.{m.group(1)}.{rest}"] = t
        else:
            raise WeightsError(f"{source}: tensor {key!r} has no place in vitlab's ViT (OpenCLIP options such as "
                               "attentional pooling, QK-norm or scaled attention are not supported)")
    return state


def _block_name(rest: str) -> str | None:
    for theirs, ours in _BLOCK.items():
        if rest.startswith(theirs):
            return ours + rest[len(theirs):]
    return None


def _shape(state: dict[str, torch.Tensor], source: str) -> tuple[int, int, int]:
    """(width, depth, patch size) from the tensors."""
    w = state.get("patch_embed.proj.weight")
    if w is None or w.dim() != 4:
        raise WeightsError(f"{source}: no 4-D conv1.weight (OpenCLIP's patch projection)")
    depth = 1 + max((int(k.split(".")[1]) for k in state if k.startswith("blocks.")), default=-1)
    return int(w.shape[0]), depth, int(w.shape[-1])


def _from_config(out: Converted, vision: dict[str, Any], model_cfg: dict[str, Any], where: str, width: int,
                 depth: int, patch: int, avg: bool, final_ln: bool) -> None:
    """The fields an open_clip_config.json fixes, checked against the tensors where both say it."""
    def fix(name: str, value: Any, key: str) -> None:
        out.fix(name, value, f"{where} ({key})")

    said = (vision.get("width", 768), vision.get("layers", 12), vision.get("patch_size", 16))
    if said != (width, depth, patch):
        raise WeightsError(f"{where}: vision_cfg says width, layers, patch_size = {said}; the tensors have "
                           f"{(width, depth, patch)}")
    head_width = vision.get("head_width", 64)
    if not isinstance(head_width, int) or head_width <= 0 or width % head_width:
        raise WeightsError(f"{where}: vision_cfg.head_width {head_width!r} does not divide width {width}")
    fix("num_heads", width // head_width, "vision_cfg.width // head_width")
    fix("act", "quick_gelu" if model_cfg.get("quick_gelu") else "gelu", "model_cfg.quick_gelu")
    fix("pool", "gap" if avg else "token", "vision_cfg.pool_type")
    if avg and final_ln:
        fix("fc_norm", True, "vision_cfg.final_ln_after_pool")
    norm_kwargs = vision.get("norm_kwargs") or {}
    if not isinstance(norm_kwargs, dict) or set(norm_kwargs) - {"eps"}:
        raise WeightsError(f"{where}: vision_cfg.norm_kwargs={norm_kwargs!r}: only a LayerNorm eps is supported")
    if "eps" in norm_kwargs:
        fix("layer_norm_eps", float(norm_kwargs["eps"]), "vision_cfg.norm_kwargs.eps")
    size = vision.get("image_size", 224)
    fix("img_size", tuple(size) if isinstance(size, list | tuple) else size, "vision_cfg.image_size")


def _bare(out: Converted, state: dict[str, torch.Tensor], width: int, depth: int, patch: int, source: str) -> None:
    """A state dict without its config: heads from the published configs' table (else refused by name), the
    activation never (`infer_config` refuses a CLIP's: OpenAI's QuickGELU or LAION's GELU)."""
    if "norm_pre.weight" not in state:
        raise WeightsError(f"{source}: an OpenCLIP image tower without ln_pre (CLIPA: it averages the patch tokens "
                           "and normalises after pooling, which only its config says); load the folder with its "
                           f"{CONFIG_FILE}")
    out.fix("pool", "token", "OpenCLIP's default pool_type 'tok' (every published config with ln_pre)")
    row = KNOWN_MODELS.get((width, depth, patch))
    if row is not None:
        out.fix("num_heads", row[1], f"OpenCLIP's {row[0]} config (width {width}, {depth} layers, patch {patch})")
    else:  # OpenCLIP's heads are width // head_width, and head_width is 64 in most configs but not all (H-14: 80)
        out.unfixed("num_heads", f"width {width}, {depth} layers, patch {patch} is no published OpenCLIP config; "
                    "its heads are width // head_width")


def preprocess_from(config: dict[str, Any], img_size: int | tuple[int, int], where: str) -> pp.Preprocess | None:
    """The eval preprocessing of an open_clip_config.json's preprocess_cfg, over OpenCLIP's defaults (OpenAI's
    mean/std, bicubic, resize_mode "shortest": shorter side to the size, centre crop); None for "longest"
    (resize the longer side and pad), which we have no transform for."""
    cfg = config.get("preprocess_cfg") or {}
    if not isinstance(cfg, dict):
        raise WeightsError(f"{where}: preprocess_cfg must be a mapping, got {type(cfg).__name__}")
    mode = cfg.get("resize_mode", "shortest")
    interp = _INTERPOLATIONS.get(str(cfg.get("interpolation", "bicubic")))
    if mode not in ("shortest", "squash") or interp is None:
        return None
    try:
        return pp.Preprocess(img_size, tuple(cfg.get("mean", OPENAI_MEAN)), tuple(cfg.get("std", OPENAI_STD)),
                             "center_crop" if mode == "shortest" else "resize", 1.0, interp, "rgb",
                             f"{where} preprocess_cfg")
    except (ValueError, TypeError) as e:
        raise WeightsError(f"{where}: bad preprocess_cfg: {e}") from e


# OpenCLIP's OPENAI_DATASET_MEAN / _STD (open_clip/constants.py), its PreprocessCfg defaults.
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
