"""Accuracy cost of each speed mode on the Fashion-MNIST test set (10,000 images).

    .venv/bin/python benchmarks/mode_accuracy.py --checkpoint runs/fmnist/final.safetensors
    .venv/bin/python benchmarks/mode_accuracy.py            # no checkpoint: trains a small ViT for --train-s seconds

For every mode of `vitlab.optimize` (but the compile ones, which compute what eager does, unless --compile):
top-1 agreement with the fp32 model and top-1 accuracy. Writes JSON and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import vitlab
from vitlab.bench import machine_info, mode_accuracy
from vitlab.data.build import build_eval_data
from vitlab.data.config import DataConfig
from vitlab.utils.io import write_atomic


def batches(split: str, img_size: int, in_chans: int, batch_size: int):
    return build_eval_data(DataConfig(dataset="fashion_mnist"), split, img_size=img_size, in_chans=in_chans,
                           batch_size=batch_size)


def train_briefly(seconds: float, seed: int = 0) -> tuple[vitlab.VisionTransformer, dict]:
    """A ViT-Ti-width, 4-block model on 28 px Fashion-MNIST, patch 4, AdamW, for a fixed wall-clock budget."""
    torch.manual_seed(seed)
    model = vitlab.create_model("ViT-Ti/16", depth=4, img_size=28, patch_size=4, in_chans=1, num_classes=10)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    model.train()
    t0, steps, seen = time.perf_counter(), 0, 0
    while time.perf_counter() - t0 < seconds:
        for x, y in batches("train", 28, 1, 128):
            idx = torch.randperm(len(x))
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            steps, seen = steps + 1, seen + len(x)
            if time.perf_counter() - t0 >= seconds:
                break
    return model.eval(), {"trained_steps": steps, "images_seen": seen, "train_seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", help="a trained Fashion-MNIST checkpoint (vitlab.load_model)")
    p.add_argument("--train-s", type=float, default=240, help="training budget without a checkpoint (seconds)")
    p.add_argument("--modes", nargs="+", default=["bf16", "fp16", "int8"])
    p.add_argument("--compile", action="store_true", help="also the compile and compile-bf16 modes (slow to build)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="benchmarks/results/mode-accuracy.json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.checkpoint:
        if not os.path.exists(args.checkpoint):
            print(f"error: checkpoint {args.checkpoint} does not exist", file=sys.stderr)
            return 2
        model, source = vitlab.load_model(args.checkpoint), {"checkpoint": args.checkpoint}
    else:
        model, source = train_briefly(args.train_s)
    c = model.cfg
    xs, ys = zip(*batches("test", c.img_hw[0], c.in_chans, 500))
    images, labels = torch.cat(xs), torch.cat(ys)
    modes = tuple(args.modes) + (("compile", "compile-bf16") if args.compile else ())
    report = mode_accuracy(model, images, labels, modes)
    out = {"machine": machine_info(), "model": c.to_dict(), "source": source, "test_images": len(labels),
           "modes": report}
    print(f"{'mode':<14}{'agreement':>10}{'accuracy':>10}   ({len(labels)} Fashion-MNIST test images)")
    for mode, r in report.items():
        print(f"{mode:<14}{100 * r['agreement_with_fp32']:>9.2f}%{100 * r['accuracy']:>9.2f}%")
    path = write_atomic(Path(args.out), json.dumps(out, indent=1), overwrite=True)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
