"""`build_train_stream` / `build_eval_data`: a DataConfig -> batches, whatever the source; `first_images`: a fixed
set of real images (calibration, export checks)."""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from ..utils.extras import needs
from .arrays import ArrayDataset, stratified_holdout
from .cifar import load_cifar
from .config import FASHION_MNIST_ROOT, DataConfig
from .digits import load_digits_split
from .folder import build_folder_eval_data, build_folder_train_stream
from .idx import FASHION_MNIST_CLASSES, MNIST_CLASSES, load_mnist_like
from .stream import ArrayEvalData, ArrayTrainStream, EvalData, TrainStream
from .subsets import labels_per_class, select_classes, train_subset
from .synthetic import load_synthetic

SPLITS = ("train", "val", "test")
ARRAY_DATASETS = ("fashion_mnist", "mnist", "cifar10", "cifar100", "synthetic", "digits")


def _load_array_split(cfg: DataConfig, split: str) -> ArrayDataset:
    """The whole "train" or "test" file set of an in-memory dataset (read once per process, then shared)."""
    if cfg.dataset == "synthetic":  # generated, no files
        return load_synthetic(split, cfg.num_samples)
    if cfg.dataset == "digits":  # scikit-learn's bundled file
        return load_digits_split(split)
    root = os.path.abspath(cfg.root or FASHION_MNIST_ROOT)
    if not os.path.exists(root):
        hint = (" (install Debian's dataset-fashion-mnist, e.g. `make dataset`, or set data.root to a folder with "
                "the four IDX files)") if cfg.dataset == "fashion_mnist" else ""
        raise FileNotFoundError(f"data.root {root!r} does not exist (dataset {cfg.dataset!r}){hint}")
    stamp = tuple((e.name, e.stat().st_mtime_ns, e.stat().st_size) for e in os.scandir(root) if e.is_file())
    return _load_cached(cfg.dataset, root, split, stamp)


@functools.lru_cache(maxsize=4)
def _load_cached(dataset: str, root: str, split: str, stamp: tuple) -> ArrayDataset:
    del stamp  # part of the cache key only: a changed file reloads
    if dataset in ("fashion_mnist", "mnist"):
        classes = FASHION_MNIST_CLASSES if dataset == "fashion_mnist" else MNIST_CLASSES
        data = load_mnist_like(root, split, classes)
    else:
        data = load_cifar(root, dataset, split)
    return data


def _label_space(data: ArrayDataset, cfg: DataConfig) -> ArrayDataset:
    if cfg.classes is not None:
        data = select_classes(data, cfg.classes, cfg.dataset)
    if cfg.class_names is None:
        return data
    if len(cfg.class_names) != len(data.classes):
        raise ValueError(f"data.class_names has {len(cfg.class_names)} names; the dataset has "
                         f"{len(data.classes)} classes")
    return ArrayDataset(data.images, data.labels, list(cfg.class_names))


def _array_split(cfg: DataConfig, split: str) -> tuple[ArrayDataset, dict[str, Any]]:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if split == "val" and cfg.val_fraction <= 0:
        raise ValueError("split 'val' is the hold-out part of train; set data.val_fraction > 0 (e.g. 0.02)")
    if split == "test":
        data = _label_space(_load_array_split(cfg, "test"), cfg)
        return data, {"dataset": cfg.dataset, "split": "test", "samples": len(data), "num_skipped": 0, "skipped": []}
    full = _label_space(_load_array_split(cfg, "train"), cfg)
    train_idx, val_idx = stratified_holdout(full.labels, cfg.val_fraction, cfg.val_seed)
    report: dict[str, Any] = {"train_samples": len(train_idx), "val_samples": len(val_idx)}
    if split == "train" and (cfg.train_subset is not None or cfg.labels_per_class is not None):
        what = f"{cfg.dataset} training split"
        labels = full.labels[train_idx]
        if cfg.train_subset is not None:
            pick = train_subset(labels, cfg.train_subset, cfg.subset_seed, what)
            report["train_subset"] = cfg.train_subset
        else:
            pick = labels_per_class(labels, int(cfg.labels_per_class or 0), cfg.subset_seed, what)
            report["labels_per_class"] = cfg.labels_per_class
        train_idx = train_idx[pick]
        report["subset_seed"] = cfg.subset_seed
    data = full.subset(train_idx if split == "train" else val_idx)
    report = {"dataset": cfg.dataset, "split": split, "samples": len(data), **report, "num_skipped": 0,
              "skipped": []}  # IDX/CIFAR files are all-or-nothing
    return data, report


def build_train_stream(
    cfg: DataConfig,
    *,
    img_size: int | tuple[int, int],
    in_chans: int,
    batch_size: int,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
) -> TrainStream:
    """The endless, resumable training stream of `cfg` (see `TrainStream`); batch_size is per process.

    With world_size > 1, rank r's batch at step t is the r-th slice of the single-process batch of size
    batch_size * world_size at step t, augmentation included (exact for every dataset but webdataset,
    which splits by shard).
    """
    common = dict(batch_size=batch_size, seed=seed, rank=rank, world_size=world_size)
    if cfg.dataset in ARRAY_DATASETS:
        data, report = _array_split(cfg, "train")
        return ArrayTrainStream(data, cfg, img_size=img_size, in_chans=in_chans, name=cfg.dataset, report=report,
                                **common)
    if cfg.dataset == "imagefolder":
        return build_folder_train_stream(cfg, img_size=img_size, in_chans=in_chans, **common)
    with needs("data", "data.dataset: webdataset"):
        from .webds import WebDatasetTrainStream

    return WebDatasetTrainStream(cfg, img_size=img_size, in_chans=in_chans, **common)


def build_eval_data(
    cfg: DataConfig, split: str, *, img_size: int | tuple[int, int], in_chans: int, batch_size: int
) -> EvalData:
    """Deterministic batches of `split`: "val" (held out from train; needs val_fraction > 0), "test", or
    "train" (the training part, unaugmented, e.g. for few-shot features)."""
    if cfg.dataset in ARRAY_DATASETS:
        data, report = _array_split(cfg, split)
        return ArrayEvalData(data, cfg, name=f"{cfg.dataset}/{split}", img_size=img_size, in_chans=in_chans,
                             batch_size=batch_size, report=report)
    if cfg.dataset == "imagefolder":
        return build_folder_eval_data(cfg, split, img_size=img_size, in_chans=in_chans, batch_size=batch_size)
    with needs("data", "data.dataset: webdataset"):
        from .webds import WebDatasetEvalData

    return WebDatasetEvalData(cfg, split, img_size=img_size, in_chans=in_chans, batch_size=batch_size)


def first_images(cfg: DataConfig, split: str, n: int, *, img_size: int | tuple[int, int], in_chans: int
                 ) -> torch.Tensor | None:
    """The first `n` preprocessed images of `split` (fewer if it holds fewer) as one float tensor (n, C, H, W),
    None if it holds none: the fixed real images that calibrate and check an int8 or exported model."""
    batches, got = [], 0
    for batch in build_eval_data(cfg, split, img_size=img_size, in_chans=in_chans, batch_size=min(n, 256)):
        batches.append(batch[0][: n - got])
        got += len(batches[-1])
        if got >= n:
            break
    return torch.cat(batches).float() if batches else None
