"""`vitlab fewshot CHECKPOINT --data SPEC --shots 1 5 10 25`: few-shot linear evaluation on frozen features; thin
over `vitlab.analysis.inputs.split_features` and `vitlab.analysis.fewshot_evaluate`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..utils.io import write_atomic
from ._common import UsageError, add_force, add_model_inputs, add_output, check_output, positive, want_progress

HELP = "few-shot linear evaluation on frozen features"
DESCRIPTION = """\
Few-shot linear evaluation (paper Sec. 4.1): frozen pre-logits features of the training split, a closed-form
ridge regression to {-1, 1} targets fitted on N examples per class, accuracy on the test split; mean and standard
deviation over several random draws of the shots."""
EXAMPLES = """\
  vitlab fewshot vit_b_16.IMAGENET1K_V1 --data cifar10:/data/cifar10 --shots 1 5 10 25
  vitlab fewshot runs/fmnist/model.safetensors --data fashion_mnist --train-limit 5000 -o fewshot.json"""

# vitlab.analysis.fewshot.DEFAULT_SHOTS and DEFAULT_L2, spelled out so that --help imports no torch
# (tests/test_cli.py checks that they agree)
DEFAULT_SHOTS = (1, 5, 10, 25)
DEFAULT_L2 = 1024.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="any checkpoint vitlab can load (ours, npz, timm, HF, torchvision, a name)")
    p.add_argument("--data", required=True, metavar="SPEC", help="a dataset, e.g. fashion_mnist or imagefolder:/path")
    p.add_argument("--shots", type=int, nargs="+", default=list(DEFAULT_SHOTS), help="examples per class")
    p.add_argument("--seeds", type=int, default=5, help="random draws of the shots per shot count")
    p.add_argument("--l2-reg", type=float, default=DEFAULT_L2, help="ridge strength")
    p.add_argument("--train-split", default="train", help="split the shots are drawn from")
    p.add_argument("--test-split", default="test", help="split accuracy is measured on")
    p.add_argument("--train-limit", type=int, default=None, metavar="N",
                   help="draw the shots from the first N training images only (default: all)")
    p.add_argument("--test-limit", type=int, default=None, metavar="N",
                   help="evaluate on the first N test images (default: all)")
    p.add_argument("--batch-size", type=int, default=256, help="images per forward pass")
    add_model_inputs(p, "input size (default: the model's)")
    add_output(p, "also write the results to this JSON file", "--json", metavar="FILE")
    add_force(p, "replace the JSON file if it exists")


def run(args: argparse.Namespace) -> int:
    import torch

    from ..analysis.fewshot import fewshot_evaluate
    from ..analysis.inputs import analysis_preprocess, check_image_size, load_checkpoint, split_features
    from ._common import preprocess_overrides
    positive("--seeds", args.seeds)
    positive("--batch-size", args.batch_size)
    positive("--train-limit", args.train_limit)
    positive("--test-limit", args.test_limit)
    positive("--l2-reg", args.l2_reg, minimum=0)
    if any(s < 1 for s in args.shots):
        raise UsageError(f"--shots must be positive, got {args.shots}")
    check_output(args.output, folder=False)
    if args.output and Path(args.output).exists() and not args.force:
        raise FileExistsError(f"{args.output} already exists; choose another file or pass --force")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = load_checkpoint(args.checkpoint, device)
    size = check_image_size(model, args.img_size)
    pre = analysis_preprocess(model, args.checkpoint, size, preprocess=preprocess_overrides(args))
    common = {"batch_size": args.batch_size, "device": device, "progress": want_progress(args)}
    train_x, train_y, num_classes = split_features(model, pre, args.data, args.train_split, limit=args.train_limit,
                                                   **common)
    test_x, test_y, _ = split_features(model, pre, args.data, args.test_split, limit=args.test_limit, **common)
    results = fewshot_evaluate(train_x, train_y, test_x, test_y, shots=args.shots, seeds=args.seeds,
                               l2_reg=args.l2_reg, num_classes=num_classes)
    print(f"few-shot linear evaluation of {args.checkpoint} on {args.data}: {len(train_y)} train / {len(test_y)} "
          f"test images, {train_x.shape[1]} features, {num_classes} classes, l2={args.l2_reg:g}, {args.seeds} draws")
    print(f"{'shots':>5}  {'accuracy':>8}  {'std':>6}")
    for r in results:
        print(f"{r.shots:>5}  {100 * r.mean:7.2f}%  {100 * r.std:5.2f}")
    if args.output:
        out = {"checkpoint": str(args.checkpoint), "data": args.data, "l2_reg": args.l2_reg, "seeds": args.seeds,
               "num_train": len(train_y), "num_test": len(test_y), "num_features": int(train_x.shape[1]),
               "results": [r.to_dict() for r in results]}
        write_atomic(Path(args.output), json.dumps(out, indent=2).encode(), overwrite=args.force)
    return 0
