"""torch.profiler tables of vitlab's training step: where a step's time goes, in fp32 and bf16 autocast.

    .venv/bin/python benchmarks/profile_train.py -o benchmarks/results/profile_train.txt
    .venv/bin/python benchmarks/profile_train.py --only vit_s16 --batch 32 -o ...
    .venv/bin/python benchmarks/profile_train.py --only vit_s16 --precisions bf16 --compile --threads 1 -o ...

Workloads: ViT-S/16 at 224 px (1000 classes) and the Fashion-MNIST recipes (fmnist_hybrid.yaml and the demo's
demo_pretrain.yaml); each one's full `train_step` (forward, backward, clipping, fused AdamW) on a fixed random
batch, eager (what the profiler can name op by op), top operators by self CPU time. Times under load are longer
than idle ones; the shares of each operator are what to read. glibc's allocator is set as vitlab's trainer sets it
(`keep_freed_memory`) unless --default-allocator: profiled without it, a ViT-S/16 step's patch-embedding convolution
read 70 ms instead of 14, the page faults of its freshly mapped output counted as the op's own time.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from vitlab.perf.allocator import keep_freed_memory
from vitlab.perf.autotune import machine_key
from vitlab.train import load_recipe
from vitlab.train.loop import build_model, train_step
from vitlab.train.optim import build_optimizer
from vitlab.train.recipe import Recipe

ROOT = Path(__file__).resolve().parents[1]
ROWS = 14


def workloads(batch: int | None) -> dict[str, tuple[Recipe, int]]:
    """name -> (recipe, classes)."""
    vit_s = Recipe.from_dict({"model": {"name": "ViT-S/16", "img_size": 224}, "data": {"dataset": "synthetic"},
                              "optim": {"name": "adamw", "lr": 1e-3, "weight_decay": 0.05, "clip_grad_norm": 1.0},
                              "train": {"batch_size": batch or 32, "steps": 1}})
    out = {"vit_s16": (vit_s, 1000)}
    for name in ("fmnist_hybrid", "demo_pretrain"):
        if not (ROOT / "configs" / f"{name}.yaml").exists():
            continue
        over = [f"train.batch_size={batch}"] if batch else []
        out[name] = (load_recipe(ROOT / "configs" / f"{name}.yaml", over), 10)
    return out


def profile_step(recipe: Recipe, classes: int, precision: str, reps: int, compiled: bool = False) -> str:
    cfg = recipe.model.model_config(num_classes=classes)
    model = build_model(recipe, num_classes=classes)
    opt = build_optimizer(model, recipe.optim)
    net = torch.compile(model) if compiled else model
    g = torch.Generator().manual_seed(0)
    b = recipe.train.batch_size
    batch = [(torch.randn(b, cfg.in_chans, cfg.img_size, cfg.img_size, generator=g),
              torch.randint(0, classes, (b,), generator=g))]

    def step() -> None:
        train_step(net, opt, batch, lr=1e-4, device=torch.device("cpu"), precision=precision,
                   clip_grad_norm=recipe.optim.clip_grad_norm)

    for _ in range(3 if compiled else 1):  # warm-up: compilation, allocator, oneDNN primitives
        step()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=compiled) as prof:
        for _ in range(reps):
            step()
    events = prof.key_averages(group_by_input_shape=compiled)
    total = sum(e.self_cpu_time_total for e in events) / reps / 1e3
    head = f"{b} images/step, {total:.0f} ms of self CPU time per step"
    if not compiled:
        return head + "\n" + events.table(sort_by="self_cpu_time_total", row_limit=ROWS, max_name_column_width=44)
    # compiled: Inductor's fused kernels by name, GEMMs by shape; ms per step
    rows = sorted(events, key=lambda e: -e.self_cpu_time_total)[:3 * ROWS]
    lines = [f"{'ms/step':>8} {'calls':>5}  {'name':<64} input shapes"]
    lines += [f"{e.self_cpu_time_total / reps / 1e3:8.1f} {e.count // reps:5d}  {e.key[:64]:<64} "
              f"{str(e.input_shapes)[:60] if e.input_shapes and any(e.input_shapes) else ''}" for e in rows]
    return head + "\n" + "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", default=None, help="vit_s16, fmnist_hybrid, demo_pretrain")
    p.add_argument("--batch", type=int, default=None, help="batch size (default: each recipe's; ViT-S/16: 32)")
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--compile", action="store_true", help="torch.compile the model (Inductor's kernels named)")
    p.add_argument("--default-allocator", action="store_true",
                   help="leave glibc's allocator as it is (vitlab's trainer keeps freed memory; without it each "
                        "op that allocates a large output also pays that output's page faults)")
    p.add_argument("-o", "--output", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    allocator = "default allocator" if args.default_allocator or not keep_freed_memory() else "tuned allocator"
    if args.compile:
        import torch._inductor.config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True  # each fused kernel a named profiler event
    parts = [f"Host: {machine_key()}; {allocator} (vitlab.perf.allocator); load average {os.getloadavg()[0]:.1f} "
             "at the start"]
    for name, (recipe, classes) in workloads(args.batch).items():
        if args.only and name not in args.only:
            continue
        for precision in args.precisions:
            text = profile_step(recipe, classes, precision, args.reps, args.compile)
            rowmajor = os.environ.get("VITLAB_ROWMAJOR_GRADS", "auto")
            what = f"{precision}, compiled, VITLAB_ROWMAJOR_GRADS={rowmajor}" if args.compile else precision
            parts.append(f"== {name}, {what} (load {os.getloadavg()[0]:.1f}) ==\n{text}")
            print(parts[-1], flush=True)
    if args.output:
        Path(args.output).write_text("\n\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
