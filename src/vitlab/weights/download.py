"""Plain-URL downloads: the cache layout, resumable and verified downloads, placed atomically under a lock.

Plain URLs are cached under `cache_root()` (`$VITLAB_CACHE`, else `$XDG_CACHE_HOME/vitlab`, else
`~/.cache/vitlab`) at `<host>/<path of the URL>`. A download goes to `<file>.part` (resumed with an HTTP Range
request after a dropped connection; restarted when the server ignores Range), is checked against the sha256 the
registry or the URL gives, and only then renamed onto its final name; a lock file keeps two processes from
writing the same file. So a file in the cache is always complete and, where a checksum is known, verified.
Offline (`VITLAB_OFFLINE=1` or `HF_HUB_OFFLINE=1`) nothing is downloaded, and a missing file is reported with
the exact path to put it at.

`download_url` reads `RETRIES`, `TIMEOUT` and `BACKOFF` at call time (tests set them here).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import logging
import os
import re
import shutil
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from ..utils.io import atomic_write, place, write_atomic, writing
from .report import WeightsError

log = logging.getLogger("vitlab.weights")

_HEX = re.compile(r"[0-9a-f]+")
_TRUE = ("1", "true", "yes", "on")

# Plain downloads: seconds per socket operation, retries on transient errors, first back-off delay (doubles).
TIMEOUT = 30.0
RETRIES = 3
BACKOFF = 1.0
_CHUNK = 1 << 20


def cache_root() -> Path:
    """vitlab's download cache: `$VITLAB_CACHE`, else `$XDG_CACHE_HOME/vitlab`, else `~/.cache/vitlab`."""
    if os.environ.get("VITLAB_CACHE"):
        return Path(os.environ["VITLAB_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(base).expanduser() / "vitlab"


def offline_reason() -> str | None:
    """The variable that switches downloads off (`VITLAB_OFFLINE`, `HF_HUB_OFFLINE`), or None when online."""
    for var in ("VITLAB_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in _TRUE:
            return f"{var}={os.environ[var]}"
    return None


def url_cache_path(url: str, root: Path | None = None) -> Path:
    """Where a URL's file lives in the cache: `<root>/<host>/<path>` (a query string adds a short hash)."""
    parts = urllib.parse.urlsplit(url)
    segments = [urllib.parse.unquote(s) for s in parts.path.split("/")]
    segments = [s for s in segments if s not in ("", ".", "..")]
    if not segments or not parts.netloc:
        raise WeightsError(f"{url}: the URL does not name a file")
    name = segments[-1]
    if parts.query:
        stem, suffix = os.path.splitext(name)
        name = f"{stem}-{hashlib.sha256(parts.query.encode()).hexdigest()[:8]}{suffix}"
    host = parts.netloc.replace(":", "_")
    return (cache_root() if root is None else Path(root)) / host / Path(*segments[:-1]) / name


class _Transient(Exception):
    """A failure worth retrying (dropped connection, timeout, 5xx); the .part file is kept for resuming."""


class _Unreachable(Exception):
    """The host cannot be reached at all (no DNS, no route): retrying will not help."""


def download_url(url: str, dest: str | os.PathLike[str], *, sha256: str | None = None, progress: bool = True,
                 retries: int | None = None, timeout: float | None = None,
                 backoff: float | None = None) -> Path:
    """Download `url` to `dest` once: resumable, verified, placed atomically, safe against concurrent callers.

    Args:
        url: http(s) URL.
        dest: Final file path. If it already exists it is returned (checked first when `sha256` is given and it
            was not placed by a verified download).
        sha256: Full hex digest or a prefix of one (e.g. torchvision's 8 hex digits).
        progress: tqdm bar on stderr when stderr is a terminal.
        retries: Further tries after a transient failure (default RETRIES), each resuming the partial file.
        timeout: Seconds per socket operation (default TIMEOUT).
        backoff: Seconds before the first retry, doubling after each (default BACKOFF).

    Raises:
        WeightsError: the download failed (the partial file is kept for the next call to resume), the bytes do
            not match `sha256` (nothing is kept), or offline with nothing cached (the message names `dest`).
    """
    dest = Path(dest)
    retries = RETRIES if retries is None else retries
    timeout = TIMEOUT if timeout is None else timeout
    backoff = BACKOFF if backoff is None else backoff
    if sha256 is not None:
        sha256 = sha256.lower()
        if not _HEX.fullmatch(sha256) or not 8 <= len(sha256) <= 64:
            raise WeightsError(f"{url}: checksum {sha256!r} is not a sha256 hex digest or a prefix of 8+ digits")
    offline = offline_reason()
    if dest.is_file():
        return _check_cached(dest, sha256)
    if offline is not None:
        raise _offline_error(url, dest, f"offline mode is on ({offline})")
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    with _file_lock(dest):
        if dest.is_file():  # another process finished it while we waited
            return _check_cached(dest, sha256)
        for attempt in range(retries + 1):
            try:
                _fetch(url, part, progress=progress, timeout=timeout, verified=sha256 is not None)
                break
            except _Unreachable as e:
                host = urllib.parse.urlsplit(url).netloc
                raise _offline_error(url, dest, f"{host} cannot be reached ({e})") from None
            except _Transient as e:
                if attempt == retries:
                    kept = f"; {part} ({part.stat().st_size:,} bytes) is kept and the next call resumes it" \
                        if part.exists() else ""
                    raise WeightsError(f"downloading {url} failed after {attempt + 1} tries: {e}{kept}") from None
                delay = backoff * 2**attempt
                log.warning("%s: %s; retrying in %.1fs (try %d of %d)", url, e, delay, attempt + 2, retries + 1)
                time.sleep(delay)
        part.with_name(part.name + ".validator").unlink(missing_ok=True)
        digest = _sha256(part)
        if sha256 is not None and not digest.startswith(sha256):
            size = part.stat().st_size
            part.unlink()
            raise WeightsError(f"{url}: checksum mismatch: the {size:,} bytes downloaded have sha256 {digest}, "
                               f"expected {sha256}{'...' if len(sha256) < 64 else ''}; nothing was kept")
        place(part, dest)  # fsync'ed, renamed, folder fsync'ed
        _write_marker(dest, digest)
    log.info("downloaded %s to %s", url, dest)
    return dest


def _fetch(url: str, part: Path, *, progress: bool, timeout: float, verified: bool) -> None:
    """One HTTP request: append to `part` from its current size (Range), or rewrite it when the server sends
    the whole file. Raises _Transient when the body ends early or the connection fails.

    A resumed request carries `If-Range` with the ETag / Last-Modified of the first response, so a file that
    changed on the server is sent whole instead of appended to the old prefix. Without such a validator a partial
    file is resumed only when a checksum will verify the result (`verified`); otherwise it starts over."""
    offset = part.stat().st_size if part.exists() else 0
    validator_file = part.with_name(part.name + ".validator")
    validator = validator_file.read_text().strip() if offset and validator_file.exists() else ""
    if offset and not validator and not verified:
        offset = 0
    headers = {"User-Agent": "vitlab (python urllib)", "Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
        if validator:
            headers["If-Range"] = validator
    request = urllib.request.Request(url, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and offset:
            if (e.headers.get("Content-Range") or "").strip() == f"bytes */{offset}":
                return  # the partial file is already whole (a run stopped before verifying it): verify it now
            part.unlink()  # not a prefix we can extend: start over
            raise _Transient("the server refused to resume the partial file (HTTP 416); starting over") from None
        if e.code in (408, 425, 429) or e.code >= 500:
            raise _Transient(f"HTTP {e.code} {e.reason}") from None
        raise WeightsError(f"{url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, socket.gaierror | ConnectionRefusedError) or getattr(e.reason, "errno", None) in (
                101, 113):  # no DNS, refused, network / host unreachable
            raise _Unreachable(str(e.reason)) from None
        raise _Transient(str(e.reason)) from None
    except (TimeoutError, ConnectionError, http.client.HTTPException) as e:
        raise _Transient(f"{type(e).__name__}: {e}") from None
    with response:
        total: int | None
        if response.status == 206:
            m = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", response.headers.get("Content-Range", "").strip())
            if m is None or int(m.group(1)) != offset:
                part.unlink()
                raise _Transient(f"the server resumed at the wrong place ({response.headers.get('Content-Range')}); "
                                 "starting over")
            total = int(m.group(3)) if m.group(3) != "*" else None
            mode = "ab"
        else:
            if offset:
                log.info("%s: the server ignored the Range request; downloading from the start", url)
            offset, mode = 0, "wb"
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            etag = response.headers.get("ETag") or ""
            validator = etag if etag and not etag.startswith("W/") else response.headers.get("Last-Modified") or ""
            if validator:  # a strong ETag or a date: what If-Range accepts
                validator_file.write_text(validator + "\n")
            else:
                validator_file.unlink(missing_ok=True)
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=offset, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
                   desc=os.path.basename(part.name.removesuffix(".part")), leave=False,
                   disable=not progress or not sys.stderr.isatty())
        try:
            with writing(part.with_name(part.name.removesuffix(".part"))), open(part, mode) as f, bar:
                while True:
                    chunk = response.read(_CHUNK)
                    if not chunk:
                        break
                    f.write(chunk)
                    bar.update(len(chunk))
        except (TimeoutError, ConnectionError, http.client.HTTPException) as e:
            raise _Transient(f"the connection broke after {part.stat().st_size:,} bytes "
                             f"({type(e).__name__})") from None
    size = part.stat().st_size
    if total is not None and size != total:
        raise _Transient(f"the connection closed after {size:,} of {total:,} bytes")


def _offline_error(url: str, dest: Path, why: str) -> WeightsError:
    return WeightsError(f"{url} is not in the cache and {why}. Download it on a machine with network (or "
                        f"`vitlab weights get` there) and put the file at {dest}, or pass the file's local path")


def _check_cached(path: Path, sha256: str | None) -> Path:
    """A cached file: trusted when a verified download placed it (the marker beside it agrees), else hashed."""
    if sha256 is None:
        return path
    marker = _marker(path)
    with contextlib.suppress(OSError):
        if marker.stat().st_mtime >= path.stat().st_mtime and marker.read_text().strip().startswith(sha256):
            return path
    digest = _sha256(path)
    if not digest.startswith(sha256):
        raise WeightsError(f"{path}: checksum mismatch: sha256 {digest}, expected {sha256}"
                           f"{'...' if len(sha256) < 64 else ''}; delete the file and download it again")
    with contextlib.suppress(OSError):
        _write_marker(path, digest)
    return path


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _write_marker(path: Path, digest: str) -> None:
    write_atomic(_marker(path), digest + "\n", overwrite=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def _file_lock(dest: Path) -> Iterator[None]:
    """An inter-process lock on `<dest>.lock` (the file itself stays; removing it would race)."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(dest.with_name(dest.name + ".lock")))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.warning("waiting for another process downloading %s", dest)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _copy_atomic(src: Path, dest: Path) -> None:
    with atomic_write(dest) as tmp:
        shutil.copyfile(src, tmp)
