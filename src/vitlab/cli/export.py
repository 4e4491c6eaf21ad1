"""`vitlab export CHECKPOINT model.onnx`: an ONNX graph with a dynamic batch, checked against PyTorch; thin over
`vitlab.export.export_onnx`."""

from __future__ import annotations

import argparse

from ._common import add_force, add_img_size, check_output

HELP = "export a checkpoint to ONNX with a dynamic batch"
DESCRIPTION = """\
Export a checkpoint to ONNX (torch.onnx.export with dynamo=True): input `images` (B, C, H, W) with B symbolic,
output `logits` (B, num_classes). The graph is checked with onnxruntime against PyTorch at batch 1 and 3 before it
is moved into place, so a failed export never leaves a half-written or clobbered file. Needs the `export` extra.
Library: vitlab.export.export_onnx."""
EXAMPLES = """\
  vitlab export runs/finetune/model.safetensors vit.onnx
  vitlab export vit_b_16.IMAGENET1K_V1 vit-b16-384.onnx --img-size 384 --force
  python -c "import onnxruntime as ort; ort.InferenceSession('vit.onnx').run(None, {'images': x})\""""

DEFAULT_OPSET = 18  # vitlab.export.DEFAULT_OPSET (tests/test_cli.py checks that they agree)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint",
                   help="a checkpoint vitlab can load (.safetensors, .npz, timm, HF, torchvision, a name)")
    p.add_argument("output", help="destination .onnx file")
    add_img_size(p, "input size baked into the graph (default: the checkpoint's)")
    p.add_argument("--opset", type=int, default=DEFAULT_OPSET, help="ONNX opset version")
    add_force(p, "replace an existing output file")
    p.add_argument("--no-verify", action="store_true", help="skip the onnxruntime check (batch 1 and 3, 1e-4)")


def run(args: argparse.Namespace) -> int:
    from ..export import export_onnx
    from ..weights import load_model

    check_output(args.output, folder=False)
    overrides = {"img_size": args.img_size} if args.img_size is not None else {}
    model = load_model(args.checkpoint, **overrides).float()
    report = export_onnx(model, args.output, opset=args.opset, overwrite=args.force,
                         verify_batches=() if args.no_verify else (1, 3))
    print(report.summary())
    return 0
