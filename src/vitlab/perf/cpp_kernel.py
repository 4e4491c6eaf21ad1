"""vitlab's own C++ kernels (the `*.cpp` files beside this one), compiled on first use by Inductor's C++ builder.

Each file is C ABI, loaded with ctypes and called from a `torch.library.custom_op` (`int8_attention`). Inductor's
builder is the compiler `torch.compile` already needs on the CPU: same flags (`-O3
-march=native -fopenmp`, no FMA contraction), same on-disk cache (keyed by the source text), so a kernel is built
once per machine (~1-2 s) and loaded from disk after that.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.resources
import threading
from typing import Any

__all__ = ["kernel"]

_lock = threading.Lock()


@functools.cache
def _library(filename: str) -> Any:
    from torch._inductor.codecache import CppCodeCache

    source = importlib.resources.files("vitlab.perf").joinpath(filename).read_text(encoding="utf-8")
    return CppCodeCache.load(source)


def kernel(filename: str, symbol: str, argtypes: list[Any], fix: str) -> Any:
    """The C function `symbol` of vitlab/perf/`filename` (a ctypes function returning int, taking `argtypes`),
    compiled on the first call.

    Raises:
        RuntimeError: It does not compile here (no compiler, or one without the ISA's intrinsics): one line naming
            the file and the compiler's first line of complaint, then `fix` (what to use instead).
    """
    with _lock:
        try:
            lib = _library(filename)
        except Exception as e:
            first = str(e).splitlines()[0] if str(e) else ""
            raise RuntimeError(f"could not compile vitlab's kernel {filename} ({type(e).__name__}: {first}); "
                               f"{fix}") from e
    fn = getattr(lib, symbol)
    fn.restype = ctypes.c_int
    fn.argtypes = argtypes
    return fn
