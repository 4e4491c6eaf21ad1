"""`vitlab predict CHECKPOINT IMAGE... [--top-k 5] [--json]`: classify image files, labels by name.

Images are prepared as the checkpoint says (`vitlab.preprocess`: its stored preprocessing, else its format's
convention, else a default with a warning), exactly as `vitlab.data.transforms_for(model)` does; the flags override
it. Names come from the checkpoint (`vitlab train`'s "classes", a transformers or timm config's labels), else
ImageNet-1k's for a 1000-class head."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

from ..optimize import MODES, optimize
from ..preprocess import add_cli_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="a checkpoint (any format load_model reads)")
    p.add_argument("images", nargs="+", help="image files")
    p.add_argument("--top-k", type=int, default=5)
    add_cli_arguments(p)
    p.add_argument("--mode", choices=MODES, default="fp32",
                   help="inference speed mode from vitlab.optimize (accuracy cost per mode: docs/speed.md)")
    p.add_argument("--json", action="store_true")


def predict(checkpoint: str, images: list[str], top_k: int = 5, normalize: str | None = None,
            mode: str = "fp32", *, resize: str | None = None, crop_fraction: float | None = None,
            interpolation: str | None = None) -> list[dict[str, Any]]:
    """Top-k (label, probability) per image; `mode` is one of `vitlab.optimize.MODES`. `normalize`, `resize`,
    `crop_fraction` and `interpolation` override the checkpoint's preprocessing."""
    from ..data import load_images, preprocess_of
    from ..data.labels import class_names
    from ..preprocess import cli_overrides
    from ..weights import hub, load_model, read_metadata

    if top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {top_k}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    model = load_model(checkpoint)
    meta = dict(read_metadata(checkpoint) or {})
    entry = hub.resolve(checkpoint).entry  # a registry name says its label set ("imagenet-1k", ...)
    if entry is not None and getattr(entry, "labels", None):
        meta.setdefault("labels", entry.labels)
    classes = class_names(meta, model.cfg.num_classes)
    overrides = cli_overrides(normalize=normalize, resize=resize, crop_fraction=crop_fraction,
                              interpolation=interpolation, in_chans=model.cfg.in_chans)
    pre = preprocess_of(model, what=str(checkpoint), **overrides)
    x = load_images(images, img_size=pre.img_size, in_chans=model.cfg.in_chans, preprocess=pre)
    net = optimize(model, mode) if mode != "fp32" else model.eval()
    with torch.no_grad():
        probs = net(x).float().softmax(-1)  # (B, classes)
    k = min(top_k, probs.shape[1])
    top = probs.topk(k, dim=1)
    return [{"image": path, "top": [{"label": classes[i], "index": int(i), "prob": float(p)}
                                    for p, i in zip(top.values[n].tolist(), top.indices[n].tolist())]}
            for n, path in enumerate(images)]


def run(args: argparse.Namespace) -> int:
    try:
        out = predict(args.checkpoint, args.images, args.top_k, args.normalize, args.mode, resize=args.pp_resize,
                      crop_fraction=args.crop_fraction, interpolation=args.interpolation)
    except (ValueError, FileNotFoundError, OSError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for r in out:
            print(r["image"] + ": " + ", ".join(f"{t['label']} {100 * t['prob']:.1f}%" for t in r["top"]))
    return 0
