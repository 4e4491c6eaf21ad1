"""`vitlab convert SRC DST`: read any supported checkpoint, write ours (.safetensors) or Google's (.npz)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ..config import RESIZE_MODES
from .api import load_model, read_metadata, save_weights
from .report import WeightsError


def _img_size(text: str) -> int | tuple[int, int]:
    parts = text.lower().replace("x", ",").split(",")
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"image size must be N or HxW, got {text!r}") from None
    if len(sizes) == 1:
        return sizes[0]
    if len(sizes) == 2:
        return (sizes[0], sizes[1])
    raise argparse.ArgumentTypeError(f"image size must be N or HxW, got {text!r}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", type=Path, help="checkpoint: .npz (vit_jax), .safetensors, .pth/.bin, or a transformers dir")
    p.add_argument("dst", type=Path, help="output: .safetensors (vitlab, config inside) or .npz (Google's names)")
    p.add_argument("--force", action="store_true", help="replace DST if it exists")
    p.add_argument("--img-size", type=_img_size, help="resample position embeddings to this size (N or HxW)")
    p.add_argument("--num-classes", type=int, help="replace the head by a zero one with this many classes")
    p.add_argument("--num-heads", type=int, help="heads, for formats that do not store them (timm, torchvision)")
    p.add_argument("--pos-embed-resize", choices=RESIZE_MODES,
                   help="resampling mode (default: jax for .npz sources, bicubic otherwise)")


def convert(src: Path, dst: Path, *, force: bool = False, pos_embed_resize: str | None = None, **overrides) -> str:
    """Convert `src` to `dst`; returns the load report as text. Metadata of the source is carried over."""
    if dst.exists() and not force:
        raise FileExistsError(f"{dst} already exists; pass --force to replace it")
    if src.exists() and dst.exists() and src.resolve() == dst.resolve():
        raise ValueError(f"source and destination are the same file: {src}")
    model, report = load_model(src, pos_embed_resize=pos_embed_resize, return_report=True, **overrides)
    meta = None
    if dst.suffix == ".safetensors":  # .npz holds parameters only
        meta = {**read_metadata(src), "converted_from": {"path": str(src), "format": report.format}}
    save_weights(model, dst, meta, overwrite=force)
    c = model.cfg
    params = sum(p.numel() for p in model.parameters())
    return (f"{report}\nwrote {dst}: embed_dim={c.embed_dim} depth={c.depth} num_heads={c.num_heads} "
            f"patch_size={c.patch_size} img_size={c.img_size} num_classes={c.num_classes}, {params:,} parameters")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    overrides = {k: v for k, v in (("img_size", args.img_size), ("num_classes", args.num_classes),
                                   ("num_heads", args.num_heads)) if v is not None}
    try:
        print(convert(args.src, args.dst, force=args.force, pos_embed_resize=args.pos_embed_resize, **overrides))
    except (WeightsError, FileNotFoundError, FileExistsError, IsADirectoryError, ValueError, TypeError) as e:
        print(f"vitlab convert: error: {e}", file=sys.stderr)
        return 1
    return 0
