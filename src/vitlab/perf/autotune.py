"""Measured choices, cached per machine: "which of these ways is fastest here" asked once, answered by timing.

`cached_choice(kind, shape_key, candidates, measure)` returns the candidate with the lowest measured time for this
machine (`machine_key()`), this kind of choice ("train-precision", "optimize-mode", ...) and this shape of work
("ViT-S/16 224 b32"). The first call times every candidate with `measure(candidate)` (seconds per call, lower
wins; None = the candidate cannot run here) and stores the timings; later calls, in this process or another one,
read them back. A candidate added later is measured alone, the stored ones are reused.

The cache is one JSON file, `$VITLAB_CACHE/autotune.json` (else `$XDG_CACHE_HOME/vitlab`, else `~/.cache/vitlab`),
laid out as machine -> kind -> shape -> {"timings": {candidate: seconds or null}, "winner": ..., "measured": ISO
time, "load": the load average then}. Timings taken on a busy machine (load above 1.5x the cores) are measured
again once the machine is quiet (load at most the cores). The file is rewritten atomically (vitlab.utils.io) under a
lock file (filelock), re-read inside the lock, so concurrent processes merge their results instead of losing them. An
unreadable cache is logged and measured again; a cache that cannot be written is logged and the choice still
returned.

`VITLAB_AUTOTUNE` switches it: unset / "on" (measure once, then cache), "off" (never measure: the first candidate,
which callers make their rule-of-thumb default), "refresh" (measure again, replacing the stored timings).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from filelock import FileLock

from ..utils.io import OutputError, write_atomic
from . import cpu

__all__ = ["CACHE_NAME", "NOT_NOW", "cached_choice", "default_cache", "forget", "machine_key", "mode", "timings"]

log = logging.getLogger("vitlab.autotune")

CACHE_NAME = "autotune.json"
_FLAGS = ("avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")  # what decides bf16 / int8 speed on x86
NOT_NOW: Any = type("NotNow", (), {"__repr__": lambda self: "autotune.NOT_NOW"})()
"""What `measure` returns for a candidate it did not measure this time (e.g. out of a time budget): not eligible
now, and not stored, so a later call measures it (unlike None, "cannot run here", which is stored)."""
_MODES = {"on": "on", "1": "on", "true": "on", "yes": "on", "": "on",
          "off": "off", "0": "off", "false": "off", "no": "off", "refresh": "refresh"}


def mode() -> str:
    """`VITLAB_AUTOTUNE` read: "on" (default), "off" or "refresh"; any other value is a ValueError naming it."""
    raw = os.environ.get("VITLAB_AUTOTUNE", "")
    try:
        return _MODES[raw.strip().lower()]
    except KeyError:
        raise ValueError(f"VITLAB_AUTOTUNE={raw!r} is not understood; use on, off or refresh") from None


def default_cache() -> Path:
    """`$VITLAB_CACHE/autotune.json`, else `$XDG_CACHE_HOME/vitlab/autotune.json`, else `~/.cache/vitlab/...`."""
    if os.environ.get("VITLAB_CACHE"):
        return Path(os.environ["VITLAB_CACHE"]).expanduser() / CACHE_NAME
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(base).expanduser() / "vitlab" / CACHE_NAME


def _cpu_model_and_flags() -> tuple[str, list[str]]:
    """The CPU's model name and which of `_FLAGS` it has (`vitlab.perf.cpu.cpu_model` / `cpu_flags`)."""
    flags = cpu.cpu_flags()
    return cpu.cpu_model(), [f for f in _FLAGS if f in flags]


