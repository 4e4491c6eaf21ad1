"""Classify image files with a checkpoint: the library side of `vitlab predict`.

    import vitlab
    for r in vitlab.predict("vit_b_16.IMAGENET1K_V1", ["cat.jpg"], top_k=3):
        print(r["image"], [(t["label"], round(t["prob"], 3)) for t in r["top"]])
    for r in iter_predict(checkpoint, many_files):   # the same, one result at a time as each batch is done

Images are decoded, preprocessed and classified `batch_size` at a time (`vitlab.data.image_batches`), so memory
stays flat in the number of files: only one batch of decoded images, its activations and its logits are alive at
once, and what is kept per image is its `top_k` classes.

Images are prepared as the checkpoint says (`vitlab.models.preprocess`: its stored preprocessing, else its format's
convention, else a default with a warning), exactly as `vitlab.data.transforms_for(model)` does; `preprocess=` (a
`Preprocess`, or some of its fields) overrides it. Names come from the checkpoint (`vitlab train`'s "classes", a
transformers or timm config's labels), else ImageNet-1k's for a 1000-class head.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..data import image_batches, preprocess_of
from ..data.labels import class_names
from ..data.preprocess import preprocess_arg
from ..deploy.optimize import MODES, optimize
from ..models.preprocess import Preprocess
from ..perf.allocator import release_freed_memory
from ..weights import hub, load_model, read_metadata

__all__ = ["BATCH_SIZE", "iter_predict", "predict"]

BATCH_SIZE = 16  # images per forward pass: ViT-S/16 fp32 peaks at ~0.9 GB resident at 16, ~1.0 GB at 32


def predict(checkpoint: str | Path, images: Sequence[str | Path], top_k: int = 5,
            preprocess: Preprocess | Mapping[str, Any] | None = None, mode: str = "fp32", *,
            batch_size: int = BATCH_SIZE, **deprecated: Any) -> list[dict[str, Any]]:
    """The `top_k` most likely classes of each image.

    Args:
        checkpoint: Anything `vitlab.load_model` reads: a file, a folder, a registry name, `hf-hub:`, a URL.
        images: Image files (any format PIL opens).
        top_k: Classes reported per image (fewer when the head has fewer).
        preprocess: A whole `Preprocess`, or some of its fields over the checkpoint's own (e.g.
            `{"interpolation": "bicubic"}`); None: the checkpoint's own.
        mode: One of `vitlab.deploy.optimize.MODES`; "fp32" runs the model as loaded.
        batch_size: Images decoded and classified per forward pass (memory grows with it, not with `images`).
        deprecated: The keyword arguments `preprocess` replaces (`normalize`, also the old 4th positional argument,
            `resize`, `crop_fraction` (which implied "center_crop"), `interpolation`): still taken, with a
            DeprecationWarning.

    Returns:
        One dict per image, in order: `{"image": path, "top": [{"label", "index", "prob"}, ...]}`, most likely
        first.

    Raises:
        ValueError: A bad argument (`top_k` or `batch_size` < 1, an unknown mode, a bad preprocessing field or
            value).
        FileNotFoundError: The checkpoint does not exist.
        vitlab.data.BadImageError: An image is missing (before any is classified) or cannot be decoded.
        vitlab.weights.WeightsError: The checkpoint cannot be read.
    """
    overrides = preprocess_arg(preprocess, deprecated, "predict")
    return list(iter_predict(checkpoint, images, top_k, overrides, mode, batch_size=batch_size))


def iter_predict(checkpoint: str | Path, images: Sequence[str | Path], top_k: int = 5,
                 preprocess: Preprocess | Mapping[str, Any] | None = None, mode: str = "fp32", *,
                 batch_size: int = BATCH_SIZE, **deprecated: Any) -> Iterator[dict[str, Any]]:
    """`predict`, one result at a time, in order; each batch of `batch_size` images is decoded and classified when
    its first result is asked for. The arguments are checked, the model loaded and every path checked to exist
    when this is called, before the first result."""
    overrides = preprocess_arg(preprocess, deprecated, "iter_predict")
    if top_k < 1:
        raise ValueError(f"top_k (--top-k) must be >= 1, got {top_k}")
    if batch_size < 1:
        raise ValueError(f"batch_size (--batch-size) must be >= 1, got {batch_size}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    paths = [str(p) for p in images]
    model = load_model(checkpoint)
    meta = dict(read_metadata(checkpoint) or {})
    entry = hub.resolve(checkpoint).entry  # a registry name says its label set ("imagenet-1k", ...)
    if entry is not None and getattr(entry, "labels", None):
        meta.setdefault("labels", entry.labels)
    classes = class_names(meta, model.cfg.num_classes)
    pre = preprocess_of(model, overrides, what=str(checkpoint))
    batches = image_batches(paths, batch_size, img_size=pre.img_size, in_chans=model.cfg.in_chans, preprocess=pre)
    net = optimize(model, mode) if mode != "fp32" else model.eval()
    return _results(net, batches, paths, classes, top_k)


def _results(net: Any, batches: Iterator[torch.Tensor], paths: list[str], classes: Sequence[str],
             top_k: int) -> Iterator[dict[str, Any]]:
    """One result dict per path, a batch at a time; the batch's images and logits are dropped before the next."""
    n = 0
    for x in batches:
        with torch.no_grad():
            probs = net(x).float().softmax(-1)  # (b, classes)
        del x
        top = probs.topk(min(top_k, probs.shape[1]), dim=1)
        values, indices = top.values.tolist(), top.indices.tolist()
        del probs, top
        release_freed_memory()  # the batch's freed blocks back to the kernel: the peak stays that of one batch
        for vals, idxs in zip(values, indices, strict=True):
            yield {"image": paths[n], "top": [{"label": classes[i], "index": int(i), "prob": float(p)}
                                              for p, i in zip(vals, idxs, strict=True)]}
            n += 1
