"""`vitlab predict CHECKPOINT IMAGE... [--top-k 5] [--json]`: classify image files, labels by name (the class names
stored in the checkpoint's metadata by `vitlab train`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

from ..optimize import MODES, optimize


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="a .safetensors checkpoint written by vitlab")
    p.add_argument("images", nargs="+", help="image files")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--normalize", choices=("inception", "imagenet"), default=None,
                   help="pixel normalisation (default: the one the checkpoint was trained with, else inception)")
    p.add_argument("--mode", choices=MODES, default="fp32",
                   help="inference speed mode from vitlab.optimize (accuracy cost per mode: docs/speed.md)")
    p.add_argument("--json", action="store_true")


def predict(checkpoint: str, images: list[str], top_k: int = 5, normalize: str | None = None,
            mode: str = "fp32") -> list[dict[str, Any]]:
    """Top-k (label, probability) per image. Images are resized to the model's input size; `mode` is one of
    `vitlab.optimize.MODES`."""
    from ..data import load_images
    from ..weights import load_model, read_metadata

    if top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {top_k}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    model = load_model(checkpoint)
    meta = read_metadata(checkpoint) or {}
    classes = meta.get("classes") or [str(i) for i in range(model.cfg.num_classes)]
    if normalize is None:
        normalize = ((meta.get("recipe") or {}).get("data") or {}).get("normalize", "inception")
    x = load_images(images, img_size=model.cfg.img_size, in_chans=model.cfg.in_chans, normalize=normalize)
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
        out = predict(args.checkpoint, args.images, args.top_k, args.normalize, args.mode)
    except (ValueError, FileNotFoundError, OSError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for r in out:
            print(r["image"] + ": " + ", ".join(f"{t['label']} {100 * t['prob']:.1f}%" for t in r["top"]))
    return 0
