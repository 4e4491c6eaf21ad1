"""Atomic file output: every file vitlab writes is either complete or not there at all, with the usual permissions.

`atomic_write(path)` yields a temporary path beside `path` (same folder, so the rename stays on one file system;
same suffix, so writers that pick the format from it work). When the block ends, the file is fsync'ed, given the
mode a plain `open()` would have given it (0o666 less the umask: `tempfile.mkstemp` would leave 0o600), renamed
onto `path` in one step, and the folder is fsync'ed so the rename itself survives a power cut. If the block
raises, the temporary file is removed and an existing `path` is left as it was. A kill -9 can leave a hidden
`.tmp-*` file behind, never a torn `path`.

A write that fails for a reason of the disk or the folder (full, read-only, no permission, a file where a folder
must be) raises `OutputError`, "cannot write PATH: no space left on device", whatever the writer (Python, torch,
safetensors) raised; its temporary file is removed first, so a full disk gets its space back. `check_writable`
finds the folder problems before any work is done. A Ctrl-C during a write is held until the file is complete
(or removed), then delivered; a second Ctrl-C during the same write stops it at once (the temporary is removed).
SIGTERM, where the program handles it as an interrupt (the `vitlab` command does), is held the same way.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["OutputError", "atomic_write", "check_writable", "copytree_atomic", "default_mode", "fsync_path",
           "holding_interrupts", "output_error", "place", "staged", "write_atomic", "writing"]

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


# -- errors of writing --------------------------------------------------------------------------------------------


class OutputError(OSError):
    """A file could not be written for a reason of where it goes: the disk is full, the folder is read-only or not
    writable, or a path names a file where a folder must be. Nothing that was there before has been changed.

    `str()` is "cannot write PATH: REASON"; `errno` and `filename` are set as for any OSError.
    """

    def __init__(self, path: str | os.PathLike[str], reason: str, code: int | None = None):
        super().__init__(code, reason, str(path))

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


# errors of the place a file goes (not of the data): what `output_error` turns into an OutputError
_WRITE_ERRNOS = frozenset(
    getattr(errno, name) for name in ("ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM", "ENOTDIR", "EISDIR", "EFBIG",
                                      "EIO", "ENAMETOOLONG", "EMLINK", "ENOLINK")
    if hasattr(errno, name))
# torch and safetensors report the OS error inside their own message ("... (os error 28)"); map its text back
_STRERRORS = {os.strerror(code).lower(): code for code in _WRITE_ERRNOS}
_OS_ERROR_RE = re.compile(r"\b(?:os error|errno)\s*(\d+)", re.IGNORECASE)
_LOW_SPACE = 1 << 20  # below this many free bytes a writer's unexplained failure is taken for a full disk


def _reason(code: int) -> str:
    text = os.strerror(code)
    return text[:1].lower() + text[1:]


def _errno_of(e: BaseException) -> int | None:
    """The errno of a write error, also when a library wrapped it (torch's RuntimeError, safetensors' own type)."""
    if isinstance(e, OSError) and e.errno is not None:
        return e.errno
    text = str(e)
    m = _OS_ERROR_RE.search(text)
    if m and int(m.group(1)) in _WRITE_ERRNOS:
        return int(m.group(1))
    low = text.lower()
    return next((code for msg, code in _STRERRORS.items() if msg in low), None)


def _free_bytes(folder: Path) -> int | None:
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def output_error(path: str | os.PathLike[str], e: BaseException, *, folder: str | os.PathLike[str] | None = None
                 ) -> OutputError | None:
    """The OutputError for `e`, raised while writing `path`, when `e` is about the disk or the folder; else None.

    Python's OSError carries an errno. torch and safetensors wrap the OS error in their own exception with the
    errno or its text in the message; torch sometimes says only "unexpected pos": for such an unexplained failure
    (a RuntimeError or a library's own type) the free space of `folder` (default: `path`'s) decides, and under
    1 MiB it is taken for a full disk. Call it before removing a partial file, which gives the space back.
    """
    if isinstance(e, OutputError):
        return e
    code = _errno_of(e)
    foreign = type(e).__module__.partition(".")[0] not in ("builtins", "vitlab")  # e.g. SafetensorError
    if code is None and (isinstance(e, RuntimeError) or foreign):
        free = _free_bytes(Path(folder) if folder is not None else Path(path).parent)
        if free is not None and free < _LOW_SPACE:
            code = errno.ENOSPC
    if code is None or code not in _WRITE_ERRNOS:
        return None
    return OutputError(path, _reason(code), code)


@contextlib.contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """Within the block, an error of the disk or folder (see `output_error`) while writing `path` (a file kept
    open, like a log appended to) is raised as OutputError naming `path`; other errors pass through unchanged."""
    try:
        yield
    except Exception as e:
        err = output_error(path, e)
        if err is None or err is e:
            raise
        raise err from e


def _nearest_existing(path: Path) -> Path:
    while not os.path.lexists(path) and path.parent != path:
        path = path.parent
    return path


def check_writable(path: str | os.PathLike[str], *, folder: bool = False) -> Path:
    """Raise OutputError now if `path` could not be written later: a file (or with `folder`, a folder to write
    into) whose place is a file, a read-only file system or a folder without write permission. Nothing is created.

    A full disk cannot be known in advance: `atomic_write` reports it when it happens.

    Raises:
        OutputError: With the reason ("it is a file, not a folder", "read-only file system", ...).
    """
    p = Path(path)
    if folder and p.exists() and not p.is_dir():
        raise OutputError(p, "it is a file, not a folder", errno.ENOTDIR)
    if not folder and p.is_dir():
        raise OutputError(p, "it is a folder; give a file name inside it", errno.EISDIR)
    where = p if folder and p.is_dir() else _nearest_existing(p.parent if not folder else p)
    if not where.is_dir():
        raise OutputError(p, f"{where} is a file, not a folder", errno.ENOTDIR)
    if not os.access(where, os.W_OK | os.X_OK):
        try:
            read_only = bool(os.statvfs(where).f_flag & os.ST_RDONLY)
        except (OSError, AttributeError):
            read_only = False
        code = errno.EROFS if read_only else errno.EACCES
        raise OutputError(p, _reason(code) + ("" if where == p else f" ({where})"), code)
    return p


# -- Ctrl-C during a write -----------------------------------------------------------------------------------------


class _HoldInterrupts:
    """Within the block (main thread only), SIGINT is recorded instead of acted on, and handed to the handler that
    was there when the block ends: a file being written is finished (or removed) before Ctrl-C stops the program.
    A second SIGINT within the block is acted on at once (KeyboardInterrupt): the user insists. SIGTERM is held the
    same way when a Python handler takes it (the `vitlab` program's, `vitlab train`'s): never forced, and left
    alone otherwise (by default it kills the process, which a library does not change)."""

    def __init__(self) -> None:
        self.pending: int | None = None  # the first signal held
        self.forced = False
        self._old: dict[int, Any] = {}

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.pending is not None and signum == signal.SIGINT:
            self.forced = True
            raise KeyboardInterrupt
        if self.pending is None:
            self.pending = signum

    def __enter__(self) -> _HoldInterrupts:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                old = signal.getsignal(s)
                # None: a handler not installed from Python; SIGTERM's default (kill) is not ours to change
                if old is not None and old is not signal.SIG_IGN and (s == signal.SIGINT or callable(old)):
                    self._old[s] = old
                    signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        olds, self._old = self._old, {}
        for s, old in olds.items():
            signal.signal(s, old)
        signum = self.pending
        if signum is None or self.forced:
            return
        old = olds[signum]  # deliver the held signal to whoever would have had it
        if callable(old):
            old(signum, None)
        else:  # SIG_DFL: die of the signal, as the program would have
            signal.raise_signal(signum)


def holding_interrupts() -> _HoldInterrupts:
    """A block that a Ctrl-C (or a SIGTERM the program handles) does not cut in half: the signal is acted on when it
    ends, as within `atomic_write`. For steps that belong together, such as moving a set of finished files into
    place or removing a temporary folder."""
    return _HoldInterrupts()


# -- writing -------------------------------------------------------------------------------------------------------


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
    try:
        fsync_path(src)  # the data is on disk before the name points at it (a full disk may say so only here)
        if mode is not None:
            os.chmod(src, mode)
        os.replace(src, dest)
    except OSError as e:
        err = output_error(dest, e)
        if err is None:
            raise
        raise err from e
    fsync_path(dest.parent, directory=True)
    return dest


_STAGE = threading.local()  # the files of the innermost `staged()` block of this thread, waiting to be placed


@contextlib.contextmanager
def staged() -> Iterator[None]:
    """For files that belong together (a Hub folder's weights and config.json): within the block, atomic writes
    fill their temporary files, and all are renamed onto their names only when the block ends without error. If
    anything fails (a full disk at the second file), every temporary file is removed and the earlier files are all
    kept: never new weights beside an old config."""
    outer: list[tuple[Path, Path, bool, int]] | None = getattr(_STAGE, "pending", None)
    pending: list[tuple[Path, Path, bool, int]] = []
    _STAGE.pending = pending
    try:
        yield
        if outer is not None:  # nested: the outer block places them
            outer.extend(pending)
            pending = []
            return
        for tmp, path, _, _ in pending:  # the data of all of them on disk before any name moves
            with writing(path):
                fsync_path(tmp)
        for tmp, path, overwrite, mode in pending:
            place(tmp, path, overwrite=overwrite, mode=mode)
    finally:
        _STAGE.pending = outer
        for tmp, *_ in pending:
            _remove(tmp)


def _remove(tmp: Path) -> None:
    """Remove a temporary file if it is there (a read-only file system refuses even to unlink a missing one)."""
    try:
        tmp.unlink()
    except OSError:
        if os.path.lexists(tmp):
            raise


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

    A Ctrl-C while the block runs is delivered when the file is in place (or removed); a second one stops the
    write at once, as KeyboardInterrupt, whatever the writer turned it into.

    Raises:
        FileExistsError: `path` exists and `overwrite` is False.
        IsADirectoryError: `path` is a directory.
        OutputError: The disk is full, the folder read-only or not writable, a folder on the way is a file: the
            temporary file is removed and an existing `path` kept.
    """
    path = Path(path)
    _check_target(path, overwrite)
    _make_parent(path)
    tmp = _temp_name(path)
    stage: list[tuple[Path, Path, bool, int]] | None = getattr(_STAGE, "pending", None)
    handed_over = False
    with _HoldInterrupts() as held:
        try:
            yield tmp
            if stage is not None:  # placed with the others at the end of `staged()`
                stage.append((tmp, path, overwrite, default_mode() if mode is None else mode))
                handed_over = True
                return
            place(tmp, path, overwrite=overwrite, mode=default_mode() if mode is None else mode)
        except BaseException as e:
            if held.forced and not isinstance(e, KeyboardInterrupt):  # torch turns it into a RuntimeError
                raise KeyboardInterrupt from e
            err = output_error(path, e) if isinstance(e, Exception) else None  # before the space is freed
            if err is None:
                raise
            if err is e and e.filename == str(tmp):  # a writer that itself writes atomically: name our file
                err = OutputError(path, e.strerror or str(e), e.errno)
            if err is e:
                raise
            raise err from e
        finally:
            if not handed_over:
                _remove(tmp)


def _make_parent(path: Path) -> None:
    """Create `path`'s folder; a file in its way, a full disk or a read-only file system is an OutputError."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:  # a file is in the way of the folder
        raise OutputError(path, f"{_nearest_existing(path.parent)} is a file, not a folder", errno.ENOTDIR) from e
    except OSError as e:
        err = output_error(path, e)
        if err is None:
            raise
        raise err from e


def _temp_name(path: Path) -> Path:
    """The hidden temporary beside `path`: `.tmp-<8 hex>-<name>` (train.rundir removes stale ones by this shape)."""
    return path.with_name(f".tmp-{secrets.token_hex(4)}-{path.name}")


def copytree_atomic(src: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Path:
    """Copy the folder `src` to `dest` (which must not exist) as one step: into a hidden temporary folder beside
    `dest`, renamed onto it when complete. A failed copy (a full disk: OutputError) leaves no `dest` and no
    temporary folder."""
    dest = Path(dest)
    if os.path.lexists(dest):
        raise FileExistsError(f"{dest} already exists")
    _make_parent(dest)
    tmp = _temp_name(dest)
    try:
        shutil.copytree(src, tmp)
        os.rename(tmp, dest)
    except Exception as e:
        err = output_error(dest, e)  # shutil.Error lists the failed files with their "[Errno N] ..." texts
        shutil.rmtree(tmp, ignore_errors=True)
        if err is None:
            raise
        raise err from e
    fsync_path(dest.parent, directory=True)
    return dest


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
