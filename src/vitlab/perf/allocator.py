"""Keep freed activation memory in the process instead of returning it to the kernel (Linux glibc only), or, for
inference over many inputs, hand it back between batches (`release_freed_memory`).

A training step allocates and frees the same large activation buffers every step. glibc serves blocks above
its mmap threshold with fresh `mmap` pages and unmaps them on free, so every step pays page faults and the
kernel's zeroing of those pages again: on this 2-core VM that was ~25% of the step time as system time
(`/usr/bin/time`: 9-28 s sys in a 90 s run). Raising the mmap threshold to glibc's maximum (32 MiB on 64-bit)
and switching off heap trimming keeps the buffers in the heap for reuse: the Fashion-MNIST recipe went from
~292 to ~340 images/s and system time fell to ~2.5 s (docs/speed.md). The same effect as the environment
variables MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_, applied from inside the process so `vitlab train`
and library users get it without a wrapper script. Memory held grows by at most the peak of one step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from typing import Any

# glibc's mallopt parameter numbers (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc's ceiling on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)


@functools.cache
def _libc_function(name: str) -> Any:
    """glibc's `name` (mallopt, malloc_trim), or None off Linux or without glibc."""
    if not sys.platform.startswith("linux"):
        return None
    lib = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(lib), name) if lib else None
    except (OSError, AttributeError):  # musl and others have no mallopt / malloc_trim
        return None


def _mallopt(*settings: tuple[int, int]) -> bool:
    """Apply glibc mallopt (parameter, value) pairs; True when every one was accepted. Nothing when the user set
    MALLOC_MMAP_THRESHOLD_ (their choice of allocator settings wins)."""
    mallopt = _libc_function("mallopt")
    if mallopt is None or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return all([mallopt(param, value) == 1 for param, value in settings])


_keeping = False  # keep_freed_memory is in force: release_freed_memory leaves the heap alone


@functools.cache
def keep_freed_memory() -> bool:
    """Tune glibc malloc for repeated large allocations; True when applied. A no-op (False) off Linux/glibc,
    or when the user already set MALLOC_MMAP_THRESHOLD_ (their choice wins). Once applied, `release_freed_memory`
    does nothing in this process: what is kept is meant to be reused."""
    global _keeping
    _keeping = _mallopt((_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX), (_M_TRIM_THRESHOLD, 2**31 - 1),
                        (_M_TOP_PAD, 64 * 1024 * 1024))
    return _keeping


_INFERENCE_MMAP_THRESHOLD = 256 * 1024


@functools.cache
def bounded_heap() -> bool:
    """The opposite of `keep_freed_memory`, for a process that runs inference over many inputs (`vitlab predict`,
    `vitlab eval`): blocks of 256 KiB and more (activations, autocast's bf16 weight copies) get their own `mmap`
    and go back to the kernel when freed, so the heap cannot fragment around them and the peak resident set stays
    that of one batch. glibc otherwise raises its mmap threshold to the largest block freed so far and serves later
    blocks from the heap: ViT-S/16 eval at batch 16 peaked ~95 MiB higher (975 against 882 MiB, 4,000 images). True
    when applied; a no-op (False) off Linux/glibc or when MALLOC_MMAP_THRESHOLD_ is set (the user's choice wins).
    Set once per process by the commands (`--memory bounded`, their default), never by library calls. It costs
    speed: every batch's activations are new mappings the kernel faults in and zeroes again (ViT-S/16 bf16 eval of 800
    images: 12.7 million page faults, 1.5-1.6x the time with `keep_freed_memory`, which `--memory reuse` applies;
    docs/speed.md, "Memory")."""
    return _mallopt((_M_MMAP_THRESHOLD, _INFERENCE_MMAP_THRESHOLD))


def release_freed_memory() -> bool:
    """Return the heap's free pages to the kernel now (glibc `malloc_trim(0)`); True when it could. Called between
    the batches of `vitlab predict` / `vitlab eval`: glibc keeps freed blocks of one batch's activations (bf16
    autocast's weight copies among them), and the next batch's blocks, which do not always fit the holes, grow the
    heap, so without it the peak resident set crept up with the number of batches (ViT-S/16 bf16 eval: 928 MiB
    after 26 batches, 983 MiB after 226; with it 946 MiB from batch 26 on). Costs about a millisecond, and the pages
    it hands back are faulted in again by the next batch. False, and nothing done, in a process that keeps freed
    memory (`keep_freed_memory`: a training process, or `vitlab eval/predict --memory reuse`)."""
    trim = _libc_function("malloc_trim")
    if trim is None or _keeping:
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return True
