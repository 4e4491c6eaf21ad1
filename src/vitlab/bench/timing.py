"""Timing, memory and the machine: what every measurement in `vitlab.bench` and `benchmarks/` is made of.

    from vitlab.bench.timing import time_calls
    seconds = time_calls(lambda: model(x), warmup=2, rounds=5, iters=1)   # one entry per round

`time_calls` synchronises CUDA before reading the clock, so a GPU call is timed to its end, not its launch; it
is `vitlab.perf.precision.time_rounds` (vitlab's one timer, interleaving candidates) with one candidate.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.nn.functional as F

from ..perf import cpu, precision
from ..perf.cpu import EMULATION_VARS

__all__ = ["EMULATION_VARS", "loadavg", "machine_info", "matmul_peak", "peak_memory", "perturb_", "sync",
           "time_calls"]


M = TypeVar("M", bound=torch.nn.Module)


def perturb_(model: M, std: float = 0.02) -> M:
    """Add N(0, std) noise to every parameter in place and return the model: a randomly initialised ViT has a zero
    head (every logit 0), so speed and agreement checks on it would compare nothing."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * std)
    return model


def sync(device: str | torch.device) -> None:
    """Wait for the device's queued work (CUDA); a no-op on the CPU."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def time_calls(
    fn: Callable[[], object], warmup: int = 2, rounds: int = 5, iters: int = 1, device: str | torch.device = "cpu"
) -> list[float]:
    """Seconds per call of `fn()`, one entry per round of `iters` calls, after `warmup` untimed calls
    (`vitlab.perf.precision.time_rounds` with one candidate: vitlab's one timer).

    Args:
        fn: The call to time (close over its inputs).
        warmup: Calls before timing starts (allocator, caches, lazy initialisation, compilation).
        rounds: Timed rounds; report their median and spread rather than one number.
        iters: Calls per round, averaged (raise it for calls of well under a millisecond).
        device: Synchronised before each clock reading when it is a CUDA device.
    """
    return precision.time_rounds(lambda _: fn(), ("call",), device=device, warmup=warmup, rounds=rounds,
                                 iters=iters)["call"]


def matmul_peak(dtype: torch.dtype, device: str = "cpu", n: int = 2048, rounds: int = 5) -> float:
    """The best FLOP/s of an n x n x n matmul in `dtype`, over the two layouts a model uses: `a @ b` and a Linear
    layer's `a @ w.T` with w stored (out, in), whose oneDNN kernels differ by up to 3x in bf16 on some CPUs
    (int8: int8 x int8 -> int32 via torch._int_mm)."""
    if dtype == torch.int8:
        a = torch.randint(-64, 64, (n, n), dtype=torch.int8, device=device)
        b = torch.randint(-64, 64, (n, n), dtype=torch.int8, device=device)
        fns = [lambda: torch._int_mm(a, b)]
    else:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        fns = [lambda: a @ b, lambda: F.linear(a, b)]
    best = min(min(time_calls(fn, warmup=2, rounds=rounds, iters=2, device=device)) for fn in fns)
    return 2 * n**3 / best


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _malloc_trim() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def peak_memory(fn: Callable[[], object], device: str = "cpu") -> int | None:
    """Bytes the call `fn()` needs above what is already held: CUDA's allocator peak, or on CPU the largest rise
    of the resident set (sampled every millisecond, freed heap returned to the OS first). None where the resident
    set cannot be read (no /proc)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    if not os.path.exists("/proc/self/statm"):
        return None
    _malloc_trim()
    base = _rss()
    peak = [base]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.001)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        fn()
    finally:
        done.set()
        thread.join()
    peak[0] = max(peak[0], _rss())
    return peak[0] - base


def machine_info() -> dict:
    """`vitlab.perf.cpu.machine_summary()` (CPU model, host class and the flags behind it, cores, threads, kernel
    emulation, the current load: what a result is only valid for) plus the versions of the peers a benchmark
    compares against."""
    info: dict[str, Any] = cpu.machine_summary()
    for lib in ("timm", "transformers", "torchvision", "onnxruntime"):
        with contextlib.suppress(ImportError):
            info[lib] = __import__(lib).__version__
    return info


def loadavg() -> list[float] | None:
    """The 1, 5 and 15-minute load averages, or None where the OS has none."""
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None
