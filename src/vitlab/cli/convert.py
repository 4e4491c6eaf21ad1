"""`vitlab convert SRC DST [--to FORMAT]`: read any supported checkpoint, write it for vitlab or another library."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..models.config import RESIZE_MODES
from ._common import add_force, add_img_size, add_progress, check_output, want_progress

HELP = "convert a checkpoint between vitlab, npz, hf, torchvision and timm formats"
DESCRIPTION = """\
Read any checkpoint vitlab loads (its .safetensors, Google's vit_jax .npz, timm, transformers, torchvision, or a
registry / hf-hub: / gs:// / https name) and write it as DST in the format --to names, carrying the source's
metadata where the format holds it. The load report (format, inferred fields) and how to load DST are printed.
Library: vitlab.weights.convert."""
EXAMPLES = """\
  vitlab convert run/final.safetensors vit-hf --to hf        # transformers' ViTForImageClassification folder
  vitlab convert ViT-B_16.npz vit_b_16.pth --to torchvision  # torchvision's VisionTransformer state dict
  vitlab convert hf-dir ours.safetensors                     # without --to: the suffix says (.safetensors, .npz)
  vitlab convert ViT-B_16.npz b16-384.safetensors --img-size 384   # position embeddings resampled"""

# vitlab.weights.publish.EXPORT_FORMATS, spelled out so that --help imports no torch (tests/test_cli.py checks
# that they agree)
FORMATS = ("vitlab", "npz", "hf", "torchvision", "timm")
# vitlab.weights.hf_families.WRITE and "vit" (likewise spelled out)
HF_MODEL_TYPES = ("vit", "dinov2", "dinov2_with_registers", "clip_vision_model", "siglip_vision_model", "vit_mae",
                  "deit")



def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="checkpoint: .npz (vit_jax), .safetensors, .pth/.bin, a transformers dir, or a name "
                               "(registry, hf-hub:owner/repo, gs://, https://; see `vitlab weights`)")
    p.add_argument("dst", type=Path, help="output: a file, or for --to hf a directory")
    p.add_argument("--to", choices=FORMATS,
                   help="vitlab: .safetensors with the config inside; npz: Google's vit_jax names; hf: a transformers "
                        "directory (ViTForImageClassification, or the DINOv2 / CLIP / SigLIP / DeiT class that "
                        "computes the model; config.json, model.safetensors, "
                        "preprocessor_config.json); torchvision: a state dict for torchvision's VisionTransformer "
                        "(.pth); timm: a state dict in timm's names (.safetensors or .pth). Default: from DST's suffix "
                        "(.safetensors: vitlab, .npz: npz)")
    p.add_argument("--hf-model-type", choices=HF_MODEL_TYPES,
                   help="with --to hf: the transformers model_type to write (default: the one that computes the "
                        "model: vit for the paper's ViT, dinov2 / dinov2_with_registers / clip_vision_model / "
                        "siglip_vision_model / deit for those families; vit_mae only when asked)")
    add_force(p, "replace DST if it exists")
    add_img_size(p, "resample position embeddings to this input size (default: the source's)")
    p.add_argument("--num-classes", type=int, help="replace the head by a zero one with this many classes")
    p.add_argument("--num-heads", type=int, help="heads, for formats that do not store them (timm, torchvision)")
    p.add_argument("--pos-embed-resize", choices=RESIZE_MODES,
                   help="resampling mode for --img-size (default: jax for .npz sources, bicubic otherwise)")
    add_progress(p)


def run(args: argparse.Namespace) -> int:
    from ..weights.convert import convert

    check_output(args.dst, folder=args.to == "hf")  # --to hf writes a folder
    overrides = {k: v for k, v in (("img_size", args.img_size), ("num_classes", args.num_classes),
                                   ("num_heads", args.num_heads)) if v is not None}
    result = convert(args.src, args.dst, to=args.to, force=args.force, pos_embed_resize=args.pos_embed_resize,
                     progress=want_progress(args), hf_model_type=args.hf_model_type, **overrides)
    print(result.summary())
    return 0
