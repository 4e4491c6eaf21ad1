"""`ArrayDataset`: a small dataset held in memory as one uint8 array (Fashion-MNIST, MNIST, CIFAR)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class ArrayDataset:
    """Images uint8 (N, C, H, W), labels int64 (N,), and the class names."""

    images: np.ndarray
    labels: np.ndarray
    classes: list[str]

    def __post_init__(self) -> None:
        self.images = np.ascontiguousarray(self.images)
        if self.images.dtype != np.uint8 or self.images.ndim != 4:
            raise ValueError(f"ArrayDataset images must be uint8 (N, C, H, W), got {self.images.dtype} "
                             f"{self.images.shape}")
        if len(self.images) != len(self.labels):
            raise ValueError(f"{len(self.images)} images but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.images)

    def subset(self, indices: np.ndarray) -> ArrayDataset:
        return ArrayDataset(self.images[indices], self.labels[indices], self.classes)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(images uint8 (N, C, H, W), labels int64 (N,)) as torch tensors sharing memory where possible."""
        return torch.from_numpy(self.images), torch.from_numpy(self.labels.astype(np.int64, copy=False))


def stratified_holdout(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split indices into (train, val), holding out `fraction` of every class, fixed by `seed`.

    Each class c with n_c samples gives round(fraction * n_c) of them (at least one when fraction > 0 and
    n_c > 1) to val. Both index arrays come back sorted.
    """
    labels = np.asarray(labels)
    if fraction <= 0:
        return np.arange(len(labels)), np.zeros(0, dtype=np.int64)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5EED]))
    val = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        k = round(fraction * len(idx))
        if k == 0 and len(idx) > 1:
            k = 1
        val.append(rng.permutation(idx)[:k])
    val_idx = np.sort(np.concatenate(val)) if val else np.zeros(0, dtype=np.int64)
    mask = np.ones(len(labels), dtype=bool)
    mask[val_idx] = False
    return np.flatnonzero(mask), val_idx
