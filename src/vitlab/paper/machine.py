"""The machine a result was measured on, for the report: CPU model, the instruction-set flags that decide speed
(AVX-512, bf16, VNNI, AMX), cores torch uses, the load average, torch's version."""

from __future__ import annotations

import os
import platform
from typing import Any

import torch

FLAGS = ("avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


def _cpuinfo() -> tuple[str, set[str]]:
    model, flags = platform.processor() or "unknown CPU", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name":
                    model = value.strip()
                elif key == "flags":
                    flags = set(value.split())
                if model != "unknown CPU" and flags:
                    break
    except OSError:
        pass
    return model, flags


def machine_summary() -> dict[str, Any]:
    """{"cpu", "flags": {flag: bool}, "cores", "torch_threads", "load_avg", "torch", "summary"}."""
    model, flags = _cpuinfo()
    have = {f: f in flags for f in FLAGS}
    try:
        load = list(os.getloadavg())
    except OSError:
        load = []
    cores = os.cpu_count() or 0
    threads = torch.get_num_threads()
    isa = ", ".join(f for f, ok in have.items() if ok) or "no AVX-512"
    no_amx = "" if have["amx_bf16"] else ", no AMX"
    load_s = f"; load average {load[0]:.1f}" if load else ""
    summary = f"{model} ({cores} cores, torch {threads} threads; {isa}{no_amx}{load_s}); torch {torch.__version__}"
    return {"cpu": model, "flags": have, "cores": cores, "torch_threads": threads, "load_avg": load,
            "torch": torch.__version__, "summary": summary}
