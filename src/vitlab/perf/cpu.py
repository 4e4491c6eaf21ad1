"""This CPU: its /proc/cpuinfo flags and model, and the class of x86 host they make it (AVX2 / AVX-512 /
AVX-512+VNNI / AMX), which decides which precisions and int8 kernels can be fast.

`cpu_flags()` is the one reader of /proc/cpuinfo; `vitlab.perf.precision`, `vitlab.perf.autotune`,
`vitlab.deploy` and `vitlab.bench` all ask it. `machine_summary()` is the one description of the machine a result was
measured on (`vitlab bench`, `vitlab reproduce`, `vitlab demo` and `benchmarks/` record it).
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Collection
from typing import Any


@functools.cache
def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """This CPU's feature flags as Linux lists them in /proc/cpuinfo ("avx2", "avx512_vnni", "amx_bf16", ...);
    empty where there is no such file or no x86 "flags" line in it (another OS; ARM lists "Features")."""
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


@functools.cache
def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """This CPU's model name (Linux: "model name" in /proc/cpuinfo; else the platform's processor name)."""
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def lacking(required: Collection[str], needs: str) -> str | None:
    """One line, `needs` and the flags of `required` this CPU lacks ("int8_linear needs AVX512-VNNI; this CPU lacks
    avx512_vnni"), or None when it has them all: what vitlab's own C++ kernels say before they would run an
    instruction the CPU does not have."""
    flags = cpu_flags()
    missing = [f for f in required if f not in flags]
    return f"{needs}; this CPU lacks {', '.join(missing)}" if missing else None


def cpu_has_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU has AMX bf16 tiles (Linux: the amx_bf16 flag in /proc/cpuinfo; False elsewhere)."""
    return "amx_bf16" in cpu_flags(cpuinfo)


# -- host classes: what decides which precisions and int8 kernels can be fast on an x86 CPU ------------------------

HOST_CLASSES = ("AVX2", "AVX-512", "AVX-512+VNNI", "AMX", "other")
BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # native bf16 dot products (AMX tiles, VDPBF16PS)
INT8_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni")  # int8 dot products accumulated in int32 (AMX tiles, VPDPBUSD)


EMULATION_VARS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "FBGEMM_ENABLE_INSTRUCTIONS", "MKL_ENABLE_INSTRUCTIONS")


def kernel_emulation() -> dict[str, str]:
    """The variables set in the environment that make torch/Inductor, oneDNN, FBGEMM or MKL run a lesser CPU's
    kernels (e.g. `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 ...` on an AVX-512 host): timings taken so are
    not this host's, and `host_class()` still names the real CPU."""
    return {k: os.environ[k] for k in EMULATION_VARS if os.environ.get(k)}


def host_class(flags: Collection[str] | None = None) -> str:
    """The class of x86 CPU that `flags` (default: this CPU's, `cpu_flags()`) describe, for speed decisions and
    for labelling measurements: "AMX" (amx_bf16 / amx_int8 tiles), "AVX-512+VNNI", "AVX-512", "AVX2", or "other"
    (no x86 flags known: another architecture or OS). An AVX2 CPU with AVX-VNNI (Alder Lake and later) is class
    "AVX2"; `native_int8` tells its int8 apart."""
    flags = cpu_flags() if flags is None else flags
    if "amx_bf16" in flags or "amx_int8" in flags:
        return "AMX"
    if "avx512f" in flags:
        return "AVX-512+VNNI" if "avx512_vnni" in flags else "AVX-512"
    return "AVX2" if "avx2" in flags else "other"


def native_bf16(flags: Collection[str] | None = None) -> bool | None:
    """Whether the CPU computes bf16 dot products natively (amx_bf16 or avx512_bf16); None when its flags are
    unknown (not Linux x86). Without them torch and oneDNN convert bf16 to fp32 around every multiply."""
    flags = cpu_flags() if flags is None else flags
    return any(f in flags for f in BF16_FLAGS) if flags else None


def bf16_kernels() -> bool:
    """Whether bf16 runs at native speed in this process: the CPU has native bf16 dot products (`native_bf16`) and
    no kernel-emulation variable (`kernel_emulation`) holds torch / oneDNN to a lesser CPU's kernels."""
    return bool(native_bf16()) and not kernel_emulation()


def amx_kernels() -> bool:
    """Whether AMX tiles run in this process: the CPU has them (`cpu_has_amx`) and no kernel-emulation variable
    (`kernel_emulation`) holds torch / oneDNN to a lesser CPU's kernels."""
    return cpu_has_amx() and not kernel_emulation()


def native_int8(flags: Collection[str] | None = None) -> bool | None:
    """Whether the CPU accumulates int8 products in int32 natively (amx_int8, avx512_vnni or avx_vnni); None when
    its flags are unknown. Without them x86 int8 GEMMs use VPMADDUBSW (u8 x s8 pairs summed in int16)."""
    flags = cpu_flags() if flags is None else flags
    return any(f in flags for f in INT8_FLAGS) if flags else None


SPEED_FLAGS = (*BF16_FLAGS, *INT8_FLAGS, "avx512f", "avx2")  # the flags that decide the host class and fast kernels


def machine_summary() -> dict[str, Any]:
    """What a measurement is only valid for: {"cpu" (model), "host_class" (`host_class`), "cpu_flags" (which of
    `SPEED_FLAGS` it has), "cores", "torch_threads", "torch", "python", "platform", "cpu_capability" (the kernels
    torch dispatches to), "loadavg_start" (1, 5, 15 min; None where the OS has none), "emulation" (only when a
    `kernel_emulation` variable is set: the kernels ran as on a lesser CPU), "gpu" (only with CUDA), "summary" (one
    line of it all, for a page)}."""
    import torch

    flags = cpu_flags()
    info: dict[str, Any] = {
        "cpu": cpu_model(), "host_class": host_class(flags), "cpu_flags": [f for f in SPEED_FLAGS if f in flags],
        "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "python": platform.python_version(), "platform": platform.platform(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    emulated = kernel_emulation()
    if emulated:
        info["emulation"] = emulated
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    load = f"; load average {info['loadavg_start'][0]:.1f}" if info["loadavg_start"] else ""
    forced = f"; kernels emulated: {' '.join(f'{k}={v}' for k, v in emulated.items())}" if emulated else ""
    gpu = f"; GPU {info['gpu']}" if "gpu" in info else ""
    info["summary"] = (f"{info['cpu']} ({info['host_class']}: {' '.join(info['cpu_flags']) or 'no x86 flags known'}"
                       f"{forced}; {info['cores']} cores, torch {info['torch_threads']} threads{load}){gpu}; "
                       f"torch {info['torch']}")
    return info
