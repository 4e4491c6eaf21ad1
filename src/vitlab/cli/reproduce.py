"""`vitlab reproduce EXPERIMENT`: one of the paper's findings at a scale one machine runs, with its report; thin over
`vitlab.paper.reproduce`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ._common import UsageError, add_output, add_progress, check_output, positive, want_progress

EXPERIMENTS = ("data-scale", "transfer", "resolution", "inside")  # vitlab.paper.EXPERIMENTS (no import here: fast)

HELP = "reproduce one of the paper's findings in miniature: data-scale, transfer, resolution, inside"
DESCRIPTION = """\
Reproduce one of the paper's findings on Fashion-MNIST (and scikit-learn's handwritten digits) at a scale one
machine runs, and report the paper's claim beside our measurement:

  data-scale   ViT vs hybrid vs BiT ResNet on 1k..58.8k images, each run to convergence for its subset: an
               epoch budget per size, early stopping on a held-out validation split (Sec. 4.3, Fig. 3-4)
  transfer     pre-train, then fine-tune / few-shot linear probe with 1..all labels per class vs scratch
               (Table 2 protocol), on held-out Fashion-MNIST classes and on the digits
  resolution   pre-train at 16 px (Fashion-MNIST downsampled), fine-tune at the native 28 px with each
               position-embedding resize mode, vs continuing at 16 px for the same steps (Sec. 3.2)
  inside       filters, position embeddings, attention distance, rollout of the longest-trained ViT (Sec. 4.5,
               Fig. 6-7); the data-scale ViTs test Raghu et al. 2021's data explanation of missing local heads

Every training run is a `vitlab train` run directory under OUT/EXPERIMENT/ (transfer's pre-training is
OUT/upstream/); running the same command again skips finished runs and resumes unfinished ones. The report
(report.html with the figures inlined, one PNG and JSON per figure, result.json) goes to OUT/EXPERIMENT/report/.
--quick is the CI setting: tiny models on synthetic data in seconds; it checks the pipeline, not the finding.
--seeds N runs every compared arm N times (train.seed 0..N-1: model init, data order, augmentation; seed k > 0 in
OUT/EXPERIMENT/<run>-seed<k>/, resumable per seed; the shared pre-training once): the tables give mean ± standard
error, the figures every seed, and a claim reads "yes" only when the mean difference is 2 standard errors of the
difference above its bar ("no" 2 below), else "within noise". --plan prints the predicted training time (each
model timed for a few steps here) and trains nothing.
Needs the `paper` extra (scikit-learn, matplotlib)."""
EXAMPLES = """\
  vitlab reproduce data-scale -o runs/paper                 # the full setting (docs/paper.md has its numbers)
  vitlab reproduce transfer -o runs/paper --budget 20       # steps scaled to about 20 minutes of training
  vitlab reproduce inside -o runs/paper                     # after the others: analyses their ViTs
  vitlab reproduce resolution -o /tmp/rq --quick            # the pipeline in seconds
  vitlab reproduce resolution -o runs/paper --seeds 3 --plan  # how long 3 seeds take here, before running them
  vitlab reproduce resolution -o runs/paper --seeds 3         # mean ± standard error; seed 0 is the 1-seed run"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("experiment", choices=EXPERIMENTS, help="which finding")
    add_output(p, "root folder of the experiments' runs and reports (default: runs/paper)", metavar="OUT")
    p.add_argument("--quick", action="store_true", help="the CI setting: tiny models, synthetic data, seconds")
    p.add_argument("--budget", type=float, default=None, metavar="MINUTES",
                   help="scale every run's steps by one factor so the experiment's training takes about this long "
                        "(timed on this machine first); default: the setting's own steps")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="runs of every compared arm, train.seed 0..N-1 (default 1); finished seeds are kept")
    p.add_argument("--plan", action="store_true",
                   help="print the runs and the predicted training time on this machine; train nothing")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, all cores)")
    add_progress(p)


def run(args: argparse.Namespace) -> int:
    positive("--threads", args.threads)
    positive("--seeds", args.seeds)
    if args.budget is not None and not args.budget > 0:
        raise UsageError(f"--budget must be a positive number of minutes, got {args.budget}")
    out = Path(args.output or "runs/paper")
    check_output(out, folder=True)
    import torch

    from ..paper import reproduce

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.plan:
        from ..paper.forecast import describe, forecast

        print(describe(forecast(args.experiment, out, quick=args.quick, seeds=args.seeds, budget_min=args.budget)))
        return 0
    page = reproduce(args.experiment, out, quick=args.quick, budget_min=args.budget, progress=want_progress(args),
                     seeds=args.seeds)
    result = json.loads((page.parent / "result.json").read_text(encoding="utf-8"))
    for c in result["claims"]:
        print(f"[{c['verdict']:>12}] {c['measured']}")
    print(f"report: {page}")
    return 0
