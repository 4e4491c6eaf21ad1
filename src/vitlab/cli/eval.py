"""`vitlab eval CHECKPOINT --data SPEC`: top-1, top-5, per-class accuracy and the confusion matrix of a checkpoint
on a dataset; thin over `vitlab.inference.evaluate.evaluate_checkpoint`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..models.preprocess import Preprocess
from ._common import (
    add_device,
    add_memory,
    add_preprocess,
    add_progress,
    apply_memory,
    positive,
    preprocess_overrides,
    want_progress,
)

HELP = "evaluate a checkpoint: top-1/top-5, per-class accuracy, confusion matrix"
DESCRIPTION = """\
Evaluate a checkpoint on a split of a dataset: top-1, top-5, mean loss, per-class accuracy and (up to 20 classes)
the confusion matrix. Images are prepared as the checkpoint says (its stored preprocessing, else its format's
convention, else a default with a warning) unless --normalize / --resize / --crop-fraction / --interpolation say
otherwise. Library: vitlab.inference.evaluate.evaluate_checkpoint."""
EXAMPLES = """\
  vitlab eval runs/fmnist/model.safetensors --data fashion_mnist
  vitlab eval vit_b_16.IMAGENET1K_V1 --data imagefolder:/data/imagenet --split val --json > eval.json
  vitlab eval runs/ft/model.safetensors --data cifar10:/data/cifar10 --tta hflip --crop-fraction 0.875
  vitlab eval runs/ft/model.safetensors --data fashion_mnist --mode int8      # the accuracy of a speed mode"""

# vitlab.deploy.optimize.MODES and vitlab.inference.evaluate.TTA_MODES, spelled out so that --help imports no torch
# (tests/test_cli.py checks that they agree)
MODES = ("fp32", "bf16", "fp16", "compile", "compile-bf16", "int8")
TTA_MODES = ("none", "hflip")
PRECISIONS = ("auto", "bf16", "fp32")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="a .safetensors checkpoint written by vitlab, or anything load_model reads "
                                      "(npz, timm, HF, torchvision, a registry name)")
    p.add_argument("--data", required=True, metavar="SPEC",
                   help='dataset: "fashion_mnist", "imagefolder:/path", "cifar10:/path", ...')
    p.add_argument("--split", default="test", choices=("test", "val", "train"), help="which split")
    p.add_argument("--batch-size", type=int, default=None,
                   help="images per forward pass (default: 256 on a GPU, 16 on the CPU; memory grows with it, not "
                        "with the number of images)")
    p.add_argument("--precision", choices=PRECISIONS, default="auto",
                   help="autocast precision (eager); auto: fp32 or bf16, whichever measures faster for this "
                        "model and batch on this machine (cached; VITLAB_AUTOTUNE=off: bf16 only with AMX or a GPU)")
    p.add_argument("--mode", choices=MODES, default="fp32",
                   help="inference speed mode from vitlab.optimize instead of plain eager (docs/speed.md); "
                        "with any mode but fp32, --precision is ignored")
    add_device(p)
    p.add_argument("--tta", choices=TTA_MODES, default="none",
                   help="test-time augmentation: hflip averages the probabilities of each image and its mirror "
                        "image (2x the compute); reported beside, never instead of, the single-view number")
    add_preprocess(p)
    p.add_argument("--json", action="store_true", help="print the full result as JSON")
    add_memory(p)
    add_progress(p)


def format_result(r: Any) -> str:
    """The text `vitlab eval` prints: a CheckpointEval (or its `to_dict()`) as a few readable lines."""
    tta = "" if r.get("tta", "none") == "none" else f", test-time augmentation: {r['tta']}"
    crop = f", centre crop {r['crop_fraction']:g}" if r.get("eval_resize") == "center_crop" else ""
    lines = [f"{r['checkpoint']} on {r['data']} / {r['split']} ({r['num_samples']} images{crop}{tta})",
             f"top-1 {100 * r['top1']:.2f}%   top-5 {100 * r['top5']:.2f}%   loss {r['loss']:.4f}"]
    expected, skipped = r.get("expected_samples"), r.get("num_skipped", 0)
    if skipped or expected != r["num_samples"]:  # what was not evaluated (the list is in --json)
        of = f"of {expected} expected" if expected is not None else f"of an unknown number ({r.get('expected_from')})"
        lines.append(f"read {r['num_samples']} images {of}; {skipped} bad files or damaged shard parts skipped "
                     "(--json lists them)")
    if r.get("preprocess"):
        lines.append(f"preprocessing: {Preprocess.from_dict(r['preprocess']).describe()}")
    lines += ["", "per-class accuracy:"]
    width = max(len(c) for c in r["classes"])
    lines += [f"  {c:<{width}}  {100 * a:6.2f}%" for c, a in r["per_class"].items()]
    if len(r["classes"]) <= 20:
        lines += ["", "confusion matrix (rows: true, columns: predicted):"]
        lines += ["  " + " ".join(f"{v:5d}" for v in row) + f"  {c}" for c, row in zip(r["classes"], r["confusion"])]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from ..inference.evaluate import evaluate_checkpoint

    positive("--batch-size", args.batch_size)
    apply_memory(args.memory)  # bounded: the peak memory is one batch's however many images; reuse: faster
    r = evaluate_checkpoint(args.checkpoint, args.data, split=args.split, batch_size=args.batch_size,
                            precision=args.precision, device=args.device, mode=args.mode, tta=args.tta,
                            preprocess=preprocess_overrides(args), progress=want_progress(args))
    print(json.dumps(r.to_dict(), indent=2) if args.json else format_result(r))
    return 0
