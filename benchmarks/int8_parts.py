"""How fast ViT-B/16's static int8 forward could be: each of its parts timed on its own, summed, beside the whole
forward (ours, `int8-static`) and ONNX Runtime's best int8 timed in the same run.

    .venv/bin/python benchmarks/int8_parts.py --batch 8 --threads 2 -o benchmarks/results/int8-parts-zen4

Parts, as the compiled graph runs them (`vitlab.deploy.quant`): the four int8 GEMMs of a block through
`onednn::qlinear_pointwise` with the epilogue each has in the graph (qkv writing bf16, proj and fc2 adding the residual
in fp32, fc1 with the erf GELU writing uint8 codes), the same through vitlab's `vitlab::int8_linear` (what the graph
runs where the int8 attention does; the sum below takes these then), the same GEMMs without epilogue
(`torch._int_mm`, s8 x s8 -> s32),
the fused int8 attention (`vitlab::int8_attention_quantized` on a strided view of a qkv row, as the graph calls it),
and the two LayerNorm + quantise passes (`vitlab::layer_norm_quantized`; Inductor's loop for the same beside it).
x 12 blocks, + the patch embedding and head, gives the forward's time if every op ran in the graph as fast as alone;
the whole forward loses to that what the graph's ops pay for reading what the one before them wrote (on another
core, or out of cache). Also the int8 matmul peak
(`vitlab.bench.timing.matmul_peak`). Whole forwards: interleaved rounds, medians; parts: medians of 30 calls.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.ao.quantization.fx._decomposed  # registers torch.ops.quantized_decomposed

import vitlab
from vitlab.bench import machine_info
from vitlab.bench.timing import loadavg, matmul_peak, perturb_, time_calls
from vitlab.deploy import quant
from vitlab.models.flops import count_flops
from vitlab.perf import precision
from vitlab.perf.int8_attention import int8_attention_quantized
from vitlab.perf.int8_linear import INT8_LINEAR, int8_linear_unavailable, pack
from vitlab.perf.layernorm_quant import LAYER_NORM_QUANTIZED
from vitlab.utils.io import write_atomic


def median_ms(fn: Any, calls: int = 30) -> float:
    """Median ms per call over `calls` timed calls after 5 warm-up calls (vitlab's one timer, `time_calls`)."""
    return statistics.median(time_calls(fn, warmup=5, rounds=calls)) * 1e3


def parts(tokens: int, batch: int, dim: int, hidden: int, heads: int) -> dict[str, float]:
    """ms per call of each part of one block (and of the LayerNorm + quantise loop) for `tokens` rows."""
    ql, qlb = torch.ops.onednn.qlinear_pointwise.default, torch.ops.onednn.qlinear_pointwise.binary
    out: dict[str, float] = {}
    resid = torch.randn(tokens, dim)
    for name, k, n in (("qkv", dim, 3 * dim), ("proj", dim, dim), ("fc1", dim, hidden), ("fc2", hidden, dim)):
        qx = torch.randint(0, 256, (tokens, k), dtype=torch.uint8)
        w = torch.randint(-127, 128, (n, k), dtype=torch.int8)
        qw = torch.ops.onednn.qlinear_prepack(w, [tokens, k])
        ws, wz, bias = torch.rand(n) * 0.01 + 1e-3, torch.zeros(n, dtype=torch.int64), torch.randn(n)
        if name == "qkv":  # bf16 out, as `linear_outputs_dtype` picks on hosts with native bf16
            fn = partial(ql, qx, 0.02, 128, qw, ws, wz, bias, 1.0, 0, torch.bfloat16, "none", [], "")
        elif name == "fc1":  # erf GELU, uint8 codes for fc2
            fn = partial(ql, qx, 0.02, 128, qw, ws, wz, bias, 0.05, 128, None, "gelu", [], "none")
        else:  # + the residual stream, fp32
            fn = partial(qlb, qx, 0.02, 128, qw, ws, wz, resid, bias, 1.0, 0, torch.float32, 1.0, 0, "sum", 1.0,
                         "none", [], "")
        out[name] = median_ms(fn)
        out[name + " (_int_mm)"] = median_ms(partial(torch._int_mm, qx.view(torch.int8), w.t().contiguous()))
        if int8_linear_unavailable() is None:  # vitlab's GEMM with the same epilogue (`gemm="vitlab"`)
            p = pack(w, ws, 0.02, 128, bias)
            ours = {"qkv": (None, False, torch.bfloat16, 1.0, 0), "fc1": (None, True, torch.uint8, 0.05, 128)}.get(
                name, (resid, False, torch.float32, 1.0, 0))
            out[name + " (vitlab)"] = median_ms(partial(INT8_LINEAR, qx, *p, *ours))
    d = dim // heads
    qkv = torch.randn(batch, tokens // batch, 3, heads, d, dtype=torch.bfloat16)
    q, kk, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, N, D) views of the qkv rows
    out["attention"] = median_ms(lambda: int8_attention_quantized(q, kk, v, d**-0.5, 0.05, 128))
    ln = torch.nn.LayerNorm(dim, eps=1e-6)
    with torch.no_grad():  # as the graph runs it on this class (`layer_norm_quantized_in`), and as Inductor would
        out["layernorm + quantise"] = median_ms(
            lambda: LAYER_NORM_QUANTIZED(resid, ln.weight, ln.bias, 1e-6, 0.05, 128))
        qpt = torch.ops.quantized_decomposed.quantize_per_tensor.default  # the graph's quantise
        loop = torch.compile(lambda x: qpt(ln(x), 0.05, 128, 0, 255, torch.uint8), dynamic=False)
        out["layernorm + quantise (Inductor's loop)"] = median_ms(lambda: loop(resid))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--pause", type=float, default=0.3)
    p.add_argument("-o", "--out", default="benchmarks/results/int8-parts")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = perturb_(vitlab.create_model("ViT-B/16", num_classes=1000).eval())
    cfg = model.cfg
    x = torch.randn(args.batch, 3, cfg.img_size, cfg.img_size)
    calib = torch.randn(32, 3, cfg.img_size, cfg.img_size)
    res: dict[str, Any] = {"machine": machine_info(), "threads": args.threads, "batch": args.batch,
                           "load_start": loadavg()}
    peak = matmul_peak(torch.int8, "cpu", 2048)
    # the parts first, twice (the first pass warms the CPU's clocks and the kernels' caches up), before any other
    # runtime's threads exist (ONNX Runtime's would spin on after its calls)
    tokens = args.batch * (cfg.num_patches + 1)  # + the class token
    parts(tokens, args.batch, cfg.embed_dim, cfg.mlp_dim, cfg.num_heads)
    part = parts(tokens, args.batch, cfg.embed_dim, cfg.mlp_dim, cfg.num_heads)
    ours = quant.quantize_static(copy.deepcopy(model).eval(), calib)[1]
    ort = vitlab.optimize(model, "ort-int8-dynamic", calib=calib, example=x)
    fns: dict[str, Any] = {"ours": ours, "ort-int8-dynamic": ort}
    with torch.no_grad():  # interleaved rounds, --pause of idle before each call (ONNX Runtime's threads spin on)
        secs = precision.time_rounds(lambda name: fns[name](x), list(fns), warmup=2, rounds=args.rounds,
                                     settle_s=args.pause)
    whole = {k: [t * 1e3 for t in v] for k, v in secs.items()}
    blocks = cfg.depth
    ours = all(n + " (vitlab)" in part for n in ("qkv", "proj", "fc1", "fc2"))  # the graph runs vitlab's GEMMs
    gemms = sum(part[n + (" (vitlab)" if ours else "")] for n in ("qkv", "proj", "fc1", "fc2"))
    raw = sum(part[n + " (_int_mm)"] for n in ("qkv", "proj", "fc1", "fc2"))
    alone = blocks * (gemms + part["attention"] + 2 * part["layernorm + quantise"])
    med = {k: statistics.median(v) for k, v in whole.items()}
    flops = count_flops(cfg) * args.batch
    lines = [f"ViT-B/16 batch {args.batch}, {args.threads} threads; int8 matmul peak {peak / 1e9:.0f} GFLOP/s; "
             f"load {res['load_start']}"]
    lines += [f"  {k:<24} {v:7.2f} ms per call" for k, v in part.items()]
    lines += [f"sum over {blocks} blocks: GEMMs {blocks * gemms:.0f} ms (without epilogues, _int_mm: "
              f"{blocks * raw:.0f}), + attention + LayerNorm loops = {alone:.0f} ms "
              f"({100 * flops / (alone / 1e3) / peak:.0f}% of the int8 peak)"]
    for k, v in med.items():
        lines.append(f"whole forward {k:<18} {v:7.1f} ms ({100 * flops / (v / 1e3) / peak:.0f}% of the int8 peak)")
    ratio = statistics.median(o / s for o, s in zip(whole["ort-int8-dynamic"], whole["ours"], strict=True))
    lines.append(f"ours vs ONNX Runtime (same rounds): {ratio:.2f}x; the parts' sum vs ONNX Runtime: "
                 f"{med['ort-int8-dynamic'] / alone:.2f}x; GEMMs alone vs ONNX Runtime: "
                 f"{med['ort-int8-dynamic'] / (blocks * gemms):.2f}x")
    res.update(parts=part, whole_ms=whole, peak_flops=peak, sum_alone_ms=alone, load_end=loadavg())
    print("\n".join(lines))
    out = Path(args.out)
    write_atomic(out / "int8-parts.json", json.dumps(res, indent=1, default=str), overwrite=True)
    write_atomic(out / "int8-parts.txt", "\n".join(lines) + "\n", overwrite=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
