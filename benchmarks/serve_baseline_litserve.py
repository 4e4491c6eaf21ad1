"""The same model on LitServe (the engine issue 34 proposed), for `benchmarks/serve_load.py --engines litserve`.

A LitAPI as LitServe's docs write one: decode_request opens the uploaded image and applies the checkpoint's own
preprocessing (vitlab.data.transforms_for), batch stacks, predict runs the vitlab speed mode, the same batching
knobs as `vitlab serve` (max_batch_size, batch_timeout), one worker process on the CPU with all its cores for torch.
LitServe itself is not a vitlab dependency: `pip install litserve` (0.2.19 measured) to run this.

    .venv/bin/python benchmarks/serve_baseline_litserve.py --weights vit_s16.safetensors --mode int8 --port 8002
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import litserve as ls
import torch
from PIL import Image

import vitlab
from vitlab.data import transforms_for


class VitlabAPI(ls.LitAPI):
    def __init__(self, weights: str, mode: str, threads: int, calib: str | None, **kw):
        super().__init__(**kw)
        self.weights, self.mode, self.threads, self.calib = weights, mode, threads, calib

    def setup(self, device: str) -> None:
        torch.set_num_threads(self.threads)
        model = vitlab.load_model(self.weights).eval()
        self.transform = transforms_for(model)
        calib = None
        if self.calib:
            files = sorted(str(p) for p in Path(self.calib).iterdir())
            calib = torch.stack([self.transform(Image.open(f).convert("RGB")) for f in files])
        self.net = vitlab.optimize(model, self.mode, calib=calib) if self.mode != "fp32" else model

    def decode_request(self, request):
        upload = request["file"]
        return self.transform(Image.open(upload.file).convert("RGB"))

    def predict(self, x):
        with torch.inference_mode():
            return self.net(x).softmax(-1)

    def encode_response(self, probs):
        top = probs.topk(5)
        return {"predictions": [{"top": [{"index": int(i), "prob": float(p)}
                                         for p, i in zip(top.values, top.indices)]}]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", required=True)
    p.add_argument("--mode", default="fp32")
    p.add_argument("--port", type=int, default=8002)
    p.add_argument("--max-batch-size", type=int, default=16)
    p.add_argument("--batch-timeout", type=float, default=0.01)
    p.add_argument("--calib", default=None, help="a folder of images (the calibrated modes)")
    args = p.parse_args()
    threads = len(os.sched_getaffinity(0))
    api = VitlabAPI(args.weights, args.mode, threads, args.calib, max_batch_size=args.max_batch_size,
                    batch_timeout=args.batch_timeout)
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1, timeout=600)
    server.run(host="127.0.0.1", port=args.port, num_api_servers=1, generate_client_file=False, log_level="warning")


if __name__ == "__main__":
    main()
