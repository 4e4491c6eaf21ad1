"""Atomic, non-clobbering file output: a checkpoint is either fully written or not there at all."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_output(path: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it is renamed onto `path` in one step.

    Args:
        path: The final destination.
        overwrite: Replace an existing file; without it an existing `path` raises FileExistsError.

    Raises:
        FileExistsError: `path` exists and `overwrite` is False.
        IsADirectoryError: `path` is a directory.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; give a file name such as {path / 'model.safetensors'}")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True (or --force) to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        if path.exists() and not overwrite:  # appeared while we were writing
            raise FileExistsError(f"{path} was created while writing; not replacing it")
        _fsync(tmp_path)  # the data is on disk before the name points at it
        os.replace(tmp_path, path)
        _fsync(path.parent)
    finally:
        tmp_path.unlink(missing_ok=True)


def _fsync(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. directories on platforms that cannot open them
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
