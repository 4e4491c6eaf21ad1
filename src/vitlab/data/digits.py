"""`digits`: scikit-learn's copy of the UCI optical-recognition handwritten digits, as an in-memory dataset.

1,797 real 8x8 digits written by 43 people, 16 grey levels (0..16), ten classes. scikit-learn ships the file
inside its wheel, so the dataset installs offline with the `paper` extra. There is no official train/test split;
vitlab fixes one: a stratified 500-image test set drawn with a constant seed (so every run and every machine
sees the same split), the other 1,297 images for training. The pixels are scaled to uint8 0..255 (level * 255 / 16,
rounded); the usual resize in the input pipeline upsamples them to the model's img_size.
"""

from __future__ import annotations

import functools

import numpy as np

from ..utils.extras import needs
from .arrays import ArrayDataset

DIGITS_CLASSES = tuple(str(i) for i in range(10))
DIGITS_TEST_SIZE = 500
DIGITS_SPLITS = ("train", "test")
_SPLIT_SEED = 0xD161  # the fixed train/test split; not a training seed


def _test_indices(labels: np.ndarray, test_size: int, seed: int) -> np.ndarray:
    """A stratified draw of `test_size` indices (sorted): each class gives its share, rounded by largest remainder."""
    rng = np.random.default_rng(np.random.SeedSequence([seed]))
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * test_size / len(labels)
    take = np.floor(exact).astype(np.int64)
    for i in np.argsort(-(exact - take), kind="stable")[: test_size - int(take.sum())]:
        take[i] += 1
    picked = [rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in zip(classes, take)]
    return np.sort(np.concatenate(picked))


@functools.lru_cache(maxsize=2)
def load_digits_split(split: str) -> ArrayDataset:
    """The "train" (1,297 images) or "test" (500) split.

    Returns:
        Images uint8 (N, 1, 8, 8) in 0..255 and labels int64 (N,) in 0..9.

    Raises:
        ValueError: An unknown split.
        MissingExtraError: scikit-learn is not installed (`pip install 'vitlab[paper]'`).
    """
    if split not in DIGITS_SPLITS:
        raise ValueError(f"digits split must be one of {DIGITS_SPLITS}, got {split!r}")
    with needs("paper", "data.dataset: digits"):
        from sklearn.datasets import load_digits

    bunch = load_digits()
    levels = np.asarray(bunch.images, dtype=np.float64)  # (1797, 8, 8), 0..16
    images = np.rint(levels * (255 / 16)).clip(0, 255).astype(np.uint8)[:, None]  # (N, 1, 8, 8)
    labels = np.asarray(bunch.target, dtype=np.int64)
    test = _test_indices(labels, DIGITS_TEST_SIZE, _SPLIT_SEED)
    mask = np.zeros(len(labels), dtype=bool)
    mask[test] = True
    idx = test if split == "test" else np.flatnonzero(~mask)
    return ArrayDataset(images[idx], labels[idx], list(DIGITS_CLASSES))
