"""The IDX format of MNIST / Fashion-MNIST, read in memory (gzipped or not).

An IDX file is: two zero bytes, a type byte, a byte giving the number of dimensions d, then d big-endian
uint32 sizes, then the data in big-endian C order (LeCun et al., http://yann.lecun.com/exdb/mnist/).
"""

from __future__ import annotations

import gzip
import os

import numpy as np

from .arrays import ArrayDataset

# type byte -> big-endian dtype
IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip
MNIST_CLASSES = tuple(str(i) for i in range(10))


def read_idx(path: str) -> np.ndarray:
    """Read one IDX file (plain or gzip, told apart by its magic bytes, not its name).

    Raises:
        FileNotFoundError: The file does not exist.
        ValueError: The header is not IDX, or the data is shorter or longer than the header says.
    """
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise ValueError(f"{path}: corrupt gzip stream ({e})") from e
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_DTYPES:
        raise ValueError(f"{path}: not an IDX file (bad magic {raw[:4].hex() or 'empty'})")
    dtype = np.dtype(IDX_DTYPES[raw[2]])
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header ({len(raw)} bytes, {ndim} dimensions declared)")
    shape = tuple(int(s) for s in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    got = len(raw) - header
    if got != expected:
        kind = "truncated" if got < expected else "has trailing bytes"
        raise ValueError(f"{path}: IDX data {kind}: shape {shape} needs {expected} bytes, file has {got}")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def _find(root: str, stem: str) -> str:
    for name in (stem, stem + ".gz"):
        path = os.path.join(root, name)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"{stem}[.gz] not found in {root}")


def load_mnist_like(root: str, split: str, classes: tuple[str, ...]) -> ArrayDataset:
    """Load a split ("train" or "test") of an MNIST-format dataset from `root`.

    Returns:
        Images uint8 (N, 1, 28, 28) and labels int64 (N,).
    """
    if not os.path.isdir(root):
        raise FileNotFoundError(
            f"dataset root {root!r} does not exist (Fashion-MNIST: `apt-get install dataset-fashion-mnist`, "
            "or point data.root at a folder with the four IDX files)"
        )
    prefix = {"train": "train", "test": "t10k"}[split]
    images = read_idx(_find(root, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(_find(root, f"{prefix}-labels-idx1-ubyte"))
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise ValueError(
            f"{root}: {split} images {images.shape} and labels {labels.shape} do not pair up as (N, H, W) / (N,)"
        )
    if labels.size and (labels.min() < 0 or labels.max() >= len(classes)):
        raise ValueError(f"{root}: {split} labels outside [0, {len(classes)})")
    return ArrayDataset(images[:, None], labels.astype(np.int64), list(classes))