def machine_key(device: Any = "cpu") -> str:
    """What a timing depends on: CPU model and its bf16/int8 flags, cores and torch threads, torch version, device.

    Example: "AMD EPYC | avx512f avx512_bf16 avx512_vnni | cores=2 threads=2 | torch=2.14.1 | cpu".
    A CUDA device adds the GPU's name ("cuda:NVIDIA H200"): timings on it do not carry over to another GPU.
    Kernel-emulation variables (`vitlab.perf.cpu.kernel_emulation`) are appended: timings taken with AVX2 kernels
    forced on a bigger CPU must not answer for it.
    """
    import torch

    device = torch.device(device)
    name, flags = _cpu_model_and_flags()
    cores = _cores()
    where = device.type
    if device.type == "cuda":
        where = f"cuda:{torch.cuda.get_device_name(device)}"
    emulated = " ".join(f"{k}={v}" for k, v in cpu.kernel_emulation().items())
    return (f"{name} | {' '.join(flags) or 'no-simd-flags'} | cores={cores} threads={torch.get_num_threads()} | "
            f"torch={torch.__version__} | {where}" + (f" | emulated {emulated}" if emulated else ""))


# -- the cache file --------------------------------------------------------------------------------------------


def _locked(path: Path) -> FileLock:
    """A lock on `path`.lock (filelock: fcntl on POSIX, msvcrt on Windows) held for a read-modify-write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path.with_name(path.name + ".lock")))


def _read(path: Path) -> dict[str, Any]:
    """The cache's contents; a missing file is empty, an unreadable or malformed one is logged and empty."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("autotune cache %s is unreadable (%s); measuring again", path, e)
        return {}
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        log.warning("autotune cache %s is not a machine -> kind -> shape table; measuring again", path)
        return {}
    return data


