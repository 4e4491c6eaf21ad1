"""Between a `vitlab.models.preprocess.Preprocess` and the named options of a recipe's data section (`DataConfig`:
normalize "inception" | "imagenet", eval_resize, eval_crop_fraction), and the `preprocess=` argument of the library
functions that run a checkpoint on images (`evaluate_checkpoint`, `predict`, `analysis_preprocess`).

    pre = from_data_config(data_cfg, img_size=224, in_chans=3)     # what a recipe's eval pipeline applies
    data_cfg = data_cfg.replace(**data_overrides(pre))             # a dataset pipeline that applies `pre`
    named_overrides(normalize="imagenet", crop_fraction=0.875)     # {"mean", "std", "crop_fraction", "resize"}
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

from ..models.config import check_keys
from ..models.preprocess import NAMED_STATS, Preprocess, from_stats

__all__ = ["data_config_fields", "data_overrides", "from_data_config", "named_overrides", "preprocess_arg"]


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


def data_overrides(p: Preprocess) -> dict[str, Any]:
    """DataConfig fields that make a dataset's eval pipeline apply `p` (normalize, eval_resize, eval_crop_fraction,
    expand_channels). The dataset pipelines resize bilinearly whatever `p.interpolation` says, and squash without
    the crop for resize="resize"; `transforms_for` is exact."""
    return {**data_config_fields(p), "expand_channels": p.in_chans == 3}


def named_overrides(*, normalize: str | None = None, resize: str | None = None, crop_fraction: float | None = None,
                    interpolation: str | None = None) -> dict[str, Any]:
    """Preprocess fields from the named options (only those given), as `vitlab eval --crop-fraction` and the old
    keyword arguments always meant them: a crop fraction without a resize mode means "center_crop"; "resize"
    alone squashes the whole image. The statistics are the 3-channel ones; `resolve` averages them for a
    one-channel model."""
    out: dict[str, Any] = {}
    if normalize is not None:
        if normalize not in NAMED_STATS:
            raise ValueError(f"--normalize must be one of {tuple(NAMED_STATS)}, got {normalize!r}")
        out.update(mean=NAMED_STATS[normalize].mean, std=NAMED_STATS[normalize].std)
    if crop_fraction is not None:
        if isinstance(crop_fraction, bool) or not isinstance(crop_fraction, int | float) \
                or not math.isfinite(crop_fraction) or not 0.0 < crop_fraction <= 1.0:
            raise ValueError(f"--crop-fraction (data.eval_crop_fraction) must be in (0, 1], got {crop_fraction!r}")
        out.update(crop_fraction=crop_fraction, resize=resize or "center_crop")
    elif resize is not None:
        out.update(resize=resize, **({"crop_fraction": 1.0} if resize == "resize" else {}))
    if interpolation is not None:
        out.update(interpolation=interpolation)
    return out


def preprocess_arg(preprocess: Preprocess | Mapping[str, Any] | str | None, deprecated: Mapping[str, Any],
                   where: str, *, resize_name: str = "resize") -> Preprocess | dict[str, Any]:
    """A library function's `preprocess=` argument, checked: a whole Preprocess, or a dict of Preprocess fields
    that win over the checkpoint's own (empty: the checkpoint's own).

    `deprecated` holds the keyword arguments `where` took before `preprocess=` (normalize, `resize_name`,
    crop_fraction, interpolation); given, they become the same fields (`named_overrides`) after a
    DeprecationWarning naming `preprocess=`. A string in place of `preprocess` is the old positional `normalize`.

    Raises:
        TypeError: An unknown keyword argument; `preprocess` and a deprecated argument both given; `preprocess`
            of another type.
        ValueError: A key of the mapping that is no Preprocess field (the message lists the valid ones), or a
            bad deprecated value.
    """
    if isinstance(preprocess, str):  # predict(checkpoint, images, top_k, "imagenet"): the old 4th positional
        deprecated, preprocess = {"normalize": preprocess, **deprecated}, None
    names = ("normalize", resize_name, "crop_fraction", "interpolation")
    unknown = [k for k in deprecated if k not in names]
    if unknown:
        raise TypeError(f"{where}() got an unexpected keyword argument {unknown[0]!r}")
    given = {k: v for k, v in deprecated.items() if v is not None}
    if given:
        if preprocess is not None:
            raise TypeError(f"{where}(): give preprocess= or the deprecated {', '.join(given)}, not both")
        fields = named_overrides(normalize=given.get("normalize"), resize=given.get(resize_name),
                                 crop_fraction=given.get("crop_fraction"), interpolation=given.get("interpolation"))
        warnings.warn(f"{where}({'=, '.join(given)}=) is deprecated: pass preprocess= (a Preprocess, or a mapping of "
                      f"its fields), here preprocess={fields!r}", DeprecationWarning, stacklevel=3)
        return fields
    if preprocess is None:
        return {}
    if isinstance(preprocess, Preprocess):
        return preprocess
    if not isinstance(preprocess, Mapping):
        raise TypeError(f"{where}(): preprocess must be a Preprocess, a mapping of its fields or None, got "
                        f"{type(preprocess).__name__}")
    return check_keys(preprocess, Preprocess, "preprocess", "field")
