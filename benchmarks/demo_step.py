"""Cost of a training step of the demo's recipes (configs/demo_*.yaml) in each precision, as images per second of
wall time AND per CPU-second of this process, in interleaved rounds (A, B, A, B, ...) in one process.

On a machine shared with other jobs the wall-clock rate says little; the CPU-time rate (with --threads 1, where no
thread waits for a descheduled partner) is close to what one idle core does, and times the number of idle cores
(less what the second core loses to synchronisation) projects the idle rate. Prints the load average beside
every round. Not asserted anywhere: speed lives here, not in the tests.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/demo_step.py --threads 1 --rounds 3 --steps 4
    .venv/bin/python benchmarks/demo_step.py --threads 2 --precisions bf16 --recipes demo_pretrain   # idle check
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from vitlab.data import DataConfig, build_train_stream
from vitlab.train import load_recipe, recipes
from vitlab.train.loop import build_model, train_step
from vitlab.train.optim import build_optimizer


def side(name: str, precision: str, steps: int):
    """A closure running `steps` steps of recipe `name` in `precision`: (images/s wall, images per CPU-second)."""
    r = load_recipe(recipes.path(name), [f"train.precision={precision}", "init.checkpoint=null"])
    cfg = r.model.model_config(num_classes=10)
    stream = build_train_stream(DataConfig.from_dict(r.data), img_size=cfg.img_size, in_chans=cfg.in_chans,
                                batch_size=r.train.batch_size, seed=0)
    model = build_model(r, num_classes=10)
    opt = build_optimizer(model, r.optim)

    def run(n: int = steps) -> tuple[float, float]:
        w, c = time.perf_counter(), time.process_time()
        for _ in range(n):
            train_step(model, opt, [next(stream)], lr=r.optim.lr, device=torch.device("cpu"), precision=precision,
                       clip_grad_norm=r.optim.clip_grad_norm, label_smoothing=r.train.label_smoothing)
        images = n * r.train.batch_size
        return images / (time.perf_counter() - w), images / (time.process_time() - c)

    run(2)  # warm-up
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipes", nargs="+", default=["demo_pretrain", "demo_finetune"])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4, help="steps per round and side")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sides = {f"{n} {p}": side(n, p, args.steps) for n in args.recipes for p in args.precisions}
    wall: dict[str, list[float]] = {k: [] for k in sides}
    cpu: dict[str, list[float]] = {k: [] for k in sides}
    for i in range(args.rounds):
        for k, run in sides.items():
            w, c = run()
            wall[k].append(w)
            cpu[k].append(c)
        print(f"round {i}: load {os.getloadavg()[0]:.2f}: " + ", ".join(
            f"{k} {wall[k][-1]:.0f} img/s wall, {cpu[k][-1]:.0f} img/CPU-s" for k in sides), flush=True)
    print(json.dumps({"threads": args.threads, "load_average": os.getloadavg(), "median": {
        k: {"images_per_s": round(statistics.median(wall[k])), "images_per_cpu_s": round(statistics.median(cpu[k]))}
        for k in sides}}, indent=2))


if __name__ == "__main__":
    main()
