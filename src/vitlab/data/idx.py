"""The IDX format of MNIST / Fashion-MNIST, read in memory (gzipped or not).

An IDX file is: two zero bytes, a type byte, a byte giving the number of dimensions d, then d big-endian
uint32 sizes, then the data in big-endian C order (LeCun et al., http://yann.lecun.com/exdb/mnist/).
"""

from __future__ import annotations

import math
import os
import zlib

import numpy as np

from .arrays import ArrayDataset
from .errors import DataError

# type byte -> big-endian dtype
IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip
MNIST_CLASSES = tuple(str(i) for i in range(10))
MAX_DIMS = 32  # numpy's limit is 64; IDX files in the wild have 1-4
MAX_DEFLATE_RATIO = 1032  # deflate's largest expansion: a bigger declared size cannot be in the file


def read_idx(path: str) -> np.ndarray:
    """Read one IDX file (plain or gzip, told apart by its magic bytes, not its name).

    Declared sizes are checked against the file's length before anything is allocated, and a gzip stream is
    inflated only up to the size its header declares (so a small file cannot claim gigabytes).

    Raises:
        FileNotFoundError: The file does not exist.
        DataError: Not IDX, a corrupt gzip stream, or data shorter or longer than the header says.
    """
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = _gunzip_idx(path, raw)
    _check_magic(path, raw)
    dtype, shape, header = _idx_header(path, raw)
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def _check_magic(path: str, raw: bytes) -> None:
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_DTYPES:
        raise DataError(path, f"not an IDX file (bad magic {raw[:4].hex() or 'empty'})")


def _idx_header(path: str, raw: bytes, *, data_len: int | None = None) -> tuple[np.dtype, tuple[int, ...], int]:
    """(dtype, shape, header bytes) of an IDX buffer whose data part is `data_len` bytes (default: all of it)."""
    dtype = np.dtype(IDX_DTYPES[raw[2]])
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(path, f"truncated IDX header ({len(raw)} bytes, {ndim} dimensions declared)")
    if ndim > MAX_DIMS:
        raise DataError(path, f"IDX header declares {ndim} dimensions (at most {MAX_DIMS} supported)")
    shape = _shape(raw)
    expected = math.prod(shape) * dtype.itemsize  # Python ints: no overflow for any declared size
    got = len(raw) - header if data_len is None else data_len
    if got != expected:
        kind = "truncated" if got < expected else "has trailing bytes"
        raise DataError(path, f"IDX data {kind}: shape {shape} needs {expected} bytes, file has {got}")
    # numpy bounds the product of the non-zero sizes even for an empty array (a zero size makes it 0 bytes, so the
    # length check passes)
    if math.prod(s for s in shape if s) * dtype.itemsize > np.iinfo(np.intp).max:
        raise DataError(path, f"IDX header declares shape {shape}, larger than numpy can index")
    return dtype, shape, header


def _gunzip_idx(path: str, raw: bytes) -> bytes:
    """Inflate a gzipped IDX file: the header first, then exactly the data it declares (and one byte more, to see
    trailing data), so a tiny file declaring a huge array is refused before any allocation."""
    d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(raw, 4)
        _check_magic(path, out)
        header = 4 + 4 * out[3]
        if out[3]:  # (max_length 0 would mean "no limit")
            out += d.decompress(d.unconsumed_tail, header - 4)
        if len(out) < header:
            raise DataError(path, f"truncated IDX header ({len(out)} bytes, {out[3]} dimensions declared)")
        need = math.prod(_shape(out)) * np.dtype(IDX_DTYPES[out[2]]).itemsize
        if need > MAX_DEFLATE_RATIO * len(raw) + 1024:
            raise DataError(path, f"IDX header declares shape {_shape(out)} ({need} bytes), more than a "
                                  f"{len(raw)}-byte gzip file can hold")
        body = d.decompress(d.unconsumed_tail, need) if need else b""
        more = d.decompress(d.unconsumed_tail, 1) if len(body) == need else b""
    except zlib.error as e:
        raise DataError(path, f"corrupt gzip stream ({e})") from e
    if len(body) == need and not more and not d.eof:
        raise DataError(path, "gzip stream truncated (its end marker is missing)")
    _idx_header(path, out, data_len=len(body) + len(more))  # truncated / trailing bytes
    return out[:header] + body


def _shape(raw: bytes) -> tuple[int, ...]:
    return tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(raw[3]))


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
        raise DataError(root, f"{split} images {images.shape} and labels {labels.shape} do not pair up as "
                              "(N, H, W) / (N,)")
    if labels.size and (labels.min() < 0 or labels.max() >= len(classes)):
        raise DataError(root, f"{split} labels outside [0, {len(classes)})")
    return ArrayDataset(images[:, None], labels.astype(np.int64), list(classes))
