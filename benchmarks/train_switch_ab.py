"""A/B of one of vitlab's training switches (an environment variable read at each step) inside one process.

On a small shared VM the speed of separately started processes differs by up to ~10% (docs/speed.md), more than
the few percent a kernel choice moves a training step. Here both settings live in the same process: one compiled
model per setting (built and warmed while the variable holds that setting; torch.compile keeps a graph for each
only where the setting changes what it guards on, e.g. whether a function mode is active: a value that compiles no
graph of its own would time another value's graphs, so it is refused), then rounds alternate the settings, the order
reversed every other round, the variable set before each side runs. The ratio of each round is paired, so a
machine that speeds up or slows down moves both sides alike.

    .venv/bin/python benchmarks/train_switch_ab.py --var VITLAB_ONEDNN_TRAIN off auto --rounds 10 --steps 3 \
        -o benchmarks/results/train_switch_onednn_zen4.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch
from torch._dynamo.utils import counters

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_throughput as tt  # the same ViT-S/16 workload and vitlab side

from vitlab.perf.allocator import keep_freed_memory
from vitlab.perf.cpu import machine_summary
from vitlab.train.recipe import Recipe


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--var", nargs="+", required=True, metavar=("NAME", "VALUE"),
                   help="the variable and two or more values; the first value is the baseline")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--steps", type=int, default=3, help="steps per side per round (their median is the round's)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("-o", "--output", default=None, help="write the table (Markdown) and a .json beside it")
    a = p.parse_args()
    if len(a.var) < 3:
        p.error("--var takes the variable's name and at least two values")
    name, values = a.var[0], a.var[1:]
    torch.set_num_threads(a.threads)
    keep_freed_memory()  # as `vitlab train` and train_throughput.py's vitlab side run
    sides = {}
    graphs = counters["stats"]["unique_graphs"]
    for v in values:
        os.environ[name] = v
        torch.manual_seed(0)
        run, precision = tt.vitlab_side(Recipe.from_dict(tt.VIT_S16), 1, "vit_s16")
        for _ in range(3):  # compile and warm with the setting in force
            run()
        sides[v] = run
        new, graphs = counters["stats"]["unique_graphs"] - graphs, counters["stats"]["unique_graphs"]
        print(f"{name}={v}: built (precision {precision}; {new} graphs compiled)", flush=True)
        if new == 0:  # dynamo reused another side's graphs: both sides would time the same code
            raise SystemExit(f"{name}={v} compiled no graph of its own: torch.compile reused the graphs of an earlier "
                             f"value (its guards do not see this variable), so the A/B would time one setting twice")
    res: dict[str, list[float]] = {v: [] for v in values}
    loads = []
    for r in range(a.rounds):
        loads.append(os.getloadavg()[0])
        for v in values if r % 2 == 0 else values[::-1]:
            os.environ[name] = v
            res[v].append(statistics.median(sides[v]() for _ in range(a.steps)))
        print(f"round {r}: load {loads[-1]:.2f} " + "  ".join(f"{v} {res[v][-1]:.2f}" for v in values), flush=True)
    base = values[0]
    lines = [f"ViT-S/16 batch 32 training step, {name} A/B in one process; {a.rounds} rounds x {a.steps} steps, "
             f"{a.threads} threads; load {min(loads):.1f}-{max(loads):.1f}", "",
             f"| {name} | median img/s | paired ratio to {base} (median of rounds) | rounds faster than {base} |",
             "|---|---:|---:|---:|"]
    for v in values:
        ratios = [x / y for x, y in zip(res[v], res[base], strict=True)]
        lines.append(f"| {v} | {statistics.median(res[v]):.2f} | {statistics.median(ratios):.3f}x | "
                     f"{sum(r > 1 for r in ratios)}/{len(ratios)} |")
    text = "\n".join(lines)
    print(text)
    if a.output:
        out = Path(a.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
        out.with_suffix(".json").write_text(json.dumps(
            {"var": name, "values": values, "images_per_s": res, "load": loads, "steps": a.steps,
             "threads": a.threads, "machine": machine_summary()}, indent=1, default=str))


if __name__ == "__main__":
    main()
