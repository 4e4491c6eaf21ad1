"""`vitlab convert SRC DST [--to FORMAT]`: read any supported checkpoint, write it for vitlab or another library.

    vitlab convert run/final.safetensors vit-hf --to hf        # transformers' ViTForImageClassification directory
    vitlab convert ViT-B_16.npz vit_b_16.pth --to torchvision  # torchvision's VisionTransformer state dict
    vitlab convert hf-dir ours.safetensors                     # without --to: the suffix says (.safetensors, .npz)
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from ..config import RESIZE_MODES
from .api import load_model, read_metadata
from .publish import EXPORT_FORMATS, export
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
    p.add_argument("src", help="checkpoint: .npz (vit_jax), .safetensors, .pth/.bin, a transformers dir, or a name "
                               "(registry, hf-hub:owner/repo, gs://, https://; see `vitlab weights`)")
    p.add_argument("dst", type=Path, help="output: a file, or for --to hf a directory")
    p.add_argument("--to", choices=EXPORT_FORMATS,
                   help="vitlab: .safetensors with the config inside; npz: Google's vit_jax names; hf: a transformers "
                        "ViTForImageClassification directory (config.json, model.safetensors, "
                        "preprocessor_config.json); torchvision: a state dict for torchvision's VisionTransformer "
                        "(.pth); timm: a state dict in timm's names (.safetensors or .pth). Default: from DST's suffix "
                        "(.safetensors: vitlab, .npz: npz)")
    p.add_argument("--force", action="store_true", help="replace DST if it exists")
    p.add_argument("--img-size", type=_img_size, help="resample position embeddings to this size (N or HxW)")
    p.add_argument("--num-classes", type=int, help="replace the head by a zero one with this many classes")
    p.add_argument("--num-heads", type=int, help="heads, for formats that do not store them (timm, torchvision)")
    p.add_argument("--pos-embed-resize", choices=RESIZE_MODES,
                   help="resampling mode (default: jax for .npz sources, bicubic otherwise)")


def convert(src: str | Path, dst: Path, *, force: bool = False, pos_embed_resize: str | None = None,
            to: str | None = None, **overrides) -> str:
    """Convert `src` to `dst` in format `to` (default: from the suffix); returns the load report and what was
    written as text. Metadata of the source is carried over where the format holds it."""
    to = to or _format_from_suffix(dst)
    if dst.exists() and not force and not (to == "hf" and dst.is_dir() and not any(dst.iterdir())):
        raise FileExistsError(f"{dst} already exists; pass --force to replace it")
    if os.path.exists(src) and dst.exists() and Path(src).resolve() == dst.resolve():
        raise ValueError(f"source and destination are the same file: {src}")
    model, report = load_model(src, pos_embed_resize=pos_embed_resize, return_report=True, **overrides)
    meta = {**read_metadata(src), "converted_from": {"path": str(src), "format": report.format}}
    _, notes = export(model, dst, to, metadata=meta, overwrite=force)
    c = model.cfg
    params = sum(p.numel() for p in model.parameters())
    lines = [str(report), f"wrote {dst} ({to}): embed_dim={c.embed_dim} depth={c.depth} num_heads={c.num_heads} "
             f"patch_size={c.patch_size} img_size={c.img_size} num_classes={c.num_classes}, {params:,} parameters"]
    return "\n".join(lines + [f"  {n}" for n in notes])


def _format_from_suffix(dst: Path) -> str:
    if dst.suffix == ".safetensors":
        return "vitlab"
    if dst.suffix == ".npz":
        return "npz"
    raise ValueError(f"cannot tell the format of {dst}: use a .safetensors (vitlab) or .npz (Google) suffix, or "
                     f"--to {{{','.join(EXPORT_FORMATS)}}}")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    overrides = {k: v for k, v in (("img_size", args.img_size), ("num_classes", args.num_classes),
                                   ("num_heads", args.num_heads)) if v is not None}
    try:
        print(convert(args.src, args.dst, force=args.force, pos_embed_resize=args.pos_embed_resize, to=args.to,
                      **overrides))
    except (WeightsError, FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, ValueError,
            TypeError) as e:
        print(f"vitlab convert: error: {e}", file=sys.stderr)
        return 1
    return 0
