"""`vitlab serve MODEL [--mode M] [--workers N] ...`: the model behind an HTTP API; thin over `vitlab.serve`."""

from __future__ import annotations

import argparse
import os

from ..serving.config import MODES
from ._common import UsageError, positive

HELP = "serve a checkpoint over HTTP: batched predictions, a page to try it, metrics"
DESCRIPTION = """\
Serve a checkpoint over HTTP until SIGTERM (drains the requests in flight, exit 0) or Ctrl-C (130). POST /predict
takes image bytes (JPEG, PNG, WebP, BMP, TIFF, GIF) or several images as multipart file parts and answers the top-k
classes as JSON, prepared as the checkpoint says; concurrent requests are batched (--max-batch-size,
--batch-timeout). GET / is a page to try it (top-5 and the attention rollout), /health, /metrics (Prometheus),
/docs and /openapi.json describe the rest. Over --max-queue requests in flight the answer is 503 with Retry-After.
A checkpoint that cannot load, or a mode that cannot be built, exits 1 before anything listens. Binds 127.0.0.1
unless --host says otherwise. Library: vitlab.serve; design and measurements: docs/serving.md."""
EXAMPLES = """\
  vitlab serve runs/fmnist/model.safetensors
  vitlab serve vit_b_16.IMAGENET1K_V1 --mode int8 --workers 2 --port 8080
  vitlab serve hf-hub:google/vit-base-patch16-224 --mode int8-static --calib photos/ --host 0.0.0.0 --api-key KEY
  curl -F file=@cat.jpg -F file=@dog.jpg http://127.0.0.1:8000/predict"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="a checkpoint file or folder, a registry name, hf-hub:ID, a URL")
    p.add_argument("--mode", choices=MODES, default="fp32",
                   help="vitlab.optimize speed mode run by the workers (accuracy cost per mode: docs/speed.md)")
    p.add_argument("--calib", metavar="DIR", help="real images to calibrate the int8-static/openvino-int8/ort-int8 "
                   "modes and check auto's choice on")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0: a free one, named in the ready line)")
    p.add_argument("--workers", type=int, default=1, help="inference processes, each with its own model")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per worker (default: the cores divided among the workers)")
    p.add_argument("--max-batch-size", type=int, default=16, help="images per forward pass at most")
    p.add_argument("--batch-timeout", type=float, default=0.01, metavar="SECONDS",
                   help="how long the first queued image waits for others to fill its batch")
    p.add_argument("--top-k", type=int, default=5, help="classes answered per image (a request may ask ?top_k=N)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests in flight at most; one more is answered 503 with Retry-After")
    p.add_argument("--max-images", type=int, default=16, help="images per request at most (the multipart form)")
    p.add_argument("--max-body-mb", type=float, default=20.0, help="largest request body in MB (413 beyond)")
    p.add_argument("--max-pixels", type=int, default=40_000_000,
                   help="largest image in pixels, checked in its header before decoding")
    p.add_argument("--drain-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="how long SIGTERM waits for the requests in flight")
    p.add_argument("--api-key", default=None,
                   help="require this key (X-API-Key or Authorization: Bearer) on /predict, /explain, /metrics; "
                   "default: $VITLAB_API_KEY if set, else none")
    p.add_argument("--device", default=None, metavar="DEVICE",
                   help="cpu, cuda, cuda:1, ... (default: cuda when available, else cpu)")


def run(args: argparse.Namespace) -> int:
    for name in ("workers", "max_batch_size", "top_k", "max_queue", "max_images", "max_pixels"):
        positive("--" + name.replace("_", "-"), getattr(args, name))
    positive("--threads", args.threads)
    if args.batch_timeout < 0 or args.drain_timeout < 0 or args.max_body_mb <= 0:
        raise UsageError("--batch-timeout and --drain-timeout must be >= 0, --max-body-mb > 0")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    from ..serving import serve

    serve(args.model, mode=args.mode, calib=args.calib, host=args.host, port=args.port, workers=args.workers,
          threads=args.threads, max_batch_size=args.max_batch_size, batch_timeout=args.batch_timeout,
          top_k=args.top_k, max_queue=args.max_queue, max_images=args.max_images, max_body_mb=args.max_body_mb,
          max_pixels=args.max_pixels, drain_timeout=args.drain_timeout, device=args.device,
          api_key=args.api_key or os.environ.get("VITLAB_API_KEY") or None)
    return 0
