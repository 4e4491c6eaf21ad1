"""glibc allocator settings (vitlab.perf.allocator): measured on this process's resident set, not on our word."""

from __future__ import annotations

import ctypes
import sys

import pytest

from vitlab.perf import allocator

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or allocator._libc_function("mallopt") is None,
                                reason="glibc only")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def test_release_freed_memory_returns_freed_heap_pages_to_the_kernel():
    """128 MiB of 64 KiB blocks (below glibc's mmap threshold: served from the heap), all freed but the last (which
    pins the heap's top, so glibc's own trimming of the top cannot hand anything back): the pages stay resident
    until `release_freed_memory`, which gives back nearly all of them."""
    malloc, free = ctypes.CDLL(None).malloc, ctypes.CDLL(None).free
    malloc.restype, malloc.argtypes, free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
    blocks = [malloc(64 * 1024) for _ in range(2048)]
    for b in blocks:
        ctypes.memset(b, 1, 64 * 1024)  # touched: resident
    for b in blocks[:-1]:
        free(b)
    before = _rss_mb()
    assert allocator.release_freed_memory()
    after = _rss_mb()
    free(blocks[-1])
    assert before - after > 96, f"resident {before:.0f} MiB before malloc_trim, {after:.0f} MiB after"


def test_mallopt_leaves_the_users_own_setting_alone(monkeypatch):
    """MALLOC_MMAP_THRESHOLD_ in the environment: the user chose; neither setting is applied."""
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert allocator._mallopt((allocator._M_TOP_PAD, 1 << 20)) is False
