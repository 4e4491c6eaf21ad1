"""`vitlab fewshot CHECKPOINT --data SPEC --shots 1 5 10 25`: few-shot linear evaluation on frozen features."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from ..preprocess import add_cli_arguments
from .fewshot import DEFAULT_L2, DEFAULT_SHOTS, extract_features, fewshot_evaluate


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="any checkpoint vitlab can load (ours, npz, timm, HF, torchvision)")
    p.add_argument("--data", required=True, metavar="SPEC", help="a dataset, e.g. fashion_mnist or imagefolder:/path")
    p.add_argument("--shots", type=int, nargs="+", default=list(DEFAULT_SHOTS), help="examples per class")
    p.add_argument("--seeds", type=int, default=5, help="random draws of the shots per shot count (default: 5)")
    p.add_argument("--l2-reg", type=float, default=DEFAULT_L2, help=f"ridge strength (default: {DEFAULT_L2:g})")
    p.add_argument("--train-split", default="train", help="split the shots are drawn from (default: train)")
    p.add_argument("--test-split", default="test", help="split accuracy is measured on (default: test)")
    p.add_argument("--train-limit", type=int, default=None, metavar="N",
                   help="draw the shots from the first N training images only (default: all)")
    p.add_argument("--test-limit", type=int, default=None, metavar="N", help="evaluate on the first N test images")
    p.add_argument("--img-size", type=int, nargs="+", metavar="PX", help="input size H [W] (default: the model's)")
    p.add_argument("--batch-size", type=int, default=256, help="images per forward pass (default: 256)")
    add_cli_arguments(p)
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if available)")
    p.add_argument("--json", metavar="FILE", help="also write the results here (never replaces an existing file)")


def _features(model, data_cfg, split: str, size, args, limit: int | None, device):
    """(features, labels, number of classes) of the first `limit` images of `split`."""
    from .. import data

    loader = data.build_eval_data(data_cfg, split, img_size=size, in_chans=model.cfg.in_chans,
                                  batch_size=args.batch_size)

    def limited():
        n = 0
        for batch in loader:
            images, labels = batch[0], batch[1]
            if limit is not None:
                images, labels = images[: limit - n], labels[: limit - n]
            n += len(images)
            yield images, labels
            if limit is not None and n >= limit:
                return

    feats, labels = extract_features(model, limited(), device)
    return feats, labels, loader.num_classes


def run(args: argparse.Namespace) -> int:
    from .. import data
    from .cli import data_settings, image_size, load_checkpoint, preprocessing
    from .report import write_atomic

    for name in ("seeds", "batch_size"):
        if getattr(args, name) < 1:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if any(s < 1 for s in args.shots):
        raise SystemExit(f"error: --shots must be positive, got {args.shots}")
    if args.l2_reg < 0:
        raise SystemExit(f"error: --l2-reg must be non-negative, got {args.l2_reg}")
    for name in ("train_limit", "test_limit"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be at least 1")
    if args.json and Path(args.json).exists():
        raise SystemExit(f"error: {args.json} already exists; choose another file")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = load_checkpoint(args.checkpoint, device)
    size = image_size(args, model)
    data_cfg = data.parse_data_spec(args.data).replace(**data_settings(preprocessing(args, model, size)))
    train_x, train_y, num_classes = _features(model, data_cfg, args.train_split, size, args, args.train_limit, device)
    test_x, test_y, _ = _features(model, data_cfg, args.test_split, size, args, args.test_limit, device)
    try:
        results = fewshot_evaluate(train_x, train_y, test_x, test_y, shots=args.shots, seeds=args.seeds,
                                   l2_reg=args.l2_reg, num_classes=num_classes)
    except ValueError as e:  # e.g. a class with fewer training images than shots
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"few-shot linear evaluation of {args.checkpoint} on {args.data}: {len(train_y)} train / {len(test_y)} "
          f"test images, {train_x.shape[1]} features, {num_classes} classes, l2={args.l2_reg:g}, {args.seeds} draws")
    print(f"{'shots':>5}  {'accuracy':>8}  {'std':>6}")
    for r in results:
        print(f"{r.shots:>5}  {100 * r.mean:7.2f}%  {100 * r.std:5.2f}")
    if args.json:
        out = {"checkpoint": str(args.checkpoint), "data": args.data, "l2_reg": args.l2_reg, "seeds": args.seeds,
               "num_train": len(train_y), "num_test": len(test_y), "num_features": int(train_x.shape[1]),
               "results": [r.to_dict() for r in results]}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(Path(args.json), json.dumps(out, indent=2).encode(), overwrite=False)
    return 0
