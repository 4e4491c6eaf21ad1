"""Few-shot baseline on raw pixels: the same protocol as `vitlab fewshot`, with the image itself as the feature.

A learned representation should beat it; it puts `vitlab fewshot` numbers on Fashion-MNIST in context.

    .venv/bin/python benchmarks/fewshot_pixels.py --train-limit 10000 --shots 1 5 10 25 --seeds 5
"""

from __future__ import annotations

import argparse

import torch

from vitlab import data
from vitlab.analysis.fewshot import DEFAULT_L2, fewshot_evaluate


def pixels(split: str, limit: int | None) -> tuple:
    loader = data.build_eval_data(data.parse_data_spec("fashion_mnist"), split, img_size=28, in_chans=1,
                                  batch_size=10_000)
    xs, ys = zip(*[(b[0], b[1]) for b in loader])
    x, y = torch.cat(xs).flatten(1)[:limit], torch.cat(ys)[:limit]
    return x.numpy(), y.numpy()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shots", type=int, nargs="+", default=[1, 5, 10, 25])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--l2-reg", type=float, default=DEFAULT_L2)
    p.add_argument("--train-limit", type=int, default=None)
    args = p.parse_args()
    tx, ty = pixels("train", args.train_limit)
    ex, ey = pixels("test", None)
    print(f"raw pixels ({tx.shape[1]} features), {len(ty)} train / {len(ey)} test, l2={args.l2_reg:g}")
    for r in fewshot_evaluate(tx, ty, ex, ey, shots=args.shots, seeds=args.seeds, l2_reg=args.l2_reg):
        print(f"{r.shots:>3} shots: {100 * r.mean:.2f}% +- {100 * r.std:.2f}")


if __name__ == "__main__":
    main()
