"""`vitlab train CONFIG [-o RUN_DIR] [--set section.key=value ...] [--resume]`: thin; calls `vitlab.train.train`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ._common import INTERRUPTED, add_device, add_output, add_progress, check_output, want_progress

HELP = "pre-train or fine-tune from a YAML recipe"
DESCRIPTION = """\
Train a ViT from a YAML recipe (configs/ holds the paper's pre-training and fine-tuning recipes, big_vision's plain
ViT and the Fashion-MNIST ones; each says what it costs and what it reaches). The run directory receives
metrics.jsonl, atomic resumable checkpoints, the final weights with their config and metrics, and report.md.
Ctrl-C (or SIGTERM) stops at the next step with a checkpoint: continue with --resume.

Data-parallel: `torchrun --nproc-per-node N -m vitlab.cli train CONFIG ...` runs the same command on N processes
(add --nnodes / --rdzv-endpoint for several machines)."""
EXAMPLES = """\
  vitlab train configs/fmnist_scratch.yaml -o runs/fmnist
  vitlab train configs/fmnist_scratch.yaml --set train.steps=100 model.depth=2 optim.lr=1e-3
  vitlab train configs/fmnist_scratch.yaml -o runs/fmnist --resume          # after Ctrl-C
  torchrun --nproc-per-node 4 -m vitlab.cli train configs/vit_b16_imagenet_pretrain.yaml -o runs/b16"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="recipe YAML (see configs/)")
    add_output(p, "run directory (default: runs/<config name>)", metavar="RUN_DIR")
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="SECTION.KEY=VALUE",
                   help="override recipe values, e.g. --set train.steps=100 model.depth=2 (one or more, repeatable)")
    p.add_argument("--resume", action="store_true", help="continue the run in RUN_DIR from its latest checkpoint")
    add_device(p)
    add_progress(p)


def run(args: argparse.Namespace) -> int:
    from ..train.loop import train
    from ..train.recipe import load_recipe
    recipe = load_recipe(args.config, args.overrides)
    run_dir = Path(args.output or Path("runs") / Path(args.config).stem)
    check_output(run_dir, folder=True)  # a file in the way, a read-only folder: say so before training
    summary = train(recipe, run_dir, resume=args.resume, progress=want_progress(args), device=args.device)
    if not summary["status"].startswith("completed"):  # stopped by a signal, with a checkpoint: exit 130
        print(f"{summary['status']} at step {summary['step']}/{summary['total_steps']}; checkpoint saved. "
              f"Continue with: vitlab train {args.config} -o {run_dir} --resume", file=sys.stderr)
        return INTERRUPTED
    if "eval" in summary and summary["eval"] is not None:
        ev = summary["eval"]
        print(f"{summary['eval_split']} top-1 {100 * ev['top1']:.2f}%  top-5 {100 * ev['top5']:.2f}%  "
              f"({ev['num_samples']} images, {summary['train_time_s'] / 60:.1f} min of training)")
        print(f"weights: {summary['model']}")
        print(f"report: {summary['report']}")
    return 0
