"""`vitlab bench`: our ViT against timm, transformers, torchvision and onnxruntime; thin over
`vitlab.bench.run_bench`."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

from ._common import UsageError, add_device, add_img_size, add_output, check_output, positive
from .eval import MODES

HELP = "throughput, latency, memory and MFU against timm, transformers, torchvision"
DESCRIPTION = """\
Our ViT against timm, transformers, torchvision, ONNX Runtime (fp32, static int8) and OpenVINO (fp32, bf16, NNCF
int8; `openvino` extra) in one process: every peer is built with our shape and loaded with our weights (its logits
must match ours; int8 runtimes calibrate on real training images), then all candidates run interleaved after a
warm-up, so a change in the machine's load hits them alike. Each inference candidate's accuracy cost (top-1
agreement with our fp32 model, largest logit difference) is measured on real test images (--accuracy-data).
Reported: median and min/max over the rounds, the paired ratio of our time to each peer's, MFU against this
machine's measured matmul peak, and peak memory; the same results go to bench.json, bench.txt and bench.png in the
output folder. Library: vitlab.bench."""
EXAMPLES = """\
  vitlab bench --model ViT-B/16 --batch-sizes 1 8 32 --dtypes fp32 bf16 --modes int8 compile
  vitlab bench --model ViT-B/16 --batch-sizes 8 1 --dtypes fp32 --modes int8-static auto --train-batch 0
  vitlab bench --model ViT-Ti/16 --img-size 32 --depth 2 --rounds 2 --peak-size 256 -o /tmp/b   # seconds"""

# vitlab.bench.PEERS and DTYPES, spelled out so that --help imports no torch (tests/test_cli.py checks that they
# agree)
PEERS = ("timm", "transformers", "torchvision", "onnxruntime", "onnxruntime-int8", "onnxruntime-int8-dynamic",
         "openvino", "openvino-int8")
DTYPES = ("bf16", "fp32")
# our torch speed modes (vitlab.optimize's, less the runtimes, which are --peers); the calibrated ones (int8-static,
# auto) calibrate on the training images of --accuracy-data, as the int8 runtimes do
BENCH_MODES = (*MODES, "int8-static", "auto")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="ViT-B/16", help="variant name (see `vitlab models`)")
    add_img_size(p, "square input size in pixels", default=224)
    p.add_argument("--depth", type=int, help="override the number of blocks (quick runs)")
    p.add_argument("--num-classes", type=int, default=1000, help="classes of the head")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32], help="inference batch sizes")
    p.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=DTYPES, help="inference dtypes")
    p.add_argument("--peers", nargs="*", default=list(PEERS), choices=PEERS, help="libraries to compare with")
    p.add_argument("--modes", nargs="*", default=["int8", "compile"], choices=BENCH_MODES,
                   help="our speed modes to measure alongside fp32 (vitlab.optimize); int8-static and auto "
                        "calibrate on --calib-images training images of --accuracy-data")
    p.add_argument("--train-batch", type=int, default=32, help="batch of the training step; 0 skips training")
    p.add_argument("--train-peers", nargs="*", default=["timm", "transformers", "torchvision"], choices=PEERS[:3],
                   help="libraries whose training step is timed")
    p.add_argument("--no-grad-checkpointing", action="store_true", help="skip the gradient-checkpointing run")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per candidate before the rounds")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timed rounds per candidate")
    p.add_argument("--iters", type=int, default=1, help="calls per round")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    add_device(p)
    p.add_argument("--peak-size", type=int, default=2048, help="side of the square matmuls that measure the peak")
    p.add_argument("--accuracy-data", default="fashion_mnist", metavar="SPEC",
                   help="real images for the accuracy cost (test split) and int8 calibration (train split); "
                        "'none': random images")
    p.add_argument("--accuracy-images", type=int, default=64,
                   help="test images each inference candidate is compared with our fp32 model on (0: none)")
    p.add_argument("--calib-images", type=int, default=300, help="training images the int8 runtimes calibrate on")
    add_output(p, "folder for bench.json, bench.txt, bench.png", default="bench-results", metavar="DIR")
    p.add_argument("--no-png", action="store_true", help="do not draw bench.png")


def run(args: argparse.Namespace) -> int:
    import torch

    from ..bench import BenchConfig, format_table, run_bench, write_outputs

    if any(v <= 0 for v in args.batch_sizes):
        raise UsageError(f"--batch-sizes must be positive, got {args.batch_sizes}")
    positive("--rounds", args.rounds)
    positive("--iters", args.iters)
    positive("--warmup", args.warmup, minimum=0)
    positive("--train-batch", args.train_batch, minimum=0)
    positive("--accuracy-images", args.accuracy_images, minimum=0)
    positive("--calib-images", args.calib_images)
    check_output(args.output, folder=True)  # before minutes of measuring
    size = args.img_size
    if isinstance(size, tuple):
        if size[0] != size[1]:
            raise UsageError(f"vitlab bench measures square inputs; got --img-size {size[0]}x{size[1]}")
        size = size[0]
    overrides = {"num_classes": args.num_classes}
    if args.depth:
        overrides["depth"] = args.depth
    bc = BenchConfig(
        model=args.model, img_size=size, batch_sizes=tuple(args.batch_sizes), dtypes=tuple(args.dtypes),
        peers=tuple(args.peers), modes=tuple(args.modes), train_batch=args.train_batch or None,
        train_peers=tuple(args.train_peers), grad_checkpointing=not args.no_grad_checkpointing,
        warmup=args.warmup, rounds=args.rounds, iters=args.iters, threads=args.threads,
        device=args.device or ("cuda" if torch.cuda.is_available() else "cpu"), peak_size=args.peak_size,
        overrides=overrides, accuracy_data=None if args.accuracy_data.lower() == "none" else args.accuracy_data,
        accuracy_images=args.accuracy_images, calib_images=args.calib_images,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        out = run_bench(bc)
    print(format_table(out))
    for path in write_outputs(out, Path(args.output), png=not args.no_png):
        print(f"wrote {path}")
    return 0
