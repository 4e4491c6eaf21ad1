"""Names to local files: a path, a registry name, a Hugging Face Hub repo, or a gs:// / http(s) URL.

    resolve("run/final.safetensors")                          # a local file or directory, as is
    resolve("hf-hub:google/vit-base-patch16-224")            # the Hub, through huggingface_hub and its cache
    resolve("timm/vit_base_patch16_224.augreg2_in21k_ft_in1k")  # a registry name, or a bare Hub repo id
    resolve("gs://vit_models/imagenet21k/ViT-B_16.npz")     # https://storage.googleapis.com/vit_models/...
    resolve("https://host/w.pth#sha256=0123abcd")            # a URL, checked against the digest (or its prefix)

Hub repos go through `huggingface_hub` (its cache, `HF_HUB_CACHE`, `HF_HUB_OFFLINE`, `HF_TOKEN` or the login
token for gated repos); only the files a ViT needs are fetched: `config.json`, `preprocessor_config.json` when
there is one, and `model.safetensors` (else `pytorch_model.bin`).

Plain URLs are downloaded by `vitlab.weights.download` (cache layout, resume, checksums, locks). Offline
(`VITLAB_OFFLINE=1` or `HF_HUB_OFFLINE=1`) nothing is downloaded, and a missing file is reported with the exact
path to put it at.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import logging
import os
import re
import socket
import sys
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..models.preprocess import Preprocess
from ..utils.io import copytree_atomic
from . import download
from .report import WeightsError

if TYPE_CHECKING:
    from .registry import Entry

log = logging.getLogger("vitlab.weights")

HF_PREFIX = "hf-hub:"
GCS_PREFIX = "gs://"
GCS_HTTPS = "https://storage.googleapis.com/"
# What a ViT needs from a Hub repo: transformers' and timm's repos both have config.json beside the weights.
HUB_CONFIG = ("config.json", "preprocessor_config.json")
HUB_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
# A name ending in one of these is a file the user meant, never a Hub repo id.
_FILE_SUFFIXES = (".safetensors", ".npz", ".pth", ".pt", ".bin", ".ckpt", ".json")
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(@[\w./-]+)?")


@dataclass(frozen=True)
class Resolved:
    """Where a name led.

    Attributes:
        path: The local file or directory to read (a Hub repo: the snapshot directory with config.json).
        entry: The registry entry when the name is one (its config overrides and preprocessing apply).
    """

    path: Path
    entry: Entry | None = None


@dataclass(frozen=True)
class Location:
    """What a name means, before anything is fetched.

    Attributes:
        kind: "path" | "hub" | "url".
        text: The name as given.
        path: kind "path": the local path.
        repo_id: kind "hub": "owner/repo".
        revision: kind "hub": branch, tag or commit (None: main).
        filename: kind "hub": the weights file to take (None: model.safetensors, else pytorch_model.bin).
        url: kind "url": the https URL (gs:// mapped, #fragment removed).
        sha256: Full sha256 hex digest or a prefix of one, to check the bytes against (None: unknown).
    """

    kind: str
    text: str
    path: Path | None = None
    repo_id: str | None = None
    revision: str | None = None
    filename: str | None = None
    url: str | None = None
    sha256: str | None = None


# -- environment ------------------------------------------------------------------------------------------


def hf_cache_dir() -> Path:
    """The Hugging Face Hub cache as the environment says now (`HF_HUB_CACHE`, else `HF_HOME/hub`, else the
    library's default); read at call time, so a variable set after import still counts."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expandvars(os.environ[var])).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


# -- names ------------------------------------------------------------------------------------------------


def _registry() -> Any:
    """The registry module (imported on first use: it loads its table)."""
    from . import registry

    return registry


def locate(name: str | os.PathLike[str]) -> tuple[Location, Entry | None]:
    """Parse a name into a Location (no network, nothing downloaded), with its registry entry if it is one.

    Order: an existing local path; a registry name, alias or URL; "hf-hub:owner/repo[@rev]"; "gs://bucket/key";
    an http(s) URL; a bare "owner/repo[@rev]" that does not exist locally (a Hub repo id).

    Raises:
        FileNotFoundError: none of these (the message says what was tried and suggests close registry names).
    """
    if isinstance(name, os.PathLike):
        path = Path(name)
        if not path.exists():
            raise FileNotFoundError(f"no checkpoint at {path}")
        return Location("path", str(name), path=path), None
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"a checkpoint name must be a path or a non-empty string, got {name!r}")
    text = name.strip()
    if os.path.exists(os.path.expanduser(text)):
        return Location("path", text, path=Path(text).expanduser()), None
    entry = _registry().find(text)
    if entry is not None:
        loc = _parse_location(entry.url, text)
        if loc is None or loc.kind == "path":
            raise WeightsError(f"registry entry {entry.name!r} has an unusable url {entry.url!r}")
        sha = _entry_sha256(entry) or loc.sha256
        return Location(loc.kind, text, repo_id=loc.repo_id, revision=loc.revision,
                        filename=entry.filename or loc.filename, url=loc.url, sha256=sha), entry
    loc = _parse_location(text, text)
    if loc is not None:
        return loc, None
    if not text.endswith(_FILE_SUFFIXES) and _REPO_ID.fullmatch(text):
        repo, _, rev = text.partition("@")
        return Location("hub", text, repo_id=repo, revision=rev or None), None
    raise FileNotFoundError(_not_found(text))


def _parse_location(text: str, original: str) -> Location | None:
    """hf-hub:, gs:// and http(s) locations; None for anything else."""
    if text.startswith(HF_PREFIX):
        repo, _, rev = text[len(HF_PREFIX):].partition("@")
        if not _REPO_ID.fullmatch(repo):
            raise WeightsError(f"{original}: a Hub name is hf-hub:owner/repo[@revision], got {text!r}")
        return Location("hub", original, repo_id=repo, revision=rev or None)
    if text.startswith(GCS_PREFIX):
        bucket_key = text[len(GCS_PREFIX):]
        if "/" not in bucket_key.strip("/"):
            raise WeightsError(f"{original}: a Cloud Storage name is gs://bucket/key, got {text!r}")
        return _url_location(GCS_HTTPS + urllib.parse.quote(bucket_key, safe="/#=%"), original)
    if re.match(r"https?://", text, re.IGNORECASE):
        return _url_location(text, original)
    return None


def _url_location(url: str, original: str) -> Location:
    base, _, fragment = url.partition("#")
    sha = None
    if fragment:
        m = re.fullmatch(r"sha256=([0-9A-Fa-f]{8,64})", fragment)
        if m is None:
            raise WeightsError(f"{original}: the only URL fragment understood is #sha256=<hex digest or prefix>, "
                               f"got #{fragment}")
        sha = m.group(1).lower()
    return Location("url", original, url=base, sha256=sha)


def _entry_sha256(entry: Entry) -> str | None:
    for value in (getattr(entry, "sha256", None), getattr(entry, "sha256_prefix", None)):
        if value:
            value = str(value).lower()
            if not download._HEX.fullmatch(value):
                raise WeightsError(f"registry entry {entry.name!r}: checksum {value!r} is not hex")
            return value
    return None


def close_names(text: str) -> str:
    """'; close registry names: a, b' for a name that is not in the registry (else where the list is)."""
    names: list[str] = []
    for e in _registry().list_entries():
        names += [e.name, *e.aliases]
    close = difflib.get_close_matches(text, names, n=3, cutoff=0.6)
    return f"; close registry names: {', '.join(close)}" if close else "; `vitlab weights list` shows the registry"


def _not_found(text: str) -> str:
    return (f"no checkpoint at {text}: not a local file or directory, not a registry name, not a URL "
            f"(https://..., gs://bucket/key) and not a Hub id (hf-hub:owner/repo){close_names(text)}")


def _bare_repo_tried(text: str) -> str:
    return (f"{text!r} is not a local file or directory and not a registry name{close_names(text)}; "
            "tried it as a Hugging Face Hub repo")


# -- resolve ----------------------------------------------------------------------------------------------


def resolve(name_or_path: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None,
            progress: bool = True) -> Resolved:
    """The local file or directory a name refers to, downloading it (once) if needed.

    Args:
        name_or_path: A local path, a registry name or alias, "hf-hub:owner/repo[@revision]", a bare
            "owner/repo" (when no such local path exists), "gs://bucket/key", or an http(s) URL (optionally
            ending in "#sha256=<digest or prefix>").
        cache_dir: Folder for plain URL downloads instead of `download.cache_root()`. Hub repos always use the Hub's
            cache.
        progress: Show a progress bar on stderr (only when it is a terminal).

    Returns:
        The local path and, for a registry name, its entry.

    Raises:
        FileNotFoundError: an unknown name.
        WeightsError: a failed, corrupt or (offline) impossible download; the message says what to do.
    """
    loc, entry = locate(name_or_path)
    if loc.kind == "path":
        assert loc.path is not None
        return Resolved(loc.path, None)
    if loc.kind == "hub":
        try:
            return Resolved(hub_download(loc, progress=progress), entry)
        except WeightsError as e:
            if entry is not None or loc.text.startswith(HF_PREFIX):
                raise
            raise WeightsError(f"{_bare_repo_tried(loc.text)}: {e}") from e
    return Resolved(url_download(loc, cache_dir=cache_dir, progress=progress), entry)


def fetch_to(name_or_path: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
             progress: bool = True) -> Resolved:
    """Like `resolve`, but the files end up in `out_dir` as plain files (for `vitlab weights get -o DIR`).

    URLs: `out_dir/<file name>` (copied from the cache when it is there, else downloaded straight to it);
    Hub repos: the files a ViT needs copied from the Hub's cache into `out_dir`; local paths: copied.
    """
    out = Path(out_dir)
    loc, entry = locate(name_or_path)
    if loc.kind == "hub":
        got = hub_download(loc, progress=progress)
        folder = got.parent if got.is_file() else got
        names = (loc.filename,) if loc.filename else HUB_WEIGHTS
        weights = got if got.is_file() else next(folder / n for n in names if (folder / n).is_file())
        for file in [weights, *(folder / n for n in HUB_CONFIG if (folder / n).is_file())]:
            if not (out / file.name).exists():
                download._copy_atomic(file, out / file.name)
        return Resolved(out / got.name if got.is_file() else out, entry)
    if loc.kind == "url":
        assert loc.url is not None
        dest = out / download.url_cache_path(loc.url, Path(".")).name
        cached = download.url_cache_path(loc.url, download.cache_root())
        if cached.is_file() and not dest.exists():
            download._check_cached(cached, loc.sha256)
            download._copy_atomic(cached, dest)
        return Resolved(download.download_url(loc.url, dest, sha256=loc.sha256, progress=progress), entry)
    assert loc.path is not None
    dest = out / loc.path.name
    if dest.exists():
        raise FileExistsError(f"{dest} already exists")
    if loc.path.is_dir():
        copytree_atomic(loc.path, dest)  # all of it or nothing (a full disk leaves no half folder)
    else:
        download._copy_atomic(loc.path, dest)
    return Resolved(dest, None)


def entry_overrides(entry: Entry | None) -> dict[str, Any]:
    """The ViTConfig fields a registry entry fixes (JSON lists made tuples); {} without an entry."""
    if entry is None or not entry.config:
        return {}
    return {k: tuple(v) if isinstance(v, list) else v for k, v in dict(entry.config).items()}


def entry_preprocess(entry: Entry | None) -> Any:
    """A registry entry's preprocessing as a `vitlab.models.preprocess.Preprocess`, or None."""
    if entry is None or not entry.preprocess:
        return None
    if isinstance(entry.preprocess, Preprocess):
        return entry.preprocess
    facts = dict(entry.preprocess)
    facts.setdefault("source", f"registry entry {entry.name}")
    if getattr(entry, "img_size", None) is not None:
        facts.setdefault("img_size", entry.img_size)
    try:
        return Preprocess.from_dict(facts)
    except (TypeError, ValueError) as e:
        raise WeightsError(f"registry entry {entry.name!r}: bad preprocess: {e}") from e


# -- the Hugging Face Hub ---------------------------------------------------------------------------------


# (repo, revision, filename, checksum, cache folder) -> what hub_download returned: loading, reading the metadata
# and the preprocessing of one name in one process asks the Hub once, not once per call.
_HUB_RESOLVED: dict[tuple[str | None, ...], Path] = {}


def hub_download(loc: Location, *, progress: bool = True, cache_dir: str | os.PathLike[str] | None = None,
                 token: str | bool | None = None, force_download: bool = False,
                 local_files_only: bool = False) -> Path:
    """Fetch a Hub repo's config and weights through huggingface_hub; returns the snapshot folder holding them
    (the weights file itself when the registry names an unusual one or the repo has no config.json).

    The one Hub download of vitlab: `resolve` (every name `load_model` takes) and `from_pretrained` call it.

    Args:
        loc: A Location of kind "hub" (`locate`, or `hub_location` for "owner/repo[@rev]").
        progress: Show huggingface_hub's progress bars (only when stderr is a terminal).
        cache_dir: The Hub cache folder (default: `hf_cache_dir()`, read now).
        token: Hub token for private or gated repos (default: huggingface_hub's, from HF_TOKEN or the login).
        force_download: Download again even when cached.
        local_files_only: Use only the cache, as offline mode does.

    Raises:
        WeightsError: gated, missing or unreachable repo, a checksum mismatch, or offline with nothing cached; the
            message says what to do.
    """
    assert loc.repo_id is not None
    cache = Path(cache_dir) if cache_dir is not None else hf_cache_dir()
    key = (loc.repo_id, loc.revision, loc.filename, loc.sha256, str(cache))
    if not force_download and key in _HUB_RESOLVED and _HUB_RESOLVED[key].exists():
        return _HUB_RESOLVED[key]
    _HUB_RESOLVED[key] = path = _hub_download(loc, progress=progress, cache=cache, token=token,
                                              force_download=force_download, local_files_only=local_files_only)
    return path


def hub_location(name: str) -> Location:
    """A Hub repo name, "owner/repo[@revision]" or "hf-hub:owner/repo[@revision]", as a Location (no network).

    Raises:
        FileNotFoundError: the name is not a Hub repo id (so, as a path, nothing is there).
    """
    repo, _, rev = name.removeprefix(HF_PREFIX).partition("@")
    if not _REPO_ID.fullmatch(repo):
        raise FileNotFoundError(f"no file or directory {name!r}, and it is not a Hub repo id (owner/name)")
    return Location("hub", name, repo_id=repo, revision=rev or None)


def _hub_download(loc: Location, *, progress: bool, cache: Path, token: str | bool | None = None,
                  force_download: bool = False, local_files_only: bool = False) -> Path:
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.utils import (  # where both 0.24 and 1.x / 2.x export them
            EntryNotFoundError,
            GatedRepoError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError as e:  # pragma: no cover - a dependency
        raise WeightsError(f"{loc.text}: reading from the Hugging Face Hub needs huggingface_hub ({e})") from e
    assert loc.repo_id is not None
    repo, offline = loc.repo_id, download.offline_reason()
    if offline is None and local_files_only:
        offline = "local_files_only=True"
    if offline is None and _hf_offline_at_import():
        offline = "HF_HUB_OFFLINE was set when huggingface_hub was imported"
    where = f"hf-hub:{repo}" + (f"@{loc.revision}" if loc.revision else "")
    kwargs: dict[str, Any] = dict(revision=loc.revision, local_files_only=offline is not None,
                                  endpoint=os.environ.get("HF_ENDPOINT") or None,  # a mirror, read at call time
                                  cache_dir=cache)
    if token is not None:
        kwargs["token"] = token
    if force_download:
        kwargs["force_download"] = True
    if (not progress or not sys.stderr.isatty()) and "tqdm_class" in inspect.signature(hf_hub_download).parameters:
        kwargs["tqdm_class"] = _quiet_tqdm()

    if offline is None:
        unreachable = _endpoint_unreachable(kwargs["endpoint"] or "https://huggingface.co")
        if unreachable is not None:  # fail (or use the cache) now, not after huggingface_hub's ~25 s of retries
            if not _hub_cached_any(repo, loc.revision, cache):
                raise _hub_unreachable(loc, where, f"the Hub cannot be reached ({unreachable})", cache)
            kwargs["local_files_only"] = True

    def get(filename: str) -> Path | None:
        """The local file, or None when the repo has no such file (or, offline, the cache does not)."""
        try:
            with _quiet_hf_logs():
                return Path(hf_hub_download(repo, filename, **kwargs))
        except GatedRepoError as e:
            raise WeightsError(f"{where} is gated: accept its terms at https://huggingface.co/{repo}, then log in "
                               "(`hf auth login`) or set HF_TOKEN") from e
        except RepositoryNotFoundError as e:
            raise WeightsError(f"{where}: no such Hub repo (or it is private: log in with `hf auth login` or set "
                               "HF_TOKEN)") from e
        except RevisionNotFoundError as e:
            raise WeightsError(f"{where}: the repo has no revision {loc.revision!r}") from e
        except LocalEntryNotFoundError:
            if offline is None and not _hub_cached_any(repo, loc.revision, cache):
                raise _hub_unreachable(loc, where, "the Hub cannot be reached", cache) from None
            return None
        except EntryNotFoundError:
            return None
        except HfHubHTTPError as e:  # any other answer (5xx after huggingface_hub's retries, 401, ...)
            raise WeightsError(f"{where}: the Hugging Face Hub did not give {filename}: {e}") from None

    names = (loc.filename,) if loc.filename else HUB_WEIGHTS
    weights = None
    for filename in names:
        weights = get(filename)
        if weights is not None:
            break
    if weights is None:
        if offline is not None:
            raise _hub_unreachable(loc, where, f"offline mode is on ({offline})", cache)
        raise WeightsError(f"{where}: the repo has none of {', '.join(names)}")
    if loc.sha256 is not None:
        _check_hub_file(weights, loc.sha256, where)
    configs = [get(filename) for filename in HUB_CONFIG]
    if weights.name in HUB_WEIGHTS and configs[0] is not None:
        return weights.parent  # the snapshot folder: config.json (+ preprocessor_config.json) beside the weights
    return weights  # a file the reader identifies by its tensors (a config.json beside it is still used)


_REACHABLE: dict[str, str | None] = {}


def _endpoint_unreachable(endpoint: str, timeout: float = 5.0) -> str | None:
    """Why the Hub endpoint's host cannot be reached (name lookup or TCP connect), or None; asked once per process."""
    if endpoint not in _REACHABLE:
        parts = urllib.parse.urlsplit(endpoint)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            _REACHABLE[endpoint] = None
        except OSError as e:
            _REACHABLE[endpoint] = f"{host}: {e.strerror or e}"
    return _REACHABLE[endpoint]


@contextlib.contextmanager
def _quiet_hf_logs() -> Iterator[None]:
    """huggingface_hub logs each retry as a warning; vitlab reports the outcome in one message instead."""
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _hf_offline_at_import() -> bool:
    """huggingface_hub reads HF_HUB_OFFLINE once, at import, and then refuses every request."""
    from huggingface_hub import constants

    return bool(getattr(constants, "HF_HUB_OFFLINE", False))


def _check_hub_file(path: Path, sha256: str, where: str) -> None:
    """A Hub weights file against the registry's sha256: in the cache an LFS file's blob is named by its sha256,
    so the name is compared (no reading); other files are hashed."""
    blob = path.resolve()
    digest = blob.name if re.fullmatch(r"[0-9a-f]{64}", blob.name) else download._sha256(blob)
    if not digest.startswith(sha256):
        raise WeightsError(f"{where}: {path.name} has sha256 {digest}, the registry expects {sha256}"
                           f"{'...' if len(sha256) < 64 else ''} (another revision of the repo?)")


def _hub_cached_any(repo: str, revision: str | None, cache: Path) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return any(isinstance(try_to_load_from_cache(repo, n, cache_dir=cache, revision=revision), str)
               for n in HUB_WEIGHTS)


def _hub_unreachable(loc: Location, where: str, why: str, cache: Path) -> WeightsError:
    assert loc.repo_id is not None
    folder = cache / ("models--" + loc.repo_id.replace("/", "--"))
    files = "config.json and " + (loc.filename or " / ".join(HUB_WEIGHTS))
    return WeightsError(
        f"{where} is not in the Hugging Face cache and {why}. On a machine with network run "
        f"`vitlab weights get {loc.text}` and copy {folder} to the same place here (the cache is HF_HUB_CACHE), or "
        f"put {files} in a folder and pass that folder's path")


def _quiet_tqdm() -> type:
    """A tqdm that never draws (huggingface_hub's `tqdm_class` when no bar is wanted)."""
    from tqdm.auto import tqdm

    class QuietTqdm(tqdm):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return QuietTqdm



# -- plain URLs (vitlab.weights.download) -----------------------------------------------------------------


def url_download(loc: Location, *, cache_dir: str | os.PathLike[str] | None = None, progress: bool = True) -> Path:
    """A URL's file in the cache, downloaded and verified if it is not there yet."""
    assert loc.url is not None
    dest = download.url_cache_path(loc.url, Path(cache_dir) if cache_dir is not None else None)
    return download.download_url(loc.url, dest, sha256=loc.sha256, progress=progress)


# -- status (for `vitlab weights show`) ---------------------------------------------------------------------


def cache_status(loc: Location) -> dict[str, Any]:
    """Where the files of a Location are or would be cached, and whether they are there (no network)."""
    if loc.kind == "path":
        return {"path": str(loc.path), "cached": True}
    if loc.kind == "url":
        assert loc.url is not None
        dest = download.url_cache_path(loc.url)
        return {"path": str(dest), "cached": dest.is_file()}
    assert loc.repo_id is not None
    from huggingface_hub import try_to_load_from_cache

    names = (loc.filename,) if loc.filename else HUB_WEIGHTS
    for n in names:
        hit = try_to_load_from_cache(loc.repo_id, n, cache_dir=hf_cache_dir(), revision=loc.revision)
        if isinstance(hit, str):
            return {"path": hit if loc.filename and loc.filename not in HUB_WEIGHTS else str(Path(hit).parent),
                    "cached": True}
    return {"path": str(hf_cache_dir() / ("models--" + loc.repo_id.replace("/", "--"))), "cached": False}
