"""vitlab's own C++ kernels, built on first use and registered as torch ops (`vitlab::...`) through torch's stable
C ABI (`torch/csrc/stable`), so a compiled graph calls them the way it calls torch's own: Inductor's C++ wrapper
goes straight to the C++ kernel through the dispatcher, with no trip through Python (a Python op cost ~50-140 us a
call between two GEMMs, measured on a 2-core Zen 4).

    lib = load("int8_attention.cpp")   # the file beside this one; compiled once per source and machine, cached on
                                       # disk by Inductor's C++ builder (the compiler torch.compile uses); loading
                                       # it registers its ops' CPU kernels

The ops themselves (shape functions, the Python entry points that check their inputs) are in the modules that own
them (`int8_attention`, `layernorm_quant`, `int8_linear`), each defining its ops with `define_op(source, schema)`,
which also registers `cpu_fallback` until the library is loaded: it loads it, then calls the op again, which now
reaches the C++ kernel.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.resources
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["build_error", "cpu_fallback", "define_op", "load"]

_lock = threading.Lock()  # one compile at a time (a server's threads may all ask for a kernel first)
_library: Any = None  # the torch.library fragment of namespace "vitlab" the ops are defined in (kept alive here)


@functools.cache
def load(source: str) -> ctypes.CDLL:
    """Build (once) and load `source`, a C++ file of this package; its ops' kernels are registered with torch.

    Raises:
        RuntimeError: One line: it does not compile here (no compiler, one without AVX-512 intrinsics, no torch
            headers) or does not load.
    """
    from torch._inductor.codecache import CppCodeCache  # Inductor's builder: the compiler torch.compile uses

    class _WithTorch(CppCodeCache):  # the same builder, with torch's headers and libraries (for the stable C ABI)
        cache: dict[str, Any] = {}  # noqa: RUF012  (as declared by CppCodeCache)
        cpp_compile_command_flags: dict[str, Any] = {"include_pytorch": True}  # noqa: RUF012

    files = importlib.resources.files("vitlab.perf")
    # native.h (the CPU checks every kernel makes) first, as if each file included it
    text = files.joinpath("native.h").read_text(encoding="utf-8") + files.joinpath(source).read_text(encoding="utf-8")
    with _lock:
        try:
            return _WithTorch.load(text)  # type: ignore[no-any-return]
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise RuntimeError(f"could not build vitlab's {source} kernels ({type(e).__name__}: {first})") from e


def build_error(source: str) -> str | None:
    """Why `source` does not build or load here (`load`'s one line), or None once it has."""
    try:
        load(source)
    except RuntimeError as e:
        return str(e)
    return None


def cpu_fallback(source: str, op: Any) -> Callable[..., Any]:
    """A Python kernel for `op` (an OpOverload whose C++ kernel is in `source`) to register as its
    CompositeExplicitAutograd kernel: loads the library (which registers the C++ CPU kernel, taking precedence from
    then on) and calls the op again. A CPU kernel that does not build raises `load`'s RuntimeError."""
    import torch

    name = op._schema.name

    def run(*args: Any) -> Any:
        elsewhere = {str(a.device) for a in args if isinstance(a, torch.Tensor) and a.device.type != "cpu"}
        if elsewhere:
            raise ValueError(f"{name} runs on the CPU; got tensors on {', '.join(sorted(elsewhere))}")
        load(source)
        if not torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU"):
            raise RuntimeError(f"vitlab's {source} loaded without a CPU kernel for {name}")
        return op(*args)

    return run


def define_op(source: str, schema: str) -> Any:
    """Define the op `vitlab::<schema>` (e.g. "int8_linear(Tensor x, ...) -> Tensor") whose CPU kernel is in
    `source`, a C++ file of this package, with `cpu_fallback` as its kernel until that library is loaded; returns
    its OpOverload (`torch.ops.vitlab.<name>.default`)."""
    import torch

    global _library
    if _library is None:
        _library = torch.library.Library("vitlab", "FRAGMENT")
    name = schema.split("(", 1)[0]
    _library.define(schema)
    op = getattr(torch.ops.vitlab, name).default
    _library.impl(name, cpu_fallback(source, op), "CompositeExplicitAutograd")
    return op
