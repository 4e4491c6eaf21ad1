"""torch.profiler tables of vitlab's training step: where a step's time goes, in fp32 and bf16 autocast.

    .venv/bin/python benchmarks/profile_train.py -o benchmarks/results/profile_train.txt
    .venv/bin/python benchmarks/profile_train.py --only vit_s16 --batch 32 -o ...

Workloads: ViT-S/16 at 224 px (1000 classes) and the Fashion-MNIST recipes (fmnist_hybrid.yaml and the demo's
demo_pretrain.yaml); each one's full `train_step` (forward, backward, clipping, fused AdamW) on a fixed random
batch, eager (what the profiler can name op by op), top operators by self CPU time. Times under load are longer
than idle ones; the shares of each operator are what to read.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

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


def profile_step(recipe: Recipe, classes: int, precision: str, reps: int) -> str:
    cfg = recipe.model.vit_config(num_classes=classes)
    model = build_model(recipe, num_classes=classes)
    opt = build_optimizer(model, recipe.optim)
    g = torch.Generator().manual_seed(0)
    b = recipe.train.batch_size
    batch = [(torch.randn(b, cfg.in_chans, cfg.img_size, cfg.img_size, generator=g),
              torch.randint(0, classes, (b,), generator=g))]

    def step() -> None:
        train_step(model, opt, batch, lr=1e-4, device=torch.device("cpu"), precision=precision,
                   clip_grad_norm=recipe.optim.clip_grad_norm)

    step()  # warm-up: allocator, oneDNN primitives
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            step()
    total = sum(e.self_cpu_time_total for e in prof.key_averages()) / reps / 1e3
    head = f"{b} images/step, {total:.0f} ms of self CPU time per step"
    return head + "\n" + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=ROWS,
                                                   max_name_column_width=44)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", default=None, help="vit_s16, fmnist_hybrid, demo_pretrain")
    p.add_argument("--batch", type=int, default=None, help="batch size (default: each recipe's; ViT-S/16: 32)")
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("-o", "--output", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    parts = [f"Host: {machine_key()}; load average {os.getloadavg()[0]:.1f} at the start"]
    for name, (recipe, classes) in workloads(args.batch).items():
        if args.only and name not in args.only:
            continue
        for precision in args.precisions:
            text = profile_step(recipe, classes, precision, args.reps)
            parts.append(f"== {name}, {precision} (load {os.getloadavg()[0]:.1f}) ==\n{text}")
            print(parts[-1], flush=True)
    if args.output:
        Path(args.output).write_text("\n\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
