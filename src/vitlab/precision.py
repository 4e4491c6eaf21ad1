"""Mixed precision: what `precision: auto` means on this machine, and the autocast context for a precision.

bf16 autocast keeps weights and optimizer state in fp32 and runs matmuls in bf16. It pays where the hardware has
fast bf16 matmuls (a CUDA GPU with bf16, a CPU with AMX tiles); elsewhere fp32 is faster (measured 2x slower bf16
on AVX-512 alone, docs/speed.md), so "auto" picks fp32 there.
torch is imported only when a function runs: recipes validate without it.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PRECISIONS = ("auto", "bf16", "fp32")


@functools.cache
def cpu_has_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU has AMX bf16 tiles (Linux: the amx_bf16 flag in /proc/cpuinfo; False elsewhere)."""
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            return any(line.startswith("flags") and "amx_bf16" in line.split() for line in f)
    except OSError:
        return False


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """"auto" -> "bf16" where bf16 is the fast path (a CUDA GPU with bf16, a CPU with AMX), else "fp32"."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if precision != "auto":
        return precision
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if device.type == "cpu" and cpu_has_amx() else "fp32"


def autocast(device: torch.device | str, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on CPU and GPU (weights stay fp32); a no-op context for fp32; "auto" as `resolve_precision`."""
    import torch

    device = torch.device(device)
    if resolve_precision(precision, device) == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
