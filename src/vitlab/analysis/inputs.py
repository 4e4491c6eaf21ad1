"""What the analyses run on: a checkpoint as a model in eval mode, images from files or a dataset prepared the way
the checkpoint expects, and frozen features of a dataset split. `vitlab analyze` and `vitlab fewshot` are these
calls plus argument parsing.

    model = load_checkpoint("run/model.safetensors", "cpu")
    size = check_image_size(model, 384)                               # a multiple of the pixels per token
    pre = analysis_preprocess(model, "run/model.safetensors", size)
    x = load_inputs(model, pre, images=["cat.jpg", "photos/"])        # (n, C, H, W)

Every function raises (FileNotFoundError, ValueError, `vitlab.weights.WeightsError`) with a message that names the
file or value; none prints or exits.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .. import data as vdata
from ..data import parse_data_spec, preprocess_of
from ..data.preprocess import data_overrides, preprocess_arg
from ..models.config import to_hw
from ..utils.progress import progress_bar
from ..weights import load_model
from .fewshot import extract_features

if TYPE_CHECKING:
    from ..models.preprocess import Preprocess
    from ..models.vit import VisionTransformer

__all__ = [
    "IMAGE_SUFFIXES",
    "analysis_preprocess",
    "check_image_size",
    "expand_image_paths",
    "load_checkpoint",
    "load_inputs",
    "split_features",
]

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}


def load_checkpoint(path: str | Path, device: torch.device | str = "cpu") -> VisionTransformer:
    """`vitlab.load_model(path)` on `device`, in eval mode.

    Raises:
        FileNotFoundError: No checkpoint at `path`.
        vitlab.weights.WeightsError: The file is not a checkpoint vitlab reads (the message says why).
    """
    try:
        model = load_model(path)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"checkpoint {path} does not exist ({e})") from None
    return model.to(device).eval()


def check_image_size(model: VisionTransformer, size: int | tuple[int, int] | None) -> tuple[int, int]:
    """The (H, W) to analyse at: `size` (N or (H, W)), else the model's own. Learned position embeddings are
    resampled to it.

    Raises:
        ValueError: `size` is not a positive multiple of the pixels per token (the patch size; for a hybrid, the
            ResNet stride times the patch size).
    """
    if size is None:
        return model.cfg.img_hw
    h, w = to_hw(size, "--img-size")
    P = model.cfg.pixel_patch  # a hybrid's token covers ResNet stride x patch_size pixels
    what = f"the hybrid's pixels per token {P} (ResNet stride x patch size)" if model.cfg.hybrid_layers is not None \
        else f"the patch size {P}"
    if h <= 0 or w <= 0 or h % P or w % P:
        raise ValueError(f"--img-size {h}x{w} must be positive multiples of {what}")
    return (h, w)


def analysis_preprocess(model: VisionTransformer, checkpoint: str | Path, size: tuple[int, int], *,
                        preprocess: Preprocess | Mapping[str, Any] | None = None, **deprecated: Any) -> Preprocess:
    """The resolved preprocessing (`vitlab.models.preprocess.resolve`) at the analysed `size`: `preprocess` (a whole
    Preprocess, or some of its fields), else the checkpoint's own, else the default with one warning.

    `deprecated`: the keyword arguments `preprocess` replaces (normalize, resize, crop_fraction (which implied
    "center_crop"), interpolation), still taken with a DeprecationWarning.

    Raises:
        ValueError: A key of `preprocess` that is no Preprocess field, or a bad value.
    """
    overrides = preprocess_arg(preprocess, deprecated, "analysis_preprocess")
    return preprocess_of(model, overrides, what=str(checkpoint), img_size=size)


def expand_image_paths(paths: Sequence[str | Path]) -> list[str]:
    """Files as given; folders replaced by their image files (sorted, not recursive).

    Raises:
        FileNotFoundError: A path does not exist, or a folder holds no image files.
    """
    out: list[str] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(str(f) for f in p.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise FileNotFoundError(f"folder {p} holds no image files ({', '.join(sorted(IMAGE_SUFFIXES))})")
            out += found
        elif p.exists():
            out.append(str(p))
        else:
            raise FileNotFoundError(f"image {p} does not exist")
    return out


def _data_config(data: str, pre: Preprocess) -> Any:
    """The DataConfig of the dataset spec `data` whose eval pipeline applies `pre` (grey data repeated for RGB)."""
    return parse_data_spec(data).replace(**data_overrides(pre))


def load_inputs(model: VisionTransformer, pre: Preprocess, *, images: Sequence[str | Path] | None = None,
                data: str | None = None, split: str = "test", num_images: int = 32) -> torch.Tensor:
    """(n, C, H, W) images prepared by `pre`: the files (or folders of them) in `images`, else the first
    `num_images` of `split` of the dataset spec `data` (e.g. "fashion_mnist", "imagefolder:/path").

    Raises:
        ValueError: Neither or both of `images` and `data`; `num_images` < 1; an empty split.
        FileNotFoundError: An image or the dataset does not exist.
    """
    if (images is None) == (data is None):
        raise ValueError("give exactly one of images= and data=")
    size = pre.img_size
    if images is not None:
        return vdata.load_images(expand_image_paths(images), img_size=size, in_chans=model.cfg.in_chans,
                                 preprocess=pre)
    if num_images < 1:
        raise ValueError(f"--num-images must be at least 1, got {num_images}")
    loader = vdata.build_eval_data(_data_config(str(data), pre), split, img_size=size, in_chans=model.cfg.in_chans,
                                   batch_size=min(num_images, 256))
    batches, n = [], 0
    for batch in loader:
        batches.append(batch[0][: num_images - n])
        n += len(batches[-1])
        if n >= num_images:
            break
    if not batches:
        raise ValueError(f"split {split!r} of {data} has no images")
    return torch.cat(batches)


def split_features(model: VisionTransformer, pre: Preprocess, data: str, split: str, *, batch_size: int = 256,
                   limit: int | None = None, device: torch.device | str | None = None,
                   progress: bool = False) -> tuple[np.ndarray, np.ndarray, int]:
    """Frozen pre-logits features of the first `limit` images (default: all) of `split` of the dataset spec `data`,
    prepared by `pre`: (features (n, F), labels (n,), number of classes). `progress` shows a bar on stderr when it
    is a terminal."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    loader = vdata.build_eval_data(_data_config(data, pre), split, img_size=pre.img_size,
                                   in_chans=model.cfg.in_chans, batch_size=batch_size)

    def limited() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = 0
        for batch in loader:
            images, labels = batch[0], batch[1]
            if limit is not None:
                images, labels = images[: limit - n], labels[: limit - n]
            n += len(images)
            yield images, labels
            if limit is not None and n >= limit:
                return

    total = getattr(loader, "num_samples", None)
    total = min(total, limit) if total is not None and limit is not None else (total or limit)
    with progress_bar(total=total, desc=f"features ({split})", unit="img", enabled=progress) as bar:

        def counted() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            for images, labels in limited():
                yield images, labels
                bar.update(len(images))

        feats, labels = extract_features(model, counted(), device)
    return feats, labels, loader.num_classes
