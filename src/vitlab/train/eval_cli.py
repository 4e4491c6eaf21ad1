"""`vitlab eval CHECKPOINT --data SPEC [--split test] [--tta hflip] [--json]`: top-1, top-5, per-class accuracy and the
confusion matrix of a checkpoint on a dataset."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

from ..optimize import MODES, optimize
from ..preprocess import add_cli_arguments
from .loop import TTA_MODES, evaluate


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="a .safetensors checkpoint written by vitlab (or any format load_model reads)")
    p.add_argument("--data", required=True, help='dataset: "fashion_mnist", "imagefolder:/path", "cifar10:/path", ...')
    p.add_argument("--split", default="test", choices=("test", "val", "train"), help="which split (default test)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--precision", choices=("bf16", "fp32", "auto"), default="fp32",
                   help="autocast precision (eager); auto: bf16 on a CPU with AMX or a GPU with bf16, else fp32")
    p.add_argument("--mode", choices=MODES, default="fp32",
                   help="inference speed mode from vitlab.optimize instead of plain eager (docs/speed.md); "
                        "with any mode but fp32, --precision is ignored")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None)
    p.add_argument("--tta", choices=TTA_MODES, default="none",
                   help="test-time augmentation: hflip averages the probabilities of each image and its mirror "
                        "image (2x the compute); reported beside, never instead of, the single-view number")
    add_cli_arguments(p)
    p.add_argument("--json", action="store_true", help="print the full result as JSON")


def evaluate_checkpoint(checkpoint: str, data: str, *, split: str = "test", batch_size: int = 256,
                        precision: str = "fp32", device: str | None = None, mode: str = "fp32",
                        tta: str = "none", eval_resize: str | None = None,
                        crop_fraction: float | None = None, normalize: str | None = None,
                        interpolation: str | None = None) -> dict[str, Any]:
    """Evaluate a checkpoint on `split` of the dataset `data` (a `parse_data_spec` string), optionally through a
    `vitlab.optimize` speed mode (the top-1 then measures that mode's accuracy) and with test-time augmentation
    (`tta="hflip"`, see `evaluate`). Images are prepared as the checkpoint says (`vitlab.preprocess.resolve`: its
    stored preprocessing, else its format's convention, else a default with a warning) unless `normalize`,
    `eval_resize`, `crop_fraction` (which implies "center_crop") or `interpolation` say otherwise."""
    from ..data import build_eval_data, parse_data_spec, preprocess_of
    from ..preprocess import cli_overrides, data_overrides
    from ..weights import load_model

    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    if tta not in TTA_MODES:
        raise ValueError(f"unknown test-time augmentation {tta!r}; choose one of {', '.join(TTA_MODES)}")
    model = load_model(checkpoint)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.to(dev)
    cfg = model.cfg
    # evaluate the way the weights expect their inputs (normalisation, channel expansion, eval resize)
    overrides = cli_overrides(normalize=normalize, resize=eval_resize, crop_fraction=crop_fraction,
                              interpolation=interpolation, in_chans=cfg.in_chans)
    pre = preprocess_of(model, what=str(checkpoint), **overrides)
    data_cfg = parse_data_spec(data).replace(**data_overrides(pre))
    ev = build_eval_data(data_cfg, split, img_size=cfg.img_size, in_chans=cfg.in_chans, batch_size=batch_size)
    if ev.num_classes != cfg.num_classes:
        raise ValueError(f"the checkpoint has {cfg.num_classes} classes but {data} has {ev.num_classes}")
    net = model
    if mode != "fp32":
        net, precision = optimize(model, mode), "fp32"  # the mode sets its own dtype; no autocast around it
    result = evaluate(net, ev, cfg.num_classes, device=dev, precision=precision, class_names=list(ev.classes),
                      tta=tta)
    result.update({"checkpoint": checkpoint, "data": data, "split": split, "mode": mode, "tta": tta,
                   "eval_resize": data_cfg.eval_resize, "preprocess": pre.to_dict()})
    if data_cfg.eval_resize == "center_crop":
        result["crop_fraction"] = data_cfg.eval_crop_fraction
    return result


def format_result(r: dict[str, Any]) -> str:
    tta = "" if r.get("tta", "none") == "none" else f", test-time augmentation: {r['tta']}"
    crop = f", centre crop {r['crop_fraction']:g}" if r.get("eval_resize") == "center_crop" else ""
    lines = [f"{r['checkpoint']} on {r['data']} / {r['split']} ({r['num_samples']} images{crop}{tta})",
             f"top-1 {100 * r['top1']:.2f}%   top-5 {100 * r['top5']:.2f}%   loss {r['loss']:.4f}"]
    if r.get("preprocess"):
        from ..preprocess import Preprocess

        lines.append(f"preprocessing: {Preprocess.from_dict(r['preprocess']).describe()}")
    lines += ["", "per-class accuracy:"]
    width = max(len(c) for c in r["classes"])
    lines += [f"  {c:<{width}}  {100 * a:6.2f}%" for c, a in r["per_class"].items()]
    if len(r["classes"]) <= 20:
        lines += ["", "confusion matrix (rows: true, columns: predicted):"]
        lines += ["  " + " ".join(f"{v:5d}" for v in row) + f"  {c}" for c, row in zip(r["classes"], r["confusion"])]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        r = evaluate_checkpoint(args.checkpoint, args.data, split=args.split, batch_size=args.batch_size,
                                precision=args.precision, device=args.device, mode=args.mode, tta=args.tta,
                                eval_resize=args.pp_resize, crop_fraction=args.crop_fraction,
                                normalize=args.normalize, interpolation=args.interpolation)
    except (ValueError, FileNotFoundError, OSError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(r, indent=2) if args.json else format_result(r))
    return 0
