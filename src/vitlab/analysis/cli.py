"""`vitlab analyze CHECKPOINT --images PATH... | --data SPEC -o DIR`: the paper's figures for a checkpoint."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from ..preprocess import Preprocess, add_cli_arguments

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="any checkpoint vitlab can load (ours, npz, timm, HF, torchvision)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--images", nargs="+", metavar="PATH", help="image files, or folders of them")
    src.add_argument("--data", metavar="SPEC", help="a dataset, e.g. fashion_mnist or imagefolder:/path")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="folder for the PNG, JSON and HTML files")
    p.add_argument("--split", default="test", help="split of --data to take images from (default: test)")
    p.add_argument("--num-images", type=int, default=32, help="images taken from --data (default: 32)")
    p.add_argument("--img-size", type=int, nargs="+", metavar="PX",
                   help="input size H [W] (default: the model's); learned position embeddings are resampled")
    p.add_argument("--batch-size", type=int, default=16, help="images per forward pass; bounds memory (default: 16)")
    p.add_argument("--layer-maps", type=int, nargs="*", default=[], metavar="LAYER",
                   help="also draw every head's map of these layers (1-based; -1 is the last)")
    p.add_argument("--components", type=int, default=28, help="principal components of E to show (default: 28)")
    add_cli_arguments(p)
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if available)")
    p.add_argument("--force", action="store_true", help="replace report files already in DIR")


def load_checkpoint(path: str, device: torch.device) -> torch.nn.Module:
    """`vitlab.load_model(path)` on `device`, in eval mode, with a clear error when it cannot."""
    import vitlab

    try:
        loaded = vitlab.load_model(path)
    except FileNotFoundError as e:
        raise SystemExit(f"error: checkpoint {path} does not exist ({e})") from None
    except ValueError as e:  # WeightsError and bad configs: the message names the file and the problem
        raise SystemExit(f"error: {e}") from None
    model = loaded[0] if isinstance(loaded, tuple) else loaded
    return model.to(device).eval()


def preprocessing(args: argparse.Namespace, model, size: tuple[int, int]) -> Preprocess:
    """The resolved preprocessing (`vitlab.preprocess.resolve`): the flags, else the checkpoint's own, else the
    default with one warning; at the analysed size."""
    from ..data import preprocess_of
    from ..preprocess import cli_overrides

    try:
        overrides = cli_overrides(normalize=args.normalize, resize=args.pp_resize, crop_fraction=args.crop_fraction,
                                  interpolation=args.interpolation, in_chans=model.cfg.in_chans)
        return preprocess_of(model, what=str(args.checkpoint), img_size=size, **overrides)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


def data_settings(pre: Preprocess) -> dict:
    """DataConfig fields that make a dataset's eval pipeline apply `pre` (grey data repeated for RGB models)."""
    from ..preprocess import data_overrides

    try:
        return data_overrides(pre)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


def expand_image_paths(paths: list[str]) -> list[str]:
    """Files as given; folders replaced by their image files (sorted, not recursive)."""
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(str(f) for f in p.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise SystemExit(f"error: folder {p} holds no image files ({', '.join(sorted(IMAGE_SUFFIXES))})")
            out += found
        elif p.exists():
            out.append(str(p))
        else:
            raise SystemExit(f"error: image {p} does not exist")
    return out


def image_size(args: argparse.Namespace, model) -> tuple[int, int]:
    if not args.img_size:
        return model.cfg.img_hw
    if len(args.img_size) > 2:
        raise SystemExit(f"error: --img-size takes H or H W, got {args.img_size}")
    h, w = (args.img_size * 2)[:2]
    P = model.cfg.pixel_patch  # a hybrid's token covers ResNet stride x patch_size pixels
    what = f"the hybrid's pixels per token {P} (ResNet stride x patch size)" if model.cfg.hybrid_layers is not None \
        else f"the patch size {P}"
    if h <= 0 or w <= 0 or h % P or w % P:
        raise SystemExit(f"error: --img-size {h}x{w} must be positive multiples of {what}")
    return (h, w)


def load_inputs(args: argparse.Namespace, model) -> torch.Tensor:
    """(n, C, H, W) normalised images from --images or the first --num-images of --data's split."""
    from .. import data

    size = image_size(args, model)
    pre = preprocessing(args, model, size)
    if args.images:
        return data.load_images(expand_image_paths(args.images), img_size=size, in_chans=model.cfg.in_chans,
                                preprocess=pre)
    if args.num_images < 1:
        raise SystemExit(f"error: --num-images must be at least 1, got {args.num_images}")
    cfg = data.parse_data_spec(args.data).replace(**data_settings(pre))
    loader = data.build_eval_data(cfg, args.split, img_size=size, in_chans=model.cfg.in_chans,
                                  batch_size=min(args.num_images, 256))
    batches, n = [], 0
    for batch in loader:
        images = batch[0]
        batches.append(images[: args.num_images - n])
        n += len(batches[-1])
        if n >= args.num_images:
            break
    if not batches:
        raise SystemExit(f"error: split {args.split!r} of {args.data} has no images")
    return torch.cat(batches)


def run(args: argparse.Namespace) -> int:
    from .report import analyze, write_report

    if args.batch_size < 1:
        raise SystemExit(f"error: --batch-size must be at least 1, got {args.batch_size}")
    if args.components < 1:
        raise SystemExit(f"error: --components must be at least 1, got {args.components}")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = load_checkpoint(args.checkpoint, device)
    depth = len(model.blocks)
    layers = []
    for layer in args.layer_maps:
        if layer == 0 or not -depth <= layer <= depth:
            raise SystemExit(f"error: --layer-maps {layer} is not a layer of this {depth}-layer model (1..{depth}, "
                             f"or -1 for the last)")
        layers.append(layer - 1 if layer > 0 else layer)
    images = load_inputs(args, model)
    result = analyze(model, images, batch_size=args.batch_size, layer_maps=layers, num_components=args.components,
                     source=str(args.checkpoint))
    try:
        files = write_report(result, args.output, overwrite=args.force)
    except (FileExistsError, NotADirectoryError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for name, f in result.findings.items():
        print(f"{name}: {'yes' if f['yes'] else 'no'}")
    print(f"wrote {len(files)} files to {args.output} (open {Path(args.output) / 'report.html'})")
    return 0
