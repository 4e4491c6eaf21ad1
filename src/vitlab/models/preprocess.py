"""What a checkpoint expects its pixels to look like, as data that travels with the weights.

A ViT is only right on inputs prepared the way it was trained: Google's vit_jax / AugReg models see pixels mapped
to [-1, 1] and the whole image squashed to the input size; torchvision's and DeiT's see ImageNet mean/std after a
shorter-side resize and a centre crop. `Preprocess` holds those facts; every reader fills one from its source's
files or convention (`vitlab.weights.checkpoint`, `vitlab.weights.preprocess_files`), `save_weights` stores it in
the `.safetensors` header, and `resolve` picks the one to use: an explicit override, else the checkpoint's own,
else a default with one warning. `vitlab.data.transforms_for` turns it into the eval transform;
`vitlab.data.preprocess` relates it to a recipe's data section.

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
        overrides: A whole Preprocess, or some of its fields (from the CLI or a recipe); these win. Three-channel
            statistics for a one-channel model are averaged, as the model's own are.
        what: How to name the model in the warning.

    Raises:
        ValueError: An override that is no Preprocess field (the message lists the valid ones), or a bad value.
    """
    if isinstance(overrides, Preprocess):
        return overrides
    overrides = check_keys(overrides or {}, Preprocess, "preprocess", "field")
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
    if overrides.get("channels", own.channels) == "grey":  # e.g. ImageNet's mean/std for a greyscale model
        overrides.update({k: (sum(v) / 3,) for k, v in overrides.items()
                          if k in ("mean", "std") and isinstance(v, list | tuple) and len(v) == 3})
    return own.replace(**overrides) if overrides else own
