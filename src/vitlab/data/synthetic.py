"""`synthetic`: an in-memory dataset shaped like Fashion-MNIST, generated from a fixed seed.

For tests and smoke runs on machines without a dataset on disk: the same shapes and dtypes as Fashion-MNIST
(uint8 (N, 1, 28, 28) images, int64 labels, 10 classes; 60,000 train / 10,000 test by default, balanced) and
learnable, so a "the loss falls" check means something. Each class has its own smooth prototype pattern; a
sample is its class's prototype at a random contrast and brightness, shifted by up to two pixels, plus pixel
noise. The prototypes are mirror-symmetric, so horizontal flips keep the class. Every call gives the same bytes
on every machine (numpy's PCG64 from fixed seeds).
"""

from __future__ import annotations

import functools

import numpy as np

from .arrays import ArrayDataset

SYNTHETIC_CLASSES = tuple(f"pattern {i}" for i in range(10))
SYNTHETIC_SIZES = {"train": 60_000, "test": 10_000}  # Fashion-MNIST's split sizes
_SEED = 0x5F17  # prototypes; the samples of each split have their own stream


def _prototypes(num_classes: int, size: int = 28) -> np.ndarray:
    """(num_classes, size, size) float32 patterns in [0, 1]: a coarse 7x7 random grid, upsampled bilinearly, the
    same mirrored left to right."""
    rng = np.random.default_rng(np.random.SeedSequence([_SEED, 0]))
    half = (rng.random((num_classes, 7, 4), dtype=np.float32) > 0.5).astype(np.float32)
    # binary blocks: classes differ in where the bright parts are; mirror-symmetric, as most of Fashion-MNIST's
    # classes are, so that the usual random horizontal flips keep an image's class
    coarse = np.concatenate([half, half[:, :, 2::-1]], axis=2)  # (num_classes, 7, 7)
    pos = (np.arange(size, dtype=np.float32) + 0.5) * 7 / size - 0.5  # pixel centres on the coarse grid
    lo = np.clip(np.floor(pos).astype(np.int64), 0, 6)
    hi = np.clip(lo + 1, 0, 6)
    t = np.clip(pos - lo, 0.0, 1.0)
    rows = coarse[:, lo, :] * (1 - t)[None, :, None] + coarse[:, hi, :] * t[None, :, None]
    return rows[:, :, lo] * (1 - t) + rows[:, :, hi] * t


@functools.lru_cache(maxsize=4)
def load_synthetic(split: str, num_samples: int | None = None) -> ArrayDataset:
    """The "train" or "test" split; `num_samples` replaces the train size (test keeps a sixth of it).

    Returns:
        Images uint8 (N, 1, 28, 28) and labels int64 (N,), exactly N // 10 (or N // 10 + 1) per class.
    """
    if split not in SYNTHETIC_SIZES:
        raise ValueError(f"synthetic split must be one of {tuple(SYNTHETIC_SIZES)}, got {split!r}")
    n = SYNTHETIC_SIZES[split] if num_samples is None else (
        num_samples if split == "train" else max(len(SYNTHETIC_CLASSES), num_samples // 6))
    k = len(SYNTHETIC_CLASSES)
    rng = np.random.default_rng(np.random.SeedSequence([_SEED, 1 + list(SYNTHETIC_SIZES).index(split), n]))
    labels = rng.permutation(np.arange(n) % k).astype(np.int64)
    protos = np.pad(_prototypes(k), ((0, 0), (2, 2), (2, 2)))  # room for the +-2 pixel shifts
    shift = rng.integers(0, 25, n)  # (dy, dx) in {0..4}^2
    images = np.empty((n, 28, 28), dtype=np.float32)
    for s in range(25):
        dy, dx = divmod(s, 5)
        idx = np.flatnonzero(shift == s)
        images[idx] = protos[labels[idx], dy : dy + 28, dx : dx + 28]
    contrast = rng.uniform(0.5, 1.0, (n, 1, 1)).astype(np.float32)
    brightness = rng.uniform(0.0, 0.2, (n, 1, 1)).astype(np.float32)
    images = images * contrast + brightness + rng.standard_normal((n, 28, 28), dtype=np.float32) * 0.15
    images = np.clip(np.rint(images * 255), 0, 255).astype(np.uint8)
    return ArrayDataset(images[:, None], labels, list(SYNTHETIC_CLASSES))
