"""`vitlab demo` (what `make demo` runs): pre-train on Fashion-MNIST below its native resolution, fine-tune at it,
transfer to digits against scratch, analyse, one HTML page; thin over `vitlab.paper.demo.run_demo`."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ._common import add_output, add_progress, check_output, positive, want_progress

HELP = "the main job: pre-train, fine-tune at higher resolution, transfer, analyse; one HTML page"
DESCRIPTION = """\
The paper in miniature on the CPU, minutes on 2 cores (docs/training.md has the times per CPU class): pre-train a
hybrid ViT on Fashion-MNIST below its native resolution (16 px), fine-tune it at the native 28 px with interpolated
position embeddings (paper Sec. 3.2) against the same steps kept at 16 px, transfer it to scikit-learn's
handwritten digits against the same model trained from scratch (Sec. 4.2), and look inside it (Sec. 4.5). One
self-contained page, report.html, the paper's claims beside the measurements as `vitlab reproduce` reports them (+
demo.json with every number, a PNG and JSON per figure, each run's folder). The steps are the shipped recipes
demo_pretrain.yaml, demo_finetune.yaml and demo_transfer.yaml, run as `vitlab reproduce` runs its experiments;
their lengths are fixed (epochs and steps), so the numbers do not depend on the machine's speed. --seeds N runs
the two headline comparisons (fine-tune vs the control, transfer vs scratch) N times with different seeds from the
one pre-training and shows each seed's difference, mean ± standard error and verdict (default 1: as before)."""
EXAMPLES = """\
  vitlab demo                                     # runs/demo-<date-time>/report.html
  vitlab demo -o runs/demo --set train.steps=20   # a quick look (every step 20 steps)
  vitlab demo --seeds 3                           # the headline differences' seed spread (about 2.5x the time)
  vitlab demo --configs my_configs/ --data-root /data/fashion-mnist"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_output(p, "demo directory, new or empty (default: runs/demo-<date-time>)", metavar="DIR")
    p.add_argument("--configs", default=None, metavar="DIR",
                   help="folder holding demo_pretrain.yaml, demo_finetune.yaml and demo_transfer.yaml "
                        "(default: the shipped recipes)")
    p.add_argument("--data-root", default=None, metavar="DIR",
                   help="Fashion-MNIST IDX folder (default: the recipes' data.root, Debian's location)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="runs of the two headline comparisons with different seeds (default 1)")
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="SECTION.KEY=VALUE",
                   help="override every recipe, e.g. --set train.steps=20 for a quick look (one or more; repeatable)")
    add_progress(p)


def run(args: argparse.Namespace) -> int:
    import torch

    from ..paper.demo import run_demo

    positive("--threads", args.threads)
    positive("--seeds", args.seeds)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.output or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S"))
    check_output(out, folder=True)
    s = run_demo(out, Path(args.configs) if args.configs else None, args.overrides, args.data_root,
                 progress=want_progress(args), seeds=args.seeds)
    pre, ft = s["pretrain"], s["finetune"]
    print(f"\n{s['dataset']} test top-1: pre-train at {pre['img_size']} px {100 * pre['top1']:.2f}% -> fine-tune at "
          f"{ft['img_size']} px {100 * ft['top1']:.2f}%")
    for run_ in s["transfer"].get("runs", []):
        print(f"transfer to {s['transfer']['dataset']}, {run_['labels_per_class']} labels per class: pre-trained "
              f"{100 * run_['pretrained']['top1']:.2f}% vs scratch {100 * run_['scratch']['top1']:.2f}%")
    spread = s.get("seed_spread")
    if spread:
        g = spread["resolution_gain"]
        print(f"{spread['seeds']} seeds: fine-tune minus control {100 * g['mean']:+.2f} ± {100 * g['se']:.2f} points "
              f"({g['verdict']}); " + "; ".join(f"transfer {k}/class {100 * d['mean']:+.2f} ± {100 * d['se']:.2f} "
                                                 f"({d['verdict']})" for k, d in spread["transfer"].items()))
    if "skipped" in s["transfer"]:
        print(f"transfer skipped: {s['transfer']['skipped']}")
    print(f"{s['wall_time_s'] / 60:.1f} min")
    print(f"report: {out / 'report.html'}")
    return 0
