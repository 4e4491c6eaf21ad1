"""A run directory: what marks it as holding a run, the lock that lets one process at a time write into it, and
the checks before training writes into it.

    run_dir/recipe.yaml      the recipe as run (written once; a resume must match it)
    run_dir/metrics.jsonl    one JSON row per log / eval / evaluator event (`report.read_metrics` reads it back)
    run_dir/checkpoints/     atomic, resumable checkpoints (`vitlab.train.checkpoint`)
    run_dir/tb/              TensorBoard events
    run_dir/model.safetensors, report.md, report.json, curves.png   written when the run completes
    run_dir/.vitlab-run.lock held by the process training in it (`RunLock`); removed when it ends
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import secrets
import socket
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import yaml

from ..utils.io import write_atomic
from . import checkpoint as ckpt
from .evalconfig import upgrade
from .recipe import Recipe

logger = logging.getLogger("vitlab.train")

# Keys of a run's recipe that may change between an interrupted run and its --resume (they do not change what the
# optimizer sees); and of `train.evaluators` (`_may_change`): every evaluator's batch_size, the classification one's
# `every`, and fewshot evaluators altogether (added, removed or changed). Early stopping's rule may not change.
RESUMABLE_CHANGES = {"train.checkpoint_every", "train.log_every", "train.keep_checkpoints", "train.max_bad_steps"}
RESUMABLE_EVALUATOR_CHANGES = "train.evaluators: any batch_size, classification's every, fewshot evaluators"
RUN_MARKERS = ("recipe.yaml", "metrics.jsonl", "checkpoints")
LOCK_NAME = ".vitlab-run.lock"

# The files a run writes with `vitlab.utils.io.write_atomic`, by folder: a `.tmp-<hex>-<name>` temporary of one of them
# found at the start of the run (which holds the lock) was left by a killed write of an earlier process of it.
_TMP = r"(?:\.tmp-[0-9a-f]{8}-)+"  # nested writes (a staged group) stack the prefix
_STALE_TEMPS = {
    "": re.compile(_TMP + r"(recipe\.yaml|model\.safetensors|report\.json|report\.md|curves\.png)"),
    "checkpoints": re.compile(_TMP + r"step_\d{8}\.(safetensors|state\.pt)"),
}
# flock(2) errors of file systems that do not lock (some NFS set-ups, FUSE/SMB mounts): the pid file is used instead.
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL}


class RunDirError(FileExistsError):
    """A run directory already holds a run and --resume was not given (or nothing to resume)."""


class RunLockedError(RunDirError):
    """Another live process is training in this run directory."""


# -- the lock -----------------------------------------------------------------------------------------------------


def _process_start(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat field 22), to tell a reused pid from the
    process that wrote a lock; None where /proc is not there."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(holder: dict[str, Any]) -> bool:
    """Whether the process a lock file names still runs (assumed so when it is on another host: not knowable)."""
    if holder.get("host") != socket.gethostname():
        return True
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    started = holder.get("pid_start")
    return started is None or _process_start(pid) in (None, started)


def _parse_holder(data: bytes) -> dict[str, Any]:
    try:
        holder = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


class RunLock:
    """An exclusive lock on a run directory, held by the process that trains in it from its checks to its report.

    `flock(2)` on `run_dir/.vitlab-run.lock`: the kernel drops it when the process ends in any way (SIGKILL, a
    crash, a power cut), so a dead run never leaves the directory locked. The file holds the holder's pid, host,
    start time and command line for the refusal message. On file systems without flock the file's existence is the
    lock (created with O_EXCL) and a lock whose process is gone (same host, pid not running or reused) is taken
    over. `acquire` raises `RunLockedError` when a live process holds it; `release` removes the file.

    Example:
        with RunLock(run_dir):
            ...  # nobody else trains in run_dir meanwhile
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._fd: int | None = None
        self._pid_file: bytes | None = None  # what we wrote, with the flock-less fallback
        self._made_dir = False

    def _record(self) -> bytes:
        pid = os.getpid()
        return json.dumps({"pid": pid, "host": socket.gethostname(), "pid_start": _process_start(pid),
                           "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                           "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else ""}
                          ).encode()

    def _refuse(self, holder: dict[str, Any]) -> RunLockedError:
        who = (f"process {holder.get('pid', '?')} on {holder.get('host', '?')} since {holder.get('since', '?')}"
               if holder else "another process")
        cmd = f" ({holder['command']})" if holder.get("command") else ""
        return RunLockedError(f"run directory {self.run_dir} is in use by {who}{cmd}; wait for it to end or stop it, "
                              f"or choose another -o RUN_DIR (lock file {self.path})")

    def acquire(self) -> RunLock:
        """Take the lock (creating the run directory if needed).

        Raises:
            RunLockedError: A live process holds it.
        """
        if self._fd is not None or self._pid_file is not None:
            raise RuntimeError(f"{self.path} is already held by this RunLock")
        self._made_dir = not self.run_dir.exists()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            import fcntl
        except ImportError:  # Windows
            self._acquire_pid_file()
            return self
        while True:
            created = False
            try:
                fd = os.open(self.path, os.O_RDWR)
            except FileNotFoundError:
                try:
                    fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                    created = True
                except FileExistsError:
                    continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _parse_holder(os.pread(fd, 65536, 0))
                os.close(fd)
                raise self._refuse(holder) from None
            except OSError as e:
                os.close(fd)
                if e.errno not in _NO_FLOCK:
                    raise
                if created:  # the file we just made would read as a held lock
                    self.path.unlink(missing_ok=True)
                self._acquire_pid_file()
                return self
            try:  # a holder removes the file before it unlocks: what we locked may no longer be the lock file
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.pwrite(fd, self._record(), 0)
                self._fd = fd
                return self
            os.close(fd)

    def _acquire_pid_file(self) -> None:
        record = self._record()
        for _ in range(10):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            try:
                os.write(fd, record)
            finally:
                os.close(fd)
            self._pid_file = record
            return
        raise self._refuse({})

    def _take_over_if_stale(self) -> None:
        """Remove a pid-file lock whose process is gone; RunLockedError if it is alive (or cannot be told)."""
        try:
            seen = self.path.read_bytes()
        except FileNotFoundError:
            return  # released meanwhile
        holder = _parse_holder(seen)
        if not holder or _alive(holder):  # empty: being written by its creator (or left by a kill just then)
            raise self._refuse(holder)
        # move it aside, then check that what moved is what was judged stale (not a lock just taken over by another)
        aside = self.path.with_name(f"{LOCK_NAME}.stale-{secrets.token_hex(4)}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        if aside.read_bytes() != seen:  # a live lock: put it back
            with contextlib.suppress(OSError):
                os.link(aside, self.path)
            aside.unlink(missing_ok=True)
            raise self._refuse(_parse_holder(self.path.read_bytes() if self.path.exists() else b""))
        aside.unlink()
        logger.info("took over the lock of process %s on %s (no longer running) in %s", holder.get("pid"),
                    holder.get("host"), self.run_dir)

    def release(self) -> None:
        """Remove the lock file and unlock (and remove the run directory if this lock made it and it is empty)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)  # before unlocking: a waiter that opened this file sees it is gone
            os.close(self._fd)
            self._fd = None
        elif self._pid_file is not None:
            with contextlib.suppress(OSError):
                if self.path.read_bytes() == self._pid_file:
                    self.path.unlink()
            self._pid_file = None
        if self._made_dir:
            with contextlib.suppress(OSError):
                self.run_dir.rmdir()  # only if empty: a run that failed before writing anything leaves no folder
            self._made_dir = False

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def remove_stale_temps(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporaries that killed atomic writes of this run left (`.tmp-<hex>-<name>` of the run's own
    files in the run directory and checkpoints/). Call it holding the run's lock: then no live writer owns them."""
    removed = []
    for sub, pattern in _STALE_TEMPS.items():
        folder = Path(run_dir) / sub
        if not folder.is_dir():
            continue
        for p in folder.iterdir():
            if pattern.fullmatch(p.name) and not p.is_dir():
                size = p.lstat().st_size
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
                    removed.append(p)
                    logger.info("removed %s (%.1f MB), left by a write that was killed", p, size / 1e6)
    return removed


# -- the checks before a run writes ------------------------------------------------------------------------------


def check_run_dir(run_dir: Path, resume: bool) -> bool:
    """Refuse to write into a run directory that holds a run unless resuming; refuse to resume nothing.

    Returns:
        Whether to resume from a checkpoint: False for a new run, and for a --resume of a run that was stopped
        before its first checkpoint (it starts again from step 0 in the same directory, with a warning).
    """
    held = [m for m in RUN_MARKERS if (run_dir / m).exists()]
    steps = ckpt.list_checkpoints(run_dir / "checkpoints")
    if held and not resume:
        how = (f"pass --resume to continue it from its checkpoint of step {steps[-1]}" if steps else
               "it has no checkpoint yet: pass --resume to start it again from step 0 there")
        raise RunDirError(f"run directory {run_dir} already holds a run ({', '.join(held)}); {how}, or choose "
                          f"another -o RUN_DIR")
    if not resume or steps:
        return resume
    if not (run_dir / "recipe.yaml").is_file():
        raise RunDirError(f"--resume: {run_dir} holds no run to resume (no recipe.yaml, no checkpoint); run without "
                          f"--resume to start one")
    warnings.warn(f"--resume: {run_dir} has no checkpoint yet (its run stopped before the first); starting it "
                  f"again from step 0 in the same directory", stacklevel=2)
    return False


def check_same_recipe(run_dir: Path, recipe: Recipe) -> None:
    """Refuse to resume with a recipe that differs from the run's recipe.yaml outside `RESUMABLE_CHANGES`."""
    saved_path = run_dir / "recipe.yaml"
    if not saved_path.is_file():
        return
    try:
        before = read_run_recipe(saved_path, check_data=False)
    except ValueError as e:
        raise ValueError(f"--resume: the run's {saved_path}: {e}") from None
    saved, now = _flatten(before.to_dict()), _flatten(recipe.to_dict())
    diff = sorted(k for k in set(saved) | set(now)
                  if saved.get(k) != now.get(k) and not _may_change(k, before, recipe))
    if diff:
        details = "; ".join(f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in diff)
        raise ValueError(f"--resume: the recipe differs from the run's {saved_path} ({details}); resuming needs the "
                         f"same recipe (only {sorted(RESUMABLE_CHANGES)} and {RESUMABLE_EVALUATOR_CHANGES} may "
                         f"change)")


def read_run_recipe(path: str | os.PathLike[str], *, check_data: bool = True) -> Recipe:
    """A run's recipe.yaml as a `Recipe`; one written before `train.evaluators` took the evaluation keys is read in
    the new form (`evalconfig.upgrade`: the same evaluations)."""
    d = yaml.safe_load(Path(path).read_text())
    if isinstance(d, dict) and isinstance(d.get("train"), dict):
        d = {**d, "train": upgrade(d["train"])}
    return Recipe.from_dict(d, check_data=check_data)


def _may_change(key: str, *recipes: Recipe) -> bool:
    """Whether the flattened recipe key may differ between a run and its --resume (`RESUMABLE_CHANGES`)."""
    if key in RESUMABLE_CHANGES:
        return True
    parts = key.split(".")
    if parts[:2] != ["train", "evaluators"] or len(parts) != 4:
        return False
    name, field = parts[2:]
    types = {r.train.evaluators[name].type for r in recipes if name in r.train.evaluators}
    return types == {"fewshot"} or field == "batch_size" or (types == {"classification"} and field == "every")


def resume_point(ckpt_dir: Path, world_size: int, device: str | torch.device = "cpu"
                 ) -> tuple[Path, dict[str, torch.Tensor], dict[str, Any]]:
    """(weights path, weights, training state) of the checkpoint a resume continues from: the newest whose both
    files load (older ones are tried, with a warning naming the damaged file). It must have been written by as
    many processes as this run has (data positions and RNGs are per process)."""
    found = ckpt.load_latest_checkpoint(ckpt_dir, device=device)
    if found is None:
        raise RunDirError(f"--resume: no loadable checkpoint in {ckpt_dir} (all are damaged); to start the run again "
                          f"from step 0, remove {ckpt_dir} and pass --resume")
    if found.state.get("world_size", 1) != world_size:
        raise ValueError(f"--resume: the checkpoint was written by {found.state.get('world_size', 1)} processes, this "
                         f"run has {world_size}; resume with the same number (data positions are per process)")
    return found.weights_path, found.weights, found.state


def write_recipe(run_dir: Path, recipe: Recipe) -> None:
    """recipe.yaml, atomically (a new run only; a resumed run keeps the one it started with)."""
    write_atomic(run_dir / "recipe.yaml", recipe.to_yaml(), overwrite=True)


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and k != "overrides":
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
