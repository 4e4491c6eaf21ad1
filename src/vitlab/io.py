"""Atomic file output: every file vitlab writes is either complete or not there at all, with the usual permissions.

`atomic_write(path)` yields a temporary path beside `path` (same folder, so the rename stays on one file system;
same suffix, so writers that pick the format from it work). When the block ends, the file is fsync'ed, given the
mode a plain `open()` would have given it (0o666 less the umask: `tempfile.mkstemp` would leave 0o600), renamed
onto `path` in one step, and the folder is fsync'ed so the rename itself survives a power cut. If the block
raises, the temporary file is removed and an existing `path` is left as it was. A kill -9 can leave a hidden
`.tmp-*` file behind, never a torn `path`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["atomic_write", "default_mode", "fsync_path", "place", "write_atomic"]

_UMASK_LOCK = threading.Lock()


def _umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux: /proc/self/status)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:  # elsewhere: set and restore (threads writing through us wait; others are unaffected)
        old = os.umask(0o022)
        os.umask(old)
    return old


def default_mode() -> int:
    """The mode `open(path, "w")` gives a new file: 0o666 less the current umask (0o644 under umask 022)."""
    return 0o666 & ~_umask()


def fsync_path(path: str | os.PathLike[str], *, directory: bool = False) -> None:
    """fsync a file, or a folder (a rename in it is durable only after this).

    For a folder, platforms and file systems that cannot open or fsync one are tolerated; a file's errors raise.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        if directory:
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not directory:
            raise
    finally:
        os.close(fd)


def _check_target(path: Path, overwrite: bool) -> None:
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; give a file name inside it")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True (or --force) to replace it")


def place(src: str | os.PathLike[str], dest: str | os.PathLike[str], *, overwrite: bool = True,
          mode: int | None = None) -> Path:
    """Move a finished file `src` onto `dest` durably: fsync it, set its mode, rename (atomic on one file
    system), fsync `dest`'s folder.

    Args:
        src: A complete file, normally in `dest`'s folder.
        dest: Its final name.
        overwrite: Replace an existing `dest`; without it an existing `dest` raises FileExistsError.
        mode: Permission bits; None keeps what `src` has. `atomic_write` passes `default_mode()`.
    """
    dest = Path(dest)
    _check_target(dest, overwrite)
    fsync_path(src)  # the data is on disk before the name points at it
    if mode is not None:
        os.chmod(src, mode)
    os.replace(src, dest)
    fsync_path(dest.parent, directory=True)
    return dest


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], *, overwrite: bool = False, mode: int | None = None
                 ) -> Iterator[Path]:
    """Yield a temporary path beside `path` for the caller to write; on success it replaces `path` in one step.

    The temporary file is not created: the caller's writer creates it (writers that refuse to replace a file
    work too). It is hidden, `.tmp-<random>-<name>`, and ends like `path`.

    Args:
        path: The final destination; its folder is created if needed.
        overwrite: Replace an existing file; without it an existing `path` raises FileExistsError, checked
            before writing and again before the rename.
        mode: Permission bits of the result; default `default_mode()` (0o644 under umask 022).

    Raises:
        FileExistsError: `path` exists and `overwrite` is False.
        IsADirectoryError: `path` is a directory.
    """
    path = Path(path)
    _check_target(path, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{secrets.token_hex(4)}-{path.name}")
    try:
        yield tmp
        place(tmp, path, overwrite=overwrite, mode=default_mode() if mode is None else mode)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: str | os.PathLike[str], data: bytes | bytearray | str | Callable[[Path], object], *,
                 overwrite: bool = False, mode: int | None = None) -> Path:
    """Write `data` to `path` atomically: bytes, text (UTF-8), or a function that writes the path it is given.

    Example:
        write_atomic(run / "report.json", json.dumps(report), overwrite=True)
        write_atomic(run / "plot.png", lambda tmp: fig.savefig(tmp, format="png"), overwrite=True)
    """
    with atomic_write(path, overwrite=overwrite, mode=mode) as tmp:
        if isinstance(data, bytes | bytearray):
            tmp.write_bytes(data)
        elif isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            data(tmp)
    return Path(path)
