"""Smaller datasets from a bigger one: a subset of the classes (relabelled), a random N-image training subset and
K labelled images per class. Both subsets are nested: for a fixed seed, the 1,000-image subset is the first 1,000
of the 3,000-image one, and the 5-per-class images are among the 10-per-class ones, so a curve over the size
compares growing datasets, not different draws.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .arrays import ArrayDataset
from .errors import DataError


def select_classes(data: ArrayDataset, classes: Sequence[int], what: str) -> ArrayDataset:
    """Keep the images of `classes` only, relabelled 0..k-1 in the order given (class names follow).

    Raises:
        DataError: A class index the dataset does not have.
    """
    n = len(data.classes)
    bad = [c for c in classes if not 0 <= c < n]
    if bad:
        raise DataError(what, f"data.classes {list(classes)} names classes {bad} but the dataset has classes "
                              f"0..{n - 1}")
    lookup = np.full(n, -1, dtype=np.int64)
    lookup[np.asarray(classes, dtype=np.int64)] = np.arange(len(classes))
    new = lookup[data.labels]
    keep = np.flatnonzero(new >= 0)
    return ArrayDataset(data.images[keep], new[keep], [data.classes[c] for c in classes])


def _class_orders(labels: np.ndarray, seed: int, salt: int) -> dict[int, np.ndarray]:
    """Every class's indices in a random order fixed by (seed, salt)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, salt]))
    return {int(c): rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)}


def nested_order(labels: np.ndarray, seed: int) -> np.ndarray:
    """All indices in a random order whose every prefix holds the classes in about their proportions.

    Each class's images are shuffled; the j-th image of a class with n_c images gets the key (j + u) / n_c
    (u uniform in [0, 1), one per class), and the indices are sorted by key: a prefix of length N then holds
    N * n_c / n images of class c, give or take one (a stratified, nested draw).
    """
    labels = np.asarray(labels)
    orders = _class_orders(labels, seed, 0x5B5E7)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x0FF5E7]))
    idx, keys = [], []
    for c, order in orders.items():
        del c
        idx.append(order)
        keys.append((np.arange(len(order)) + rng.random()) / len(order))
    if not idx:
        return np.zeros(0, dtype=np.int64)
    all_idx, all_keys = np.concatenate(idx), np.concatenate(keys)
    return all_idx[np.argsort(all_keys, kind="stable")]


def train_subset(labels: np.ndarray, n: int, seed: int, what: str) -> np.ndarray:
    """The first `n` indices of `nested_order(labels, seed)`, sorted.

    Raises:
        DataError: `n` is larger than the split.
    """
    if n > len(labels):
        raise DataError(what, f"data.train_subset={n} but the training split has only {len(labels)} images")
    return np.sort(nested_order(labels, seed)[:n])


def labels_per_class(labels: np.ndarray, k: int, seed: int, what: str) -> np.ndarray:
    """`k` indices of every class (the first k of that class's fixed random order), sorted.

    Raises:
        DataError: A class has fewer than `k` images.
    """
    orders = _class_orders(np.asarray(labels), seed, 0x1AB3)
    short = {c: len(o) for c, o in orders.items() if len(o) < k}
    if short:
        raise DataError(what, f"data.labels_per_class={k} but classes {sorted(short)} have only "
                              f"{min(short.values())} training images")
    if not orders:
        return np.zeros(0, dtype=np.int64)
    return np.sort(np.concatenate([o[:k] for o in orders.values()]))
