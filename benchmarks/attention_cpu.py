"""Attention forward + backward on a CPU: torch's fused kernel (scaled_dot_product_attention, flash on CPU) against
the explicit softmax(QK^T / sqrt(d)) V, in fp32 and bf16, for the attention shapes of vitlab's recipes.

This is the measurement behind `vitlab.models.vit._explicit_is_faster`: with bf16 on a CPU with AMX the fused kernel's
backward is the slow part of a training step, while the explicit form runs its two matmuls as AMX batched GEMMs.

    .venv/bin/python benchmarks/attention_cpu.py -o benchmarks/results/attention_cpu.md
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from vitlab.bench.timing import time_calls

# (what, batch, heads, tokens, head dim)
SHAPES = [
    ("fmnist_hybrid.yaml, batch 256", 256, 4, 64, 32),
    ("ViT-S/16 224 px, batch 64", 64, 6, 197, 64),
    ("ViT-B/16 224 px, batch 32", 32, 12, 197, 64),
    ("ViT-B/16 384 px, batch 8", 8, 12, 577, 64),
    ("ViT-L/16 512 px, batch 2", 2, 16, 1025, 64),
]


def time_ms(fn, repeats: int) -> float:
    """Median milliseconds per call (vitlab.bench's timer: 2 warm-up calls, then `repeats` timed ones)."""
    return 1e3 * statistics.median(time_calls(fn, warmup=2, rounds=repeats, iters=1, device="cpu"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("-o", "--output", default=None, help="write the table (Markdown)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from vitlab.perf.allocator import keep_freed_memory
    from vitlab.perf.precision import cpu_has_amx

    keep_freed_memory()
    lines = [f"Attention forward + backward, {args.threads} threads, median of {args.repeats}, CPU with AMX: "
             f"{cpu_has_amx()}", "", "| shape | dtype | fused (ms) | explicit (ms) | fused / explicit |",
             "|---|---|---|---|---|"]
    for what, b, h, n, d in SHAPES:
        for dtype in (torch.float32, torch.bfloat16):
            q, k, v = (torch.randn(b, h, n, d, dtype=dtype, requires_grad=True) for _ in range(3))
            g = torch.randn(b, h, n, d, dtype=dtype)

            def fused(q=q, k=k, v=v, g=g):
                F.scaled_dot_product_attention(q, k, v).backward(g)

            def explicit(q=q, k=k, v=v, g=g, d=d):
                (((q * d**-0.5) @ k.transpose(-2, -1)).softmax(-1) @ v).backward(g)

            a, e = time_ms(fused, args.repeats), time_ms(explicit, args.repeats)
            lines.append(f"| {what} (N={n}) | {str(dtype).removeprefix('torch.')} | {a:.1f} | {e:.1f} | {a / e:.2f} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
