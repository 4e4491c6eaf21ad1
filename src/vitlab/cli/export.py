"""`vitlab export CHECKPOINT OUT [--to onnx|openvino] [--int8 --calib DATA]`: an ONNX graph or an OpenVINO IR with a
dynamic batch, fp32 or int8, checked against PyTorch; thin over `vitlab.deploy.export.export` with its
`ExportOptions`, plus the real images for calibration and verification (files, a data set, or the recipe's)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..utils.extras import require
from ._common import UsageError, add_force, add_img_size, check_output, positive

HELP = "export a checkpoint to ONNX or OpenVINO (fp32 or int8), verified against PyTorch"
DESCRIPTION = """\
Export a checkpoint for deployment, input `images` (B, C, H, W) with B dynamic, output `logits`:
  --to onnx      torch.onnx.export (dynamo); --int8: ONNX Runtime static QDQ quantisation (U8 activations, S8
                 weights per channel) calibrated on --calib. Needs the `export` extra.
  --to openvino  openvino.convert_model, saved as IR (.xml + .bin); --int8: NNCF post-training quantisation
                 (its defaults) calibrated on --calib. Needs the `openvino` extra.
The written file is run by its runtime and compared with PyTorch before it is moved into place: random images at
batch 1 and 3 (fp32: logits within 1e-4, scaled by the largest logit) and real images (--verify-data; default the
test split of the calibration data set or of the data set in the recipe.yaml beside the checkpoint): top-1
agreement and max logit difference are reported, and an int8 model agreeing on fewer than --min-agreement of them
is not written. An OpenVINO IR is checked at fp32 inference precision and records it (rt_info runtime_options
INFERENCE_PRECISION_HINT); the summary also says what plain OpenVINO (compile_model with no config) gives on this
CPU, which defaults to bf16 where the CPU has it: then compile with {"INFERENCE_PRECISION_HINT": "f32"}.
--calib is a data set spec (fashion_mnist, imagefolder:/path, ...: its train split) or image files / folders;
without it, the training images of the data set named in the checkpoint's recipe.yaml.
Library: vitlab.deploy.export, vitlab.deploy.runtimes."""
EXAMPLES = """\
  vitlab export runs/finetune/model.safetensors vit.onnx
  vitlab export runs/fmnist/model.safetensors vit.xml --to openvino --int8            # calibrates on its recipe's data
  vitlab export runs/fmnist/model.safetensors vit-int8.onnx --int8 --calib fashion_mnist --calib-images 300
  vitlab export vit_b_16.IMAGENET1K_V1 vit-b16.xml --to openvino --int8 --calib photos/ --verify-data imagefolder:/val
  python -c "import onnxruntime as ort; ort.InferenceSession('vit.onnx').run(None, {'images': x})\""""

DEFAULT_OPSET = 20  # vitlab.deploy.runtimes.DEFAULT_OPSET (tests/test_cli.py checks that they agree)
TARGETS = ("onnx", "openvino")  # vitlab.deploy.export.TARGETS
SUFFIXES = {".onnx": "onnx", ".xml": "openvino"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint",
                   help="a checkpoint vitlab can load (.safetensors, .npz, timm, HF, torchvision, a name)")
    p.add_argument("output", help="destination file: .onnx (--to onnx) or .xml (--to openvino; the .bin beside it)")
    p.add_argument("--to", choices=TARGETS, help="the format (default: from the output's suffix, else onnx)")
    p.add_argument("--int8", action="store_true", help="post-training int8 quantisation calibrated on --calib")
    p.add_argument("--calib", metavar="DATA",
                   help="calibration images: a data set spec (its train split) or image files/folders (default: "
                        "the data set of the recipe.yaml beside the checkpoint)")
    p.add_argument("--calib-images", type=int, default=300, help="calibration images used (NNCF's default: 300)")
    p.add_argument("--verify-data", metavar="DATA",
                   help="real images to verify on: a data set spec (its test split) or image files/folders "
                        "(default: the test split of the calibration or recipe data set)")
    p.add_argument("--verify-images", type=int, default=500, help="verification images used")
    p.add_argument("--min-agreement", type=float, default=0.95,
                   help="int8: the least top-1 agreement with PyTorch on the verification images to write the file")
    add_img_size(p, "input size baked into the graph (default: the checkpoint's)")
    p.add_argument("--opset", type=int, default=DEFAULT_OPSET, help="ONNX opset version")
    add_force(p, "replace an existing output file")
    p.add_argument("--no-verify", action="store_true", help="skip the check against PyTorch (fp32 only)")


