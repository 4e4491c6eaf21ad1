"""Property-based fuzzing of the IDX and CIFAR readers: whatever the bytes, a reader returns data or raises
`vitlab.data.DataError` naming the file (never EOFError, IndexError, struct.error, zlib.error, MemoryError)."""

import gzip
import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vitlab.data import DataError
from vitlab.data.cifar import PIXELS, load_cifar, read_cifar_records
from vitlab.data.idx import IDX_DTYPES, read_idx

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _valid_idx(shape: tuple[int, ...], type_byte: int = 0x08) -> bytes:
    dtype = np.dtype(IDX_DTYPES[type_byte])
    head = bytes([0, 0, type_byte, len(shape)]) + b"".join(s.to_bytes(4, "big") for s in shape)
    return head + np.arange(int(np.prod(shape)), dtype=dtype).tobytes()


def _read(blob: bytes, name: str = "f.idx") -> np.ndarray | None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, name)
        with open(path, "wb") as f:
            f.write(blob)
        try:
            return read_idx(path)
        except DataError as e:
            assert e.path == path and e.reason and path in str(e)
            return None


# a valid file, then some bytes overwritten, cut off or appended
_mutations = st.tuples(
    st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=4),
    st.one_of(st.none(), st.integers(0, 200)),
    st.binary(max_size=8),
)


def _mutate(blob: bytes, muts) -> bytes:
    edits, cut, extra = muts
    b = bytearray(blob)
    for pos, val in edits:
        if pos < len(b):
            b[pos] = val
    if cut is not None:
        b = b[:cut]
    return bytes(b) + extra


@FUZZ
@given(st.binary(max_size=300))
def test_idx_arbitrary_bytes(blob):
    _read(blob)
    _read(b"\x00\x00" + blob)  # past the first magic check
    _read(gzip.compress(blob))


@FUZZ
@given(st.lists(st.integers(0, 5), min_size=0, max_size=4), st.sampled_from(sorted(IDX_DTYPES)), _mutations,
       st.booleans())
def test_idx_mutated_valid_files(shape, type_byte, muts, gz):
    blob = _valid_idx(tuple(shape), type_byte)
    out = _read(gzip.compress(blob) if gz else blob)
    assert out is not None and out.shape == tuple(shape)  # the unmutated file reads
    damaged = _mutate(blob, muts)
    _read(gzip.compress(damaged) if gz else damaged)
    if gz:
        _read(_mutate(gzip.compress(blob), muts))  # damage inside the gzip stream itself


@pytest.mark.parametrize("gz", [False, True])
def test_idx_huge_declared_size_is_refused_before_allocating(gz):
    # 4 dimensions of 2^32 - 1: ~3e38 bytes declared by a file of a few bytes
    blob = bytes([0, 0, 0x08, 4]) + b"\xff" * 16 + b"xy"
    with pytest.raises(DataError, match=r"needs|more than"):
        read_idx_bytes(gzip.compress(blob) if gz else blob)


def test_idx_empty_shape_numpy_cannot_hold_is_refused():
    """A zero dimension makes the data 0 bytes (so the length check passes), but numpy still refuses a shape whose
    other dimensions multiply past its index range: found by the fuzz test above (f8, sizes (0, 0, 2^28 + 2^26,
    0xcd000000)); a DataError naming the shape, not numpy's ValueError."""
    blob = bytes([0, 0, 0x0E, 4]) + b"\x00" * 8 + (0x14000000).to_bytes(4, "big") + (0xCD000000).to_bytes(4, "big")
    with pytest.raises(DataError, match=r"shape \(0, 0, 335544320, 3439329280\).*numpy"):
        read_idx_bytes(blob)
    small = bytes([0, 0, 0x08, 3]) + b"\x00" * 4 + (7).to_bytes(4, "big") + (5).to_bytes(4, "big")
    assert read_idx_bytes(small).shape == (0, 7, 5)  # an empty array numpy can hold still reads


def read_idx_bytes(blob: bytes) -> np.ndarray:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "f.idx")
        with open(path, "wb") as f:
            f.write(blob)
        return read_idx(path)


@FUZZ
@given(st.binary(max_size=2 * (2 + PIXELS) + 10), st.sampled_from([1, 2]))
def test_cifar_records_arbitrary_bytes(blob, label_bytes):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "test_batch.bin")
        with open(path, "wb") as f:
            f.write(blob)
        try:
            images, labels = read_cifar_records(path, label_bytes)
        except DataError as e:
            assert e.path == path
            return
        assert images.shape[1:] == (3, 32, 32) and len(labels) == len(images)


@FUZZ
@given(st.lists(st.integers(0, 255), min_size=0, max_size=3), st.binary(max_size=64), st.integers(0, 40))
def test_cifar10_labels_and_names_fuzzed(labels, names, cut):
    """Any label bytes, any names file, a batch file cut anywhere: data or DataError."""
    with tempfile.TemporaryDirectory() as d:
        base = os.path.join(d, "cifar-10-batches-bin")
        os.mkdir(base)
        records = b"".join(bytes([lab]) + bytes(PIXELS) for lab in labels)
        with open(os.path.join(base, "test_batch.bin"), "wb") as f:
            f.write(records[: max(0, len(records) - cut)])
        with open(os.path.join(base, "batches.meta.txt"), "wb") as f:
            f.write(names)
        try:
            data = load_cifar(d, "cifar10", "test")
        except DataError:
            return
        assert len(data) == len(labels) and all(0 <= y < len(data.classes) for y in data.labels)
