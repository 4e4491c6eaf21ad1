"""Where int8 inference time goes: ours (`int8-static`, torch.profiler with Inductor's kernel profiling) against
OpenVINO int8 (NNCF, `model_type=TRANSFORMER`; the CPU plugin's PERF_COUNT per-layer counters), per op category.

    .venv/bin/python benchmarks/profile_int8.py --batch 8 --threads 2 --calls 3 -o benchmarks/results/profile-int8-zen4
    .venv/bin/python benchmarks/profile_int8.py --attention fp32 math-bf16 ...   # our attention variants beside

Both run the same ViT-B/16 (random weights perturbed, as benchmarks/int8.py), calibrated on the same random images.
Categories: int8 GEMMs (Linear, patch-embedding conv), attention (QK^T, softmax, AV, and what feeds it), LayerNorm
(with the quantise it is fused with), GELU, residual adds, quantise/dequantise left alone, layout (reorders,
transposes, copies, casts), the rest. Our Inductor kernels are named after the ATen ops they fuse
(`cpp_fused_native_layer_norm_quantize_per_tensor_...`), so a fused kernel is counted under its first category in the
order above. Times are per call (the mean over --calls profiled calls after two warm-ups), in ms of wall time of
each op (OpenVINO: `real_time`; ours: self CPU time of the op's event, which is wall time on the calling thread).
Ours is built with Inductor's Python wrapper (`quantize_static(cpp_wrapper=False)`): the default C++ wrapper calls
the same kernels, but the profiler sees none of them. Prints both tables and writes them (and the raw per-op
lists) under -o.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

CATEGORIES = ("int8 GEMM", "attention", "LayerNorm", "GELU", "residual add", "quantize/dequantize", "layout",
              "other")


def our_category(name: str) -> str:
    n = name.lower()
    if "qlinear" in n or "qconv" in n or "addmm" in n or n.startswith("aten::mm") or "linear" in n:
        return "int8 GEMM"
    if "attention" in n or "bmm" in n or "softmax" in n or "matmul" in n:
        return "attention"
    if "layer_norm" in n:
        return "LayerNorm"
    if "gelu" in n:
        return "GELU"
    if "add" in n:
        return "residual add"
    if "quantize" in n:
        return "quantize/dequantize"
    if "clone" in n or "copy" in n or "permute" in n or "transpose" in n or "cat" in n:
        return "layout"
    return "other"


def ov_category(node_type: str, name: str) -> str:
    t, n = node_type.lower(), name.lower()
    if t.startswith("fullyconnected") or t == "convolution" or "gemm" in t:
        return "int8 GEMM"
    if t in ("scaleddotproductattention", "mha", "softmax", "matmul") or "attention" in t or (
            t == "subgraph" and ".attn/" in n and "linear" not in n):  # Snippets' fused int8 MHA
        return "attention"
    if t in ("mvn", "normalizel2") or "layer_norm" in n or "layernorm" in n:
        return "LayerNorm"
    if "gelu" in n:
        return "GELU"
    if t == "fakequantize" or "quantize" in n:
        return "quantize/dequantize"
    if t in ("reorder", "transpose", "reshape", "concat", "gather", "convert", "shapeof", "split", "broadcast"):
        return "layout"
    if t in ("eltwise", "subgraph"):
        return "residual add" if "add" in n else "other"
    return "other"


def build_ours(model: torch.nn.Module, calib: torch.Tensor, attention: str) -> Any:
    from vitlab.deploy import quant

    # Inductor's Python wrapper: the C++ one (the default) calls the same kernels where the profiler sees no op
    if attention == "auto":
        return quant.quantize_static(copy.deepcopy(model), calib, cpp_wrapper=False)[1]
    return quant.quantize_static(copy.deepcopy(model), calib, attention=attention, cpp_wrapper=False)[1]


def profile_ours(run: Any, x: torch.Tensor, calls: int) -> dict[str, float]:
    from torch.profiler import profile

    with torch.no_grad(), torch._inductor.config.patch({"cpp.enable_kernel_profile": True}):
        for _ in range(2):
            run(x)
        with profile() as prof:
            for _ in range(calls):
                run(x)
    ops: dict[str, float] = collections.defaultdict(float)
    for e in prof.key_averages():
        if e.key.startswith(("## Call CompiledFxGraph", "TorchDynamo", "Torch-Compiled", "CompiledFunction")):
            continue
        ops[e.key] += e.self_cpu_time_total / 1e3 / calls  # ms per call
    return dict(ops)


def build_openvino(model: torch.nn.Module, calib: torch.Tensor, threads: int, hint: str | None) -> Any:
    import nncf
    import openvino as ov

    from vitlab.deploy import runtimes

    example = calib[:1]
    with runtimes._quiet(), torch.no_grad():
        ov_model = ov.convert_model(copy.deepcopy(model).eval(), example_input=example, input=[(-1, *calib.shape[1:])])
        data = [c.numpy() for c in calib.split(1)]
        ov_model = nncf.quantize(ov_model, nncf.Dataset(data), subset_size=len(data),
                                 model_type=nncf.ModelType.TRANSFORMER)
    config: dict[str, Any] = {"INFERENCE_NUM_THREADS": threads, "PERF_COUNT": True}
    if hint:
        config["INFERENCE_PRECISION_HINT"] = hint
    return ov.Core().compile_model(ov_model, "CPU", config)


def profile_openvino(compiled: Any, x: torch.Tensor, calls: int) -> tuple[dict[str, float], dict[str, float]]:
    """(per op category ms, per node "type/exec_type name" ms), each per call."""
    request = compiled.create_infer_request()
    a = x.numpy()
    for _ in range(2):
        request.infer({0: a})
    per_node: dict[str, float] = collections.defaultdict(float)
    for _ in range(calls):
        request.infer({0: a})
        for p in request.get_profiling_info():
            if p.status.name != "EXECUTED":
                continue
            key = f"{p.node_type}/{p.exec_type} {p.node_name}"
            per_node[key] += p.real_time.total_seconds() * 1e3 / calls
    return dict(per_node), {}


def by_category(ops: dict[str, float], categorise: Any) -> dict[str, float]:
    out = dict.fromkeys(CATEGORIES, 0.0)
    for k, ms in ops.items():
        out[categorise(k)] += ms
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="ViT-B/16")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--calib", type=int, default=32)
    p.add_argument("--attention", nargs="+", default=["auto"],
                   help="our int8-static attention variants (quantize_static(attention=...))")
    p.add_argument("--ov-hint", default="f32", help="OpenVINO INFERENCE_PRECISION_HINT ('' for its default)")
    p.add_argument("-o", "--out", default="benchmarks/results/profile-int8")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    import vitlab
    from vitlab.bench import machine_info
    from vitlab.bench.timing import loadavg, perturb_

    torch.manual_seed(0)
    model = perturb_(vitlab.create_model(args.model, num_classes=1000).eval())
    cfg = model.cfg
    calib = torch.randn(args.calib, cfg.in_chans, cfg.img_size, cfg.img_size)
    x = torch.randn(args.batch, cfg.in_chans, cfg.img_size, cfg.img_size)
    result: dict[str, Any] = {"machine": machine_info(), "threads": args.threads, "batch": args.batch,
                              "load_start": loadavg(), "sides": {}}
    sides: dict[str, dict[str, float]] = {}
    for att in args.attention:
        t = time.perf_counter()
        run = build_ours(model, calib, att)
        sides[f"ours int8-static ({att})"] = profile_ours(run, x, args.calls)
        print(f"built and profiled ours ({att}) in {time.perf_counter() - t:.0f} s; load {loadavg()}", flush=True)
    t = time.perf_counter()
    compiled = build_openvino(model, calib, args.threads, args.ov_hint or None)
    sides["OpenVINO int8 (NNCF TRANSFORMER)"] = profile_openvino(compiled, x, args.calls)[0]
    print(f"built and profiled OpenVINO in {time.perf_counter() - t:.0f} s; load {loadavg()}", flush=True)

    names = list(sides)
    cats = {n: by_category(sides[n], our_category if n.startswith("ours") else
                           lambda k: ov_category(k.split("/")[0], k)) for n in names}
    lines = [f"{args.model} batch {args.batch}, {args.threads} threads, ms per call (mean of {args.calls}); "
             f"load {result['load_start']} -> {loadavg()}", "",
             "| category | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for c in CATEGORIES:
        lines.append(f"| {c} | " + " | ".join(f"{cats[n][c]:.1f}" for n in names) + " |")
    lines.append("| **total** | " + " | ".join(f"**{sum(cats[n].values()):.1f}**" for n in names) + " |")
    for n in names:
        lines += ["", f"{n}: top ops (ms per call)"]
        for k, ms in sorted(sides[n].items(), key=lambda kv: -kv[1])[:25]:
            lines.append(f"  {ms:8.2f}  {k[:110]}")
    text = "\n".join(lines)
    print(text, flush=True)
    result["sides"] = sides
    result["categories"] = cats
    result["load_end"] = loadavg()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile-int8.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "profile-int8.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
