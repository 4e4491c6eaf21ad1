"""`vitlab demo` (what `make demo` runs): pre-train on Fashion-MNIST, fine-tune at a higher resolution, report;
thin over `vitlab.train.demo.run_demo`."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ._common import add_output, add_progress, check_output, positive, want_progress

HELP = "the main job: pre-train on Fashion-MNIST, fine-tune at higher resolution, report"
DESCRIPTION = """\
Pre-train a ViT on Fashion-MNIST on the CPU, fine-tune it at a higher resolution with interpolated position
embeddings (paper Sec. 3.2), evaluate both and write one report (report.md, demo.json, curves). The two steps are
the shipped recipes fmnist_pretrain.yaml and fmnist_finetune.yaml, run through the same training as `vitlab
train`; sized for about 10 minutes on 2 idle CPU cores."""
EXAMPLES = """\
  vitlab demo                                     # runs/demo-<date-time>/report.md
  vitlab demo -o runs/demo --set train.steps=20   # a quick look
  vitlab demo --configs my_configs/ --data-root /data/fashion-mnist"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_output(p, "demo directory, new or empty (default: runs/demo-<date-time>)", metavar="DIR")
    p.add_argument("--configs", default=None, metavar="DIR",
                   help="folder holding fmnist_pretrain.yaml and fmnist_finetune.yaml (default: the shipped recipes)")
    p.add_argument("--data-root", default=None, metavar="DIR",
                   help="Fashion-MNIST IDX folder (default: the recipes' data.root, Debian's location)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="SECTION.KEY=VALUE",
                   help="override both recipes, e.g. --set train.steps=20 for a quick look (one or more; repeatable)")
    add_progress(p)


def run(args: argparse.Namespace) -> int:
    import torch

    from ..train.demo import run_demo

    positive("--threads", args.threads)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.output or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S"))
    check_output(out, folder=True)
    summary = run_demo(out, Path(args.configs) if args.configs else None, args.overrides, args.data_root,
                       progress=want_progress(args))
    print(f"\npre-train {100 * summary['pretrain']['top1']:.2f}% -> fine-tune "
          f"{100 * summary['finetune']['top1']:.2f}% test top-1 in {summary['wall_time_s'] / 60:.1f} min")
    print(f"report: {out / 'report.md'}")
    return 0