def _update(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Apply `change` to the cache under the lock and write it back atomically; a write failure is logged only."""
    try:
        with _locked(path):
            data = _read(path)
            change(data)
            write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n", overwrite=True)
    except (OutputError, OSError) as e:
        log.warning("autotune cache %s not written (%s); the choice holds for this process only", path, e)


def _table(parent: dict[str, Any], key: str) -> dict[str, Any]:
    """`parent[key]` as a dict, replacing anything malformed there by an empty one."""
    if not isinstance(parent.get(key), dict):
        parent[key] = {}
    return parent[key]  # type: ignore[no-any-return]


def _entry(data: dict[str, Any], machine: str, kind: str, shape_key: str) -> dict[str, Any]:
    kinds = data.get(machine)
    shapes = kinds.get(kind) if isinstance(kinds, dict) else None
    entry = shapes.get(shape_key) if isinstance(shapes, dict) else None
    return entry if isinstance(entry, dict) else {}


def _stored(entry: dict[str, Any]) -> dict[str, float | None]:
    """An entry's timings, keeping only well-formed ones (seconds >= 0 or null)."""
    raw = entry.get("timings", {})
    if not isinstance(raw, dict):
        return {}
    return {c: t for c, t in raw.items()
            if t is None or (isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t) and t >= 0)}


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _load() -> float | None:
    """The 1-minute load average (None where the OS has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _busy_then_quiet_now(entry: dict[str, Any]) -> bool:
    """Whether stored timings were taken on a busy machine (load above 1.5x the cores) and it is quiet now (load
    at most the cores): then they are measured again, once, rather than trusted for good."""
    then, now, cores = entry.get("load"), _load(), _cores()
    return isinstance(then, int | float) and now is not None and then > 1.5 * cores and now <= cores


def _check(kind: str, shape_key: str, candidates: Sequence[str]) -> list[str]:
    for name, value in (("kind", kind), ("shape_key", shape_key)):
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"autotune {name} must be a non-empty string, got {value!r}")
    cands = list(candidates)
    if not cands:
        raise ValueError(f"autotune {kind!r}: no candidates to choose from")
    if not all(isinstance(c, str) and c for c in cands):
        raise ValueError(f"autotune {kind!r}: candidates must be non-empty strings, got {cands!r}")
    if len(set(cands)) != len(cands):
        raise ValueError(f"autotune {kind!r}: candidates repeat: {cands!r}")
    return cands


def _seconds(kind: str, candidate: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"autotune {kind!r}: measure({candidate!r}) returned {value!r}; "
                         f"expected seconds (a finite number >= 0) or None")
    return float(value)


def _describe(t: dict[str, float | None], cands: list[str]) -> str:
    return ", ".join(f"{c} n/a" if (s := t[c]) is None else f"{c} {s * 1e3:.1f} ms" for c in cands)


def cached_choice(kind: str, shape_key: str, candidates: Sequence[str], measure: Callable[[str], float | None],
                  *, cache: Path | None = None, device: Any = "cpu") -> str:
    """The fastest of `candidates` for this machine, `kind` and `shape_key`: read from the cache, else measured.

    Args:
        kind: What is being chosen, e.g. "train-precision" (one namespace per caller).
        shape_key: The shape of the work, e.g. "vit_small_patch16 img224 b32": a timing holds only for its shape.
        candidates: Names to choose from; the first is the answer when measuring is off (`VITLAB_AUTOTUNE=off`).
        measure: `measure(candidate)` -> seconds per call (lower wins), None when the candidate cannot run here,
            or `NOT_NOW` when it was not measured this time (neither eligible nor stored). Called only for
            candidates without a stored timing, in order; its exceptions propagate.
        cache: The JSON file; default `default_cache()`.
        device: The device the work runs on (part of `machine_key`).

    Returns:
        The winning candidate. Ties go to the earlier candidate.

    Raises:
        ValueError: Empty or repeated candidates, an empty kind/shape_key, a bad `VITLAB_AUTOTUNE`, `measure`
            returning something that is not seconds, or no candidate able to run (all None).
    """
    cands = _check(kind, shape_key, candidates)
    how = mode()
    if how == "off":
        return cands[0]
    path = Path(cache) if cache is not None else default_cache()
    machine = machine_key(device)
    entry = _entry(_read(path), machine, kind, shape_key)
    if how == "refresh" or _busy_then_quiet_now(entry):
        how, stored = "refresh", {}
    else:
        stored = _stored(entry)
    fresh: dict[str, float | None] = {}
    for c in cands:
        if c not in stored and (got := measure(c)) is not NOT_NOW:
            fresh[c] = _seconds(kind, c, got)
    cands = [c for c in cands if c in stored or c in fresh]  # without those not measured now
    t = {c: fresh[c] if c in fresh else stored[c] for c in cands}
    eligible = [c for c in cands if t[c] is not None]
    if not eligible:
        raise ValueError(f"autotune {kind!r} ({shape_key}): none of {', '.join(cands)} can run on this machine")
    winner = min(eligible, key=lambda c: t[c] or 0.0)  # eligible: t[c] is not None
    if fresh:
        def change(data: dict[str, Any]) -> None:
            shapes = _table(_table(data, machine), kind)
            old = {} if how == "refresh" else _stored(_entry(data, machine, kind, shape_key))
            shapes[shape_key] = {"timings": {**old, **fresh}, "winner": winner, "load": _load(),
                                 "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

        _update(path, change)
    log.debug("autotune %s [%s]: %s -> %s (%s)", kind, shape_key, _describe(t, cands), winner,
             "measured" if len(fresh) == len(cands) else "cached" if not fresh else "partly cached")
    return winner


def timings(kind: str, shape_key: str, *, cache: Path | None = None, device: Any = "cpu") -> dict[str, float | None]:
    """The stored timings (seconds, None = could not run) of this machine for `kind` and `shape_key`; {} if none."""
    path = Path(cache) if cache is not None else default_cache()
    return _stored(_entry(_read(path), machine_key(device), kind, shape_key))


def forget(kind: str | None = None, *, cache: Path | None = None) -> int:
    """Remove stored timings: of `kind` (on every machine), or all of them (None). Returns how many shapes went."""
    path = Path(cache) if cache is not None else default_cache()
    removed = 0

    def change(data: dict[str, Any]) -> None:
        nonlocal removed
        for machine in list(data):
            kinds = data[machine]
            for k in [k for k in kinds if kind is None or k == kind]:
                removed += len(kinds.pop(k)) if isinstance(kinds[k], dict) else 1
            if not kinds:
                del data[machine]

    if path.exists():
        _update(path, change)
    return removed
