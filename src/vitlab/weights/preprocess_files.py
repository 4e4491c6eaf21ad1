"""What each source says about its inputs, as a `vitlab.models.preprocess.Preprocess`: the files other libraries ship
beside their weights (transformers' `preprocessor_config.json`: `from_hf_processor`; timm's `pretrained_cfg` in a
hub folder's config.json: `from_timm_cfg`) and the conventions of the formats that ship none (`vit_jax`,
`torchvision_classification`). `vitlab.weights.checkpoint` calls these; the parsers raise ValueError naming the
file and the field they cannot express.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..models.preprocess import IMAGENET, INCEPTION, INTERPOLATIONS, Preprocess

__all__ = ["from_hf_processor", "from_timm_cfg", "torchvision_classification", "vit_jax"]

# PIL's resampling enum values, as transformers' preprocessor_config.json stores them ("resample": 2).
_PIL_RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}

# Processors that read `size: 224` as the shorter side (transformers' default_to_square=False), not a square.
_SHORTEST_EDGE_INT = ("CLIPImageProcessor", "CLIPFeatureExtractor", "ChineseCLIPImageProcessor", "BitImageProcessor")


def vit_jax(img_size: int | tuple[int, int], source: str = "vit_jax convention") -> Preprocess:
    """Google's vit_jax / AugReg / big_vision: the whole image resized to img_size (no crop), bilinear, [-1, 1].

    vit_jax's input_pipeline evaluates with `tf.image.resize(im, [image_size, image_size])` (bilinear by default)
    and `(im - 127.5) / 127.5`."""
    return Preprocess(img_size, INCEPTION.mean, INCEPTION.std, "resize", 1.0, "bilinear", "rgb", source)


def torchvision_classification(crop_size: int, resize_size: int, interpolation: str = "bilinear",
                               source: str = "torchvision ImageClassification") -> Preprocess:
    """torchvision's `ImageClassification(crop_size, resize_size, interpolation)`: shorter side to resize_size,
    centre crop, ImageNet statistics (ViT_B_16_Weights.IMAGENET1K_V1: 224 / 256 / bilinear)."""
    return Preprocess(crop_size, IMAGENET.mean, IMAGENET.std, "center_crop", crop_size / resize_size,
                      interpolation, "rgb", source)


def from_hf_processor(d: Mapping[str, Any], source: str = "preprocessor_config.json") -> Preprocess:
    """transformers' image processor config (ViTImageProcessor, DeiTImageProcessor, ...) -> Preprocess.

    ViT, SigLIP: `size` {"height", "width"} squashed, no crop. DeiT: squash to `size` then centre-crop `crop_size`.
    `size` {"shortest_edge": s} with a crop (CLIP, BiT / DINOv2): shorter side to s, centre crop; for CLIP's and
    BiT's processors an int `size` means that too (ViT's: a square).
    """
    if not isinstance(d, Mapping):
        raise ValueError(f"{source}: expected a JSON object, got {type(d).__name__}")
    resample = d.get("resample", 2)
    interpolation = _PIL_RESAMPLE.get(resample) if _is_int(resample) else str(resample).lower()
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"{source}: resample={resample!r} is not one of nearest (0), bilinear (2), bicubic (3)")
    if d.get("do_normalize", True):
        mean, std = d.get("image_mean", INCEPTION.mean), d.get("image_std", INCEPTION.std)
    else:
        mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    if d.get("do_rescale", True) and abs(float(d.get("rescale_factor", 1 / 255)) - 1 / 255) > 1e-9:
        raise ValueError(f"{source}: rescale_factor={d.get('rescale_factor')!r} is not 1/255; not supported")
    kind = str(d.get("image_processor_type") or d.get("feature_extractor_type") or "").removesuffix("Fast")
    size = d.get("size", 224)
    if _is_int(size) and kind in _SHORTEST_EDGE_INT:  # CLIP / BiT (DINOv2): an int is the shorter side
        size = {"shortest_edge": size}
    size = _hf_size(size, f"{source}: size")
    crop = _hf_size(d.get("crop_size"), f"{source}: crop_size") if d.get("do_center_crop") else None
    if "shortest_edge" in size:
        short = size["shortest_edge"]
        hw = (crop["height"], crop["width"]) if crop else (short, short)
        return Preprocess(hw, mean, std, "center_crop", min(hw) / short, interpolation, "rgb", source)
    if not d.get("do_resize", True):
        raise ValueError(f"{source}: do_resize=false (images fed at their own size) cannot be expressed")
    if crop:
        hw = (crop["height"], crop["width"])
        return Preprocess(hw, mean, std, "resize", min(hw) / min(size["height"], size["width"]), interpolation,
                          "rgb", source)
    return Preprocess((size["height"], size["width"]), mean, std, "resize", 1.0, interpolation, "rgb", source)


def _hf_size(size: Any, what: str) -> dict[str, int]:
    if _is_int(size):
        return {"height": size, "width": size}
    if isinstance(size, Mapping) and ("shortest_edge" in size or {"height", "width"} <= set(size)):
        return dict(size)
    raise ValueError(f"{what} must be an int, {{'height', 'width'}} or {{'shortest_edge'}}, got {size!r}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def from_timm_cfg(cfg: Mapping[str, Any], source: str = "timm pretrained_cfg") -> Preprocess:
    """timm's `pretrained_cfg` (input_size, mean, std, crop_pct, crop_mode, interpolation) -> Preprocess,
    the same transform `timm.data.create_transform(**resolve_data_config(...))` builds for evaluation."""
    if not isinstance(cfg, Mapping):
        raise ValueError(f"{source}: expected a mapping, got {type(cfg).__name__}")
    size = cfg.get("test_input_size") or cfg.get("input_size") or (3, 224, 224)
    if not isinstance(size, list | tuple) or len(size) != 3:
        raise ValueError(f"{source}: input_size must be (C, H, W), got {size!r}")
    chans, h, w = (int(v) for v in size)
    crop_mode = cfg.get("crop_mode") or "center"
    if crop_mode not in ("center", "squash"):
        raise ValueError(f"{source}: crop_mode={crop_mode!r} is not supported (center, squash)")
    interpolation = cfg.get("interpolation") or "bicubic"
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"{source}: interpolation={interpolation!r} is not one of {INTERPOLATIONS}")
    mean, std = tuple(cfg.get("mean", IMAGENET.mean)), tuple(cfg.get("std", IMAGENET.std))
    return Preprocess((h, w), mean, std, "resize" if crop_mode == "squash" else "center_crop",
                      float(cfg.get("test_crop_pct") or cfg.get("crop_pct") or 0.875), interpolation,
                      "grey" if chans == 1 else "rgb", source)
