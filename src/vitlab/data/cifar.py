"""CIFAR-10 / CIFAR-100 from their binary distribution, read as plain bytes (no pickle).

Record layout (https://www.cs.toronto.edu/~kriz/cifar.html): CIFAR-10 is 1 label byte + 3072 pixel bytes;
CIFAR-100 is 1 coarse-label byte + 1 fine-label byte + 3072 pixel bytes. The pixels are the red, then green,
then blue 32 x 32 planes, each row-major: exactly (3, 32, 32) in C order.
"""

from __future__ import annotations

import os

import numpy as np

from .arrays import ArrayDataset
from .errors import DataError

PIXELS = 3 * 32 * 32

# dataset -> (folder inside the archive, train files, test files, label-names file, label bytes per record)
LAYOUT = {
    "cifar10": (
        "cifar-10-batches-bin",
        [f"data_batch_{i}.bin" for i in range(1, 6)],
        ["test_batch.bin"],
        "batches.meta.txt",
        1,
    ),
    "cifar100": ("cifar-100-binary", ["train.bin"], ["test.bin"], "fine_label_names.txt", 2),
}


def _resolve(root: str, folder: str, probe: str) -> str:
    """Accept either the extracted folder itself or its parent."""
    for cand in (root, os.path.join(root, folder)):
        if os.path.isfile(os.path.join(cand, probe)):
            return cand
    if not os.path.isdir(root):
        raise FileNotFoundError(f"CIFAR root {root!r} does not exist")
    raise FileNotFoundError(f"{probe} not found in {root!r} or {os.path.join(root, folder)!r} (binary version)")


def read_cifar_records(path: str, label_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """One binary batch file -> (images uint8 (N, 3, 32, 32), labels uint8 (N, label_bytes)).

    Raises:
        DataError: The file is empty or not a whole number of records.
    """
    raw = np.fromfile(path, dtype=np.uint8)  # the file's own length: nothing declared to trust
    rec = label_bytes + PIXELS
    if raw.size == 0 or raw.size % rec:
        raise DataError(path, f"{raw.size} bytes is not a whole number of {rec}-byte CIFAR records (truncated?)")
    raw = raw.reshape(-1, rec)
    return raw[:, label_bytes:].reshape(-1, 3, 32, 32), raw[:, :label_bytes]


def load_cifar(root: str, which: str, split: str) -> ArrayDataset:
    """Load `split` ("train" or "test") of `which` ("cifar10" or "cifar100", fine labels) from `root`.

    Raises:
        FileNotFoundError: A batch file is missing.
        DataError: A batch file is malformed, or a label has no class name.
    """
    folder, train_files, test_files, names_file, label_bytes = LAYOUT[which]
    files = train_files if split == "train" else test_files
    base = _resolve(root, folder, files[0])
    parts = [read_cifar_records(_existing(base, f), label_bytes) for f in files]
    images = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])[:, -1].astype(np.int64)  # CIFAR-100: the fine label is last
    names_path = os.path.join(base, names_file)
    if os.path.isfile(names_path):
        with open(names_path, "rb") as fb:
            try:
                text = fb.read().decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(names_path, f"class names are not UTF-8 text ({e})") from e
        classes = [line.strip() for line in text.splitlines() if line.strip()]
    else:
        classes = [str(i) for i in range(10 if which == "cifar10" else 100)]
    if labels.size and labels.max() >= len(classes):
        raise DataError(base, f"label {int(labels.max())} but only {len(classes)} class names in {names_file}")
    return ArrayDataset(images, labels, classes)


def _existing(base: str, name: str) -> str:
    path = os.path.join(base, name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"CIFAR file {path} is missing")
    return path
