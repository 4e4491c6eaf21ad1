"""Classify image files with a checkpoint: the library side of `vitlab predict`.

    import vitlab
    for r in vitlab.predict("vit_b_16.IMAGENET1K_V1", ["cat.jpg"], top_k=3):
        print(r["image"], [(t["label"], round(t["prob"], 3)) for t in r["top"]])

Images are prepared as the checkpoint says (`vitlab.models.preprocess`: its stored preprocessing, else its format's
convention, else a default with a warning), exactly as `vitlab.data.transforms_for(model)` does; the keyword
arguments override it. Names come from the checkpoint (`vitlab train`'s "classes", a transformers or timm config's
labels), else ImageNet-1k's for a 1000-class head.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..data import load_images, preprocess_of
from ..data.labels import class_names
from ..deploy.optimize import MODES, optimize
from ..models.preprocess import cli_overrides
from ..weights import hub, load_model, read_metadata

__all__ = ["predict"]


def predict(
    checkpoint: str | Path,
    images: Sequence[str | Path],
    top_k: int = 5,
    normalize: str | None = None,
    mode: str = "fp32",
    *,
    resize: str | None = None,
    crop_fraction: float | None = None,
    interpolation: str | None = None,
) -> list[dict[str, Any]]:
    """The `top_k` most likely classes of each image.

    Args:
        checkpoint: Anything `vitlab.load_model` reads: a file, a folder, a registry name, `hf-hub:`, a URL.
        images: Image files (any format PIL opens).
        top_k: Classes reported per image (fewer when the head has fewer).
        normalize: "inception" or "imagenet" pixel statistics instead of the checkpoint's.
        mode: One of `vitlab.deploy.optimize.MODES`; "fp32" runs the model as loaded.
        resize: "resize" or "center_crop" instead of the checkpoint's resize.
        crop_fraction: Share of the resized image kept by the centre crop, in (0, 1].
        interpolation: "bilinear", "bicubic" or "nearest" instead of the checkpoint's.

    Returns:
        One dict per image, in order: `{"image": path, "top": [{"label", "index", "prob"}, ...]}`, most likely
        first.

    Raises:
        ValueError: A bad argument (`top_k` < 1, an unknown mode or preprocessing value).
        FileNotFoundError: The checkpoint or an image does not exist.
        vitlab.weights.WeightsError: The checkpoint cannot be read.
    """
    if top_k < 1:
        raise ValueError(f"top_k (--top-k) must be >= 1, got {top_k}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    paths = [str(p) for p in images]
    model = load_model(checkpoint)
    meta = dict(read_metadata(checkpoint) or {})
    entry = hub.resolve(checkpoint).entry  # a registry name says its label set ("imagenet-1k", ...)
    if entry is not None and getattr(entry, "labels", None):
        meta.setdefault("labels", entry.labels)
    classes = class_names(meta, model.cfg.num_classes)
    overrides = cli_overrides(normalize=normalize, resize=resize, crop_fraction=crop_fraction,
                              interpolation=interpolation, in_chans=model.cfg.in_chans)
    pre = preprocess_of(model, what=str(checkpoint), **overrides)
    x = load_images(paths, img_size=pre.img_size, in_chans=model.cfg.in_chans, preprocess=pre)
    net = optimize(model, mode) if mode != "fp32" else model.eval()
    with torch.no_grad():
        probs = net(x).float().softmax(-1)  # (B, classes)
    k = min(top_k, probs.shape[1])
    top = probs.topk(k, dim=1)
    return [{"image": path, "top": [{"label": classes[i], "index": int(i), "prob": float(p)}
                                    for p, i in zip(top.values[n].tolist(), top.indices[n].tolist())]}
            for n, path in enumerate(paths)]
