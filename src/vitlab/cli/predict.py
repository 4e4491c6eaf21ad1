"""`vitlab predict CHECKPOINT IMAGE... [--top-k 5] [--json]`: classify image files; thin over `vitlab.predict`."""

from __future__ import annotations

import argparse
import json

from ._common import add_memory, add_preprocess, apply_memory, positive, preprocess_overrides
from .eval import MODES

HELP = "classify image files with a checkpoint"
DESCRIPTION = """\
Classify image files with a checkpoint and print the most likely classes by name. Images are prepared as the
checkpoint says (its stored preprocessing, else its format's convention, else a default with a warning); the flags
override it. Names come from the checkpoint (vitlab train's classes, a transformers or timm config's labels), else
ImageNet-1k's for a 1000-class head. Library: vitlab.predict."""
EXAMPLES = """\
  vitlab predict vit_b_16.IMAGENET1K_V1 cat.jpg dog.jpg
  vitlab predict runs/fmnist/model.safetensors shoe.png --top-k 3 --json
  vitlab predict hf-hub:google/vit-base-patch16-224 photos/*.jpg --mode int8"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="a checkpoint (any format load_model reads, or a registry name)")
    p.add_argument("images", nargs="+", help="image files")
    p.add_argument("--top-k", type=int, default=5, help="classes shown per image")
    p.add_argument("--batch-size", type=int, default=16,
                   help="images decoded and classified at a time (memory grows with it, not with the number of "
                        "images)")
    add_preprocess(p)
    p.add_argument("--mode", choices=MODES, default="fp32",
                   help="inference speed mode from vitlab.optimize (accuracy cost per mode: docs/speed.md)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    add_memory(p)


def run(args: argparse.Namespace) -> int:
    from ..inference.predict import iter_predict

    positive("--top-k", args.top_k)
    positive("--batch-size", args.batch_size)
    apply_memory(args.memory)  # bounded: the peak memory is one batch's however many images; reuse: faster
    results = iter_predict(args.checkpoint, args.images, args.top_k, preprocess_overrides(args), args.mode,
                           batch_size=args.batch_size)
    if args.json:
        print(json.dumps(list(results), indent=2))
    else:  # each line as soon as its batch is done
        for r in results:
            print(r["image"] + ": " + ", ".join(f"{t['label']} {100 * t['prob']:.1f}%" for t in r["top"]), flush=True)
    return 0
