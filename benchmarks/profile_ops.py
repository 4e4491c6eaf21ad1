"""torch.profiler tables behind the speed targets: where the time of one forward (or training step) goes.

    .venv/bin/python benchmarks/profile_ops.py --model ViT-B/16 --batch 8 --out benchmarks/results/profile.txt

Profiles ours and timm (same weights) in fp32 and bf16, our int8 mode, and a bf16-autocast training step,
and prints each one's top operators by self CPU time, plus oneDNN's choice of matmul kernel for bf16.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import vitlab
from vitlab.bench import build_timm, machine_info

ROWS = 12


def table(fn, reps: int = 2) -> str:
    fn()  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            fn()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=ROWS, max_name_column_width=48)


def onednn_bf16_kernel() -> str:
    """Which oneDNN implementation a bf16 matmul runs on this CPU (ONEDNN_VERBOSE in a child process)."""
    code = "import torch; a = torch.randn(512, 512, dtype=torch.bfloat16); a @ a"
    env = {**os.environ, "ONEDNN_VERBOSE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout
    lines = [line for line in out.splitlines() if ",exec," in line or ",isa:" in line]
    return "\n".join(lines[:3])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="ViT-B/16")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--train-model", default="ViT-S/16")
    p.add_argument("--train-batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="benchmarks/results/profile.txt")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ours = vitlab.create_model(args.model).eval()
    timm_m = build_timm(ours).eval()
    x = torch.randn(args.batch, 3, 224, 224)
    parts = [f"machine: {machine_info()}", "", "oneDNN bf16 matmul kernel:", onednn_bf16_kernel()]

    for dtype in (torch.float32, torch.bfloat16):
        for name, m in (("ours", ours), ("timm", timm_m)):
            m = m.to(dtype)
            xd = x.to(dtype)
            with torch.inference_mode():
                parts += ["", f"== {name} {dtype} inference, {args.model}, batch {args.batch}",
                          table(lambda m=m, xd=xd: m(xd))]
    ours.float()
    fast = vitlab.optimize(ours, "int8")
    parts += ["", f"== ours int8 (vitlab.optimize) inference, {args.model}, batch {args.batch}", table(lambda: fast(x))]

    tm = vitlab.create_model(args.train_model).train()
    opt = torch.optim.AdamW(tm.parameters(), lr=1e-5)
    xt, yt = torch.randn(args.train_batch, 3, 224, 224), torch.randint(0, 1000, (args.train_batch,))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(tm(xt).float(), yt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    parts += ["", f"== ours training step, bf16 autocast, {args.train_model}, batch {args.train_batch}",
              table(step, reps=1)]
    text = "\n".join(parts)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