def run(args: argparse.Namespace) -> int:
    to = args.to or SUFFIXES.get(Path(args.output).suffix.lower(), "onnx")
    suffix = {v: k for k, v in SUFFIXES.items()}[to]
    if Path(args.output).suffix.lower() != suffix:
        raise UsageError(f"--to {to} writes a {suffix} file; got {args.output}")
    if args.calib is not None and not args.int8:
        raise UsageError("--calib is for --int8")
    if args.no_verify and args.int8:
        raise UsageError("--no-verify is for fp32 exports: an int8 model is always checked against PyTorch")
    positive("--calib-images", args.calib_images)
    positive("--verify-images", args.verify_images)
    if not 0 <= args.min_agreement <= 1:
        raise UsageError(f"--min-agreement must be within 0..1, got {args.min_agreement}")

    if to == "openvino":  # a missing extra: said before loading anything
        require("openvino", "openvino", "--to openvino")
        if args.int8:
            from ..deploy.runtimes import require_nncf

            require_nncf()
    else:
        require("onnxruntime", "export", "--to onnx")
    check_output(args.output, folder=False)

    from ..deploy.export import ExportOptions, export
    from ..weights import load_model

    overrides = {"img_size": args.img_size} if args.img_size is not None else {}
    model = load_model(args.checkpoint, **overrides).float().eval()
    calib = None
    if args.int8:
        calib, calib_src = _real_images(model, args.checkpoint, args.calib, "train", args.calib_images,
                                        what="--int8 needs calibration images")
        print(f"calibrating on {len(calib)} images of {calib_src}")
    verify, verify_src = None, ""
    if not args.no_verify:
        source = args.verify_data if args.verify_data is not None else args.calib
        same_files = args.verify_data is None and args.calib is not None and Path(args.calib).exists()
        if source is not None or _has_recipe(args.checkpoint):
            verify, verify_src = _real_images(model, args.checkpoint, source, "test", args.verify_images,
                                              what="verification")
            if same_files:
                verify_src += " (the calibration images: give --verify-data for held-out ones)"
    options = ExportOptions(opset=args.opset, overwrite=args.force, verify_batches=() if args.no_verify else (1, 3),
                            int8=args.int8, calib=calib, calib_images=args.calib_images, verify_images=verify,
                            verify_source=verify_src, min_agreement=args.min_agreement)
    report = export(model, args.output, to, options)
    print(report.summary())
    if verify is None and not args.no_verify:
        print("top-1 agreement on real images not measured: no data set known for this checkpoint; give "
              "--verify-data SPEC")
    return 0


# -- real images for calibration and verification ----------------------------------------------------------


def _recipe_data(checkpoint: str | Path) -> Any:
    """The `vitlab.data.DataConfig` of the recipe.yaml beside `checkpoint` (in its folder or the one above, as a
    training run writes them), or None."""
    from ..train.recipe import data_config_from_dict, read_recipe_dict

    for recipe in _recipe_files(checkpoint):
        data = read_recipe_dict(recipe).get("data")
        if isinstance(data, dict):
            return data_config_from_dict(data)
    return None


def _recipe_files(checkpoint: str | Path) -> list[Path]:
    """The recipe.yaml files beside an existing `checkpoint`: in its folder, then in the one above."""
    p = Path(checkpoint)
    return [d / "recipe.yaml" for d in (p.parent, p.parent.parent) if (d / "recipe.yaml").is_file()] if p.exists() \
        else []


def _has_recipe(checkpoint: str) -> bool:
    return bool(_recipe_files(checkpoint))


def _real_images(model: Any, checkpoint: str | Path, source: str | None, split: str, n: int, *,
                 what: str = "images") -> tuple[Any, str]:
    """Up to `n` real images (n, C, H, W) prepared for `model`, and where they came from.

    Args:
        model: The loaded model (its size and channels decide the preparation).
        checkpoint: Where it was loaded from (its preprocessing; the recipe.yaml beside it).
        source: Image files or folders, or a data set spec ("fashion_mnist", "imagefolder:/path": its `split`);
            None: `split` of the data set in the recipe.yaml beside `checkpoint`.
        split: "train" (calibration) or "test" (verification).
        n: Images to take.
        what: Names the purpose in the error when there is no source.

    Raises:
        ValueError: No source and no recipe.yaml; an empty source; a data set that does not fit the model.
        FileNotFoundError: A file, folder or data set that does not exist.
    """
    from ..analysis.inputs import analysis_preprocess, expand_image_paths, load_inputs
    from ..data import first_images

    cfg: Any = getattr(model, "cfg", None)
    if source is None:
        dc = _recipe_data(checkpoint)
        if dc is None:
            raise ValueError(f"{what}: give --calib DATA (a data set spec such as fashion_mnist or "
                             f"imagefolder:/path, or image files/folders); {checkpoint} has no recipe.yaml beside "
                             f"it naming its data set")
        images = first_images(dc, split, n, img_size=cfg.img_hw, in_chans=cfg.in_chans)
        if images is None:
            raise ValueError(f"split {split!r} of the recipe's data set {dc.dataset} has no images")
        return images, f"{dc.dataset}/{split} (the checkpoint's recipe.yaml)"
    pre = analysis_preprocess(model, checkpoint, cfg.img_hw)
    if Path(source).exists():
        paths = expand_image_paths([source])[:n]
        return load_inputs(model, pre, images=paths), f"{source}"
    images = load_inputs(model, pre, data=source, split=split, num_images=n)
    return images, f"{source}/{split}"
