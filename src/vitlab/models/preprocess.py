"""What a checkpoint expects its pixels to look like, as data that travels with the weights.

A ViT is only right on inputs prepared the way it was trained: Google's vit_jax / AugReg models see pixels mapped
to [-1, 1] and the whole image squashed to the input size; torchvision's and DeiT's see ImageNet mean/std after a
shorter-side resize and a centre crop. `Preprocess` holds those facts; every reader fills one from its source's
convention (`vitlab.weights.checkpoint`), `save_weights` stores it in the `.safetensors` header, and `resolve`
picks the one to use: an explicit override, else the checkpoint's own, else a default with one warning.
`vitlab.data.transforms_for` turns it into the eval transform.

This module imports nothing heavy, so readers and the registry can use it freely.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from .config import check_keys, to_hw

RESIZE_MODES = ("resize", "center_crop")
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")
CHANNELS = ("rgb", "grey", "grey_to_rgb")


class Stats(NamedTuple):
    """Per-channel normalisation on [0, 1] pixels: x -> (x - mean) / std."""

    mean: tuple[float, ...]
    std: tuple[float, ...]


INCEPTION = Stats((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))  # pixels to [-1, 1]: vit_jax, AugReg, big_vision, HF google/vit-*
IMAGENET = Stats((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # torchvision's and DeiT's ImageNet statistics
NAMED_STATS = {"inception": INCEPTION, "imagenet": IMAGENET}

# PIL's resampling enum values, as transformers' preprocessor_config.json stores them ("resample": 2).
_PIL_RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}


class PreprocessWarning(UserWarning):
    """The preprocessing a model needs is unknown and a default is used."""


@dataclass(frozen=True)
class Preprocess:
    """How an image becomes the model's input at evaluation.

    Attributes:
        img_size: What the model is fed, side or (H, W).
        mean: Per channel, on [0, 1] pixels.
        std: Per channel, on [0, 1] pixels.
        resize: "resize": squash the image to img_size / crop_fraction ignoring its aspect ratio, then centre-crop
            img_size (with crop_fraction 1, the whole image squashed: vit_jax, HF google/vit-*; below 1, timm's
            crop_mode "squash" and transformers' DeiT processor); "center_crop": shorter side to
            floor(side / crop_fraction), aspect ratio kept, then centre-crop img_size (torchvision, timm's default).
        crop_fraction: timm's crop_pct: the crop's share of the resized image, in (0, 1].
        interpolation: "bilinear" | "bicubic" | "nearest" (antialiased when shrinking, as PIL resizes).
        channels: "rgb"; "grey" (one channel); "grey_to_rgb" (the greyscale image repeated to 3 channels).
        source: Where these facts came from, e.g. "vit_jax convention", "preprocessor_config.json".
    """

    img_size: int | tuple[int, int]
    mean: tuple[float, ...] = INCEPTION.mean
    std: tuple[float, ...] = INCEPTION.std
    resize: str = "resize"
    crop_fraction: float = 1.0
    interpolation: str = "bilinear"
    channels: str = "rgb"
    source: str = ""

    def __post_init__(self) -> None:
        # normalise what JSON / YAML give (lists, ints) so equal facts compare equal
        h, w = to_hw(self.img_size, "preprocess.img_size")
        object.__setattr__(self, "img_size", h if h == w else (h, w))
        for name in ("mean", "std"):
            value = getattr(self, name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                value = (value,)
            if not isinstance(value, list | tuple) or not value or not all(_is_num(v) for v in value):
                raise ValueError(f"preprocess.{name} must be a list of finite numbers (one per channel), got "
                                 f"{value!r}")
            object.__setattr__(self, name, tuple(float(v) for v in value))
        if _is_num(self.crop_fraction):
            object.__setattr__(self, "crop_fraction", float(self.crop_fraction))
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        if min(self.hw) <= 0:
            raise ValueError(f"preprocess.img_size must be positive, got {self.img_size!r}")
        if len(self.mean) != len(self.std):
            raise ValueError(f"preprocess.mean and preprocess.std differ in length: {self.mean} vs {self.std}")
        if any(s <= 0 for s in self.std):
            raise ValueError(f"preprocess.std must be positive, got {self.std}")
        if self.resize not in RESIZE_MODES:
            raise ValueError(f"preprocess.resize must be one of {RESIZE_MODES}, got {self.resize!r}")
        if not _is_num(self.crop_fraction) or not 0.0 < self.crop_fraction <= 1.0:
            raise ValueError(f"preprocess.crop_fraction must be in (0, 1], got {self.crop_fraction!r}")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"preprocess.interpolation must be one of {INTERPOLATIONS}, got {self.interpolation!r}")
        if self.channels not in CHANNELS:
            raise ValueError(f"preprocess.channels must be one of {CHANNELS}, got {self.channels!r}")
        want = 1 if self.channels == "grey" else 3
        if len(self.mean) != want:
            raise ValueError(f"preprocess.mean has {len(self.mean)} value(s) but channels={self.channels!r} "
                             f"gives {want}")
        if not isinstance(self.source, str):
            raise ValueError(f"preprocess.source must be a string, got {self.source!r}")

    @property
    def hw(self) -> tuple[int, int]:
        """img_size as (H, W)."""
        return to_hw(self.img_size)

    @property
    def in_chans(self) -> int:
        """Channels of the model input."""
        return 1 if self.channels == "grey" else 3

    @property
    def resize_size(self) -> tuple[int, int]:
        """(H, W) of the image before the centre crop: floor(side / crop_fraction), as timm computes it.

        For resize="center_crop" only the shorter side of the image goes to min(resize_size)."""
        return tuple(math.floor(s / self.crop_fraction + 1e-6) for s in self.hw)  # type: ignore[return-value]

    @property
    def normalize(self) -> str | None:
        """"inception" / "imagenet" when mean and std are one of the named statistics (3 channels, or their
        channel average for one), else None."""
        for name, stats in NAMED_STATS.items():
            if _close(self.mean, _stats_for(stats, self.in_chans).mean) and \
                    _close(self.std, _stats_for(stats, self.in_chans).std):
                return name
        return None

    def replace(self, **changes: Any) -> Preprocess:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: tuples become lists."""
        d = dataclasses.asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Preprocess:
        """Inverse of to_dict; unknown keys and bad values raise ValueError naming the field."""
        d = check_keys(d, cls, "preprocess")
        if "img_size" not in d:
            raise ValueError("preprocess.img_size is required")
        return cls(**d)

    def describe(self) -> str:
        """One line for logs and `weights show`."""
        h, w = self.hw
        stats = self.normalize or f"mean={list(self.mean)} std={list(self.std)}"
        if self.resize == "resize":
            how = f"squash to {h}x{w}" if self.crop_fraction == 1.0 else \
                f"squash to {self.resize_size[0]}x{self.resize_size[1]}, centre crop {h}x{w}"
        else:
            how = f"shorter side to {min(self.resize_size)}, centre crop {h}x{w}"
        text = f"{how}, {self.interpolation}, {stats}, {self.channels}"
        return f"{text} ({self.source})" if self.source else text


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    """An int or a finite float (a nan mean or an inf std in a weights file would make every prediction nan / 0)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _close(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return len(a) == len(b) and all(abs(x - y) < 1e-6 for x, y in zip(a, b))


def _stats_for(stats: Stats, in_chans: int) -> Stats:
    """One channel takes the average of the three (as the data pipeline does for greyscale datasets)."""
    if in_chans == 1:
        return Stats((sum(stats.mean) / 3,), (sum(stats.std) / 3,))
    return stats


def from_stats(name: str, img_size: int | tuple[int, int], in_chans: int = 3, **fields: Any) -> Preprocess:
    """A Preprocess with named statistics ("inception" | "imagenet"), adapted to one channel when in_chans=1."""
    if name not in NAMED_STATS:
        raise ValueError(f"normalize must be one of {tuple(NAMED_STATS)}, got {name!r}")
    stats = _stats_for(NAMED_STATS[name], in_chans)
    fields.setdefault("channels", "grey" if in_chans == 1 else "rgb")
    return Preprocess(img_size, stats.mean, stats.std, **fields)


# --- each source's convention -------------------------------------------------------------------------------

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


# Processors that read `size: 224` as the shorter side (transformers' default_to_square=False), not a square.
_SHORTEST_EDGE_INT = ("CLIPImageProcessor", "CLIPFeatureExtractor", "ChineseCLIPImageProcessor", "BitImageProcessor")


def _hf_size(size: Any, what: str) -> dict[str, int]:
    if _is_int(size):
        return {"height": size, "width": size}
    if isinstance(size, Mapping) and ("shortest_edge" in size or {"height", "width"} <= set(size)):
        return dict(size)
    raise ValueError(f"{what} must be an int, {{'height', 'width'}} or {{'shortest_edge'}}, got {size!r}")


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


def from_data_config(data: Any, img_size: int | tuple[int, int], in_chans: int) -> Preprocess:
    """A recipe's `data:` section (DataConfig: normalize, eval_resize, eval_crop_fraction, expand_channels) ->
    the Preprocess its evaluation applies."""
    center = data.eval_resize == "center_crop"
    channels = "grey" if in_chans == 1 else ("grey_to_rgb" if data.expand_channels else "rgb")
    return from_stats(data.normalize, img_size, in_chans, resize=data.eval_resize,
                      crop_fraction=data.eval_crop_fraction if center else 1.0, channels=channels,
                      source="recipe data section")


def data_config_fields(p: Preprocess) -> dict[str, Any]:
    """The DataConfig fields that express `p` (normalize, eval_resize, eval_crop_fraction).

    Raises:
        ValueError: `p`'s statistics are neither inception nor imagenet (DataConfig names only those two).
    """
    if p.normalize is None:
        raise ValueError(f"preprocessing {p.describe()} uses statistics a recipe's data.normalize cannot name "
                         f"(inception or imagenet)")
    return {"normalize": p.normalize, "eval_resize": p.resize, "eval_crop_fraction": p.crop_fraction}


# --- the resolver -------------------------------------------------------------------------------------------

_warned: set[str] = set()


def default(img_size: int | tuple[int, int], in_chans: int = 3) -> Preprocess:
    """What vitlab assumed before preprocessing travelled with the weights: [-1, 1], whole image, bilinear."""
    return from_stats("inception", img_size, in_chans, source="default (unknown)")


def resolve(
    own: Preprocess | Mapping[str, Any] | None,
    *,
    img_size: int | tuple[int, int] | None = None,
    in_chans: int | None = None,
    overrides: Preprocess | Mapping[str, Any] | None = None,
    what: str = "the model",
) -> Preprocess:
    """The preprocessing to use: explicit `overrides` > the checkpoint's `own` > a default, with one warning.

    Args:
        own: What the checkpoint carries (`model.preprocess`, `Checkpoint.preprocess`), or None when unknown.
        img_size: The model's input size; replaces the stored one (a model fine-tuned at a higher resolution
            keeps its statistics, crop fraction and interpolation).
        in_chans: The model's input channels; a one-channel model gets "grey" (statistics averaged).
        overrides: A whole Preprocess, or some of its fields (from the CLI or a recipe); these win.
        what: How to name the model in the warning.
    """
    if isinstance(overrides, Preprocess):
        return overrides
    overrides = dict(overrides or {})
    if isinstance(own, Mapping):
        own = Preprocess.from_dict(own)
    if own is None:
        size = img_size if img_size is not None else overrides.get("img_size")
        if size is None:
            raise ValueError("resolve needs img_size when the preprocessing is unknown")
        own = default(size, in_chans or 3)
        if "mean" not in overrides and what not in _warned:  # the statistics matter most; say they are a guess
            _warned.add(what)
            warnings.warn(
                f"{what} carries no preprocessing (mean/std, resize, interpolation); using the default: "
                f"{own.describe()}. Pass it explicitly if the weights expect otherwise.",
                PreprocessWarning, stacklevel=2)
    if img_size is not None and "img_size" not in overrides:
        own = own.replace(img_size=tuple(img_size) if isinstance(img_size, list) else img_size)
    if in_chans == 1 and own.channels != "grey" and "channels" not in overrides:
        stats = Stats(own.mean, own.std)
        own = own.replace(channels="grey", mean=_stats_for(stats, 1).mean, std=_stats_for(stats, 1).std)
    elif in_chans == 3 and own.channels == "grey" and "channels" not in overrides:
        own = own.replace(channels="grey_to_rgb", mean=own.mean * 3, std=own.std * 3)
    return own.replace(**overrides) if overrides else own


def cli_overrides(*, normalize: str | None = None, resize: str | None = None, crop_fraction: float | None = None,
                  interpolation: str | None = None, in_chans: int = 3) -> dict[str, Any]:
    """Preprocess fields from command-line flags (only those given). A crop fraction without a resize mode means
    "center_crop", as `vitlab eval --crop-fraction` always has; "resize" alone squashes the whole image."""
    out: dict[str, Any] = {}
    if normalize is not None:
        stats = _stats_for(NAMED_STATS[normalize], in_chans) if normalize in NAMED_STATS else None
        if stats is None:
            raise ValueError(f"--normalize must be one of {tuple(NAMED_STATS)}, got {normalize!r}")
        out.update(mean=stats.mean, std=stats.std)
    if crop_fraction is not None:
        if not _is_num(crop_fraction) or not 0.0 < crop_fraction <= 1.0:
            raise ValueError(f"--crop-fraction (data.eval_crop_fraction) must be in (0, 1], got {crop_fraction!r}")
        out.update(crop_fraction=crop_fraction, resize=resize or "center_crop")
    elif resize is not None:
        out.update(resize=resize)
        if resize == "resize":
            out.update(crop_fraction=1.0)
    if interpolation is not None:
        out.update(interpolation=interpolation)
    return out


def add_cli_arguments(parser: Any, *, normalize: bool = True) -> None:
    """--normalize / --resize / --crop-fraction / --interpolation, shared by predict, eval, analyze, fewshot."""
    if normalize:
        parser.add_argument("--normalize", choices=tuple(NAMED_STATS), default=None,
                            help="pixel statistics: inception ([-1, 1]) or imagenet (mean/std); default: the "
                                 "checkpoint's own preprocessing")
    parser.add_argument("--resize", "--eval-resize", choices=RESIZE_MODES, default=None, dest="pp_resize",
                        help="resize: squash the whole image to the model's size; center_crop: shorter side to "
                             "size / --crop-fraction, keep the centre. Default: the checkpoint's own")
    parser.add_argument("--crop-fraction", type=float, default=None,
                        help="share of the resized image kept by the centre crop, in (0, 1]; implies "
                             "--resize center_crop unless --resize says otherwise")
    parser.add_argument("--interpolation", choices=INTERPOLATIONS, default=None,
                        help="resampling filter; default: the checkpoint's own")


def data_overrides(p: Preprocess) -> dict[str, Any]:
    """DataConfig fields that make a dataset's eval pipeline apply `p` (normalize, eval_resize, eval_crop_fraction,
    expand_channels). The dataset pipelines resize bilinearly whatever `p.interpolation` says, and squash without
    the crop for resize="resize"; `transforms_for` is exact."""
    return {**data_config_fields(p), "expand_channels": p.in_chans == 3}
