"""The kernels behind `vitlab.perf.onednn`, one at a time: ViT-S/16 batch 32's MLP shapes in bf16, Inductor's
generated code against torch's eager (oneDNN) kernels, beside a copy of the same bytes (the memory floor).

    .venv/bin/python benchmarks/onednn_kernels.py --threads 2 -o benchmarks/results/onednn_kernels_zen4.txt
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from vitlab.perf.allocator import keep_freed_memory
from vitlab.perf.cpu import machine_summary


def per_call_ms(fn, reps: int, rounds: int = 5) -> float:
    """Median over `rounds` of the mean time of `reps` calls, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - t) / reps * 1e3)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=32 * 197, help="rows M = batch x tokens (ViT-S/16 batch 32)")
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--hidden", type=int, default=1536)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("-o", "--output", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    keep_freed_memory()
    g = torch.Generator().manual_seed(0)
    bf = torch.bfloat16
    x = torch.randn(a.tokens, a.dim, generator=g).to(bf)
    w = (torch.randn(a.hidden, a.dim, generator=g) / a.dim**0.5).to(bf)
    b = torch.randn(a.hidden, generator=g).to(bf)
    h = torch.randn(a.tokens, a.hidden, generator=g).to(bf)
    dy = torch.randn(a.tokens, a.hidden, generator=g).to(bf)
    gelu_c = torch.compile(lambda t: F.gelu(t))
    gelu_bwd_c = torch.compile(lambda d, t: torch.ops.aten.gelu_backward(d, t))
    double_c = torch.compile(lambda t: t * 2)
    addmm_c = torch.compile(lambda t, w, b: F.linear(t, w, b))
    rows = [
        ("GELU forward, Inductor", lambda: gelu_c(h)),
        ("GELU forward, torch eager (oneDNN)", lambda: F.gelu(h)),
        ("GELU backward, Inductor", lambda: gelu_bwd_c(dy, h)),
        ("GELU backward, torch eager", lambda: torch.ops.aten.gelu_backward(dy, h)),
        ("x * 2, Inductor (memory floor: the same bytes in and out)", lambda: double_c(h)),
        ("fc1 x W^T + b, Inductor (addmm: bias copied, then accumulated onto)", lambda: addmm_c(x, w, b)),
        ("fc1 x W^T + b, torch eager F.linear (addmm)", lambda: F.linear(x, w, b)),
        ("fc1 x W^T + b, oneDNN bias epilogue (mkldnn::_linear_pointwise)",
         lambda: torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")),
        ("fc1 x W^T, no bias (torch.mm)", lambda: torch.mm(x, w.t())),
    ]
    same = torch.equal(torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], ""), F.linear(x, w, b))
    m = machine_summary()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"# {m['summary']} | {when}",
             f"# shapes: x ({a.tokens}, {a.dim}), W ({a.hidden}, {a.dim}), h ({a.tokens}, {a.hidden}), bf16; "
             f"ms per call, median of 5 rounds x {a.reps} calls",
             f"# oneDNN's biased GEMM equals F.linear bit for bit: {same}"]
    for name, fn in rows:
        lines.append(f"{per_call_ms(fn, a.reps):8.2f} ms  {name}")
    text = "\n".join(lines)
    print(text)
    if a.output:
        Path(a.output).parent.mkdir(parents=True, exist_ok=True)
        Path(a.output).write_text(text + "\n")


if __name__ == "__main__":
    main()
