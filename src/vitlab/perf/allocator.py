"""Keep freed activation memory in the process instead of returning it to the kernel (Linux glibc only).

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

# glibc's mallopt parameter numbers (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc's ceiling on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)


@functools.cache
def keep_freed_memory() -> bool:
    """Tune glibc malloc for repeated large allocations; True when applied. A no-op (False) off Linux/glibc,
    or when the user already set MALLOC_MMAP_THRESHOLD_ (their choice wins)."""
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1 and ok
    ok = mallopt(_M_TOP_PAD, 64 * 1024 * 1024) == 1 and ok
    return ok
