"""`vitlab train CONFIG [-o RUN_DIR] [--set section.key=value ...] [--resume]`: thin; calls `train()`.

Data-parallel: `torchrun --nproc-per-node N -m vitlab.cli train CONFIG ...` runs the same command on N processes
(add --nnodes / --rdzv-endpoint for several machines).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .loop import NonFiniteError, RunDirError, train
from .recipe import load_recipe


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="recipe YAML (see configs/)")
    p.add_argument("-o", "--output", "--run-dir", dest="run_dir", default=None,
                   help="run directory (default: runs/<config name>)")
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="SECTION.KEY=VALUE",
                   help="override recipe values, e.g. --set train.steps=100 model.depth=2 (one or more, repeatable)")
    p.add_argument("--resume", action="store_true", help="continue the run in RUN_DIR from its latest checkpoint")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (metrics still go to metrics.jsonl)")


def run(args: argparse.Namespace) -> int:
    try:
        recipe = load_recipe(args.config, args.overrides)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    run_dir = Path(args.run_dir or Path("runs") / Path(args.config).stem)
    try:
        summary = train(recipe, run_dir, resume=args.resume, progress=not args.no_progress, device=args.device)
    except (RunDirError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except NonFiniteError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    if not summary["status"].startswith("completed"):
        print(f"{summary['status']} at step {summary['step']}/{summary['total_steps']}; checkpoint saved. "
              f"Continue with: vitlab train {args.config} -o {run_dir} --resume", file=sys.stderr)
        return 0
    if "eval" in summary:
        ev = summary["eval"]
        print(f"{summary['eval_split']} top-1 {100 * ev['top1']:.2f}%  top-5 {100 * ev['top5']:.2f}%  "
              f"({ev['num_samples']} images, {summary['train_time_s'] / 60:.1f} min of training)")
        print(f"weights: {summary['model']}")
        print(f"report: {summary['report']}")
    return 0
