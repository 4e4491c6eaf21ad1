"""Input-pipeline throughput: images/s of the training stream, against a per-image torchvision pipeline.

    python -m vitlab.data.throughput [--batch-size 256] [--sizes 28 56] [--threads 2] [--seconds 3]

Measures, on Fashion-MNIST: the whole-batch stream (inception crop + flip, and with RandAugment 2-10),
and the same augmentation done image by image with torchvision.transforms.v2 in the main process (what a
standard Dataset + DataLoader(num_workers=0) pipeline does), and an ImageFolder of PNG files written from
the same images (decode + per-image transforms) with 0 and 2 DataLoader workers.
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
import time
from collections.abc import Callable

import numpy as np
import torch
import torchvision.transforms.v2 as T
from PIL import Image

from .build import build_train_stream
from .config import DataConfig
from .idx import FASHION_MNIST_CLASSES, load_mnist_like
from .stream import one_thread


def _rate(step: Callable[[], object], batch_size: int, seconds: float) -> float:
    step()  # warm-up
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
        n += 1
    return n * batch_size / (time.perf_counter() - t0)


def _per_image_baseline(img_size: int, batch_size: int, seconds: float) -> float:
    data = load_mnist_like("/usr/share/datasets/fashion-mnist", "train", FASHION_MNIST_CLASSES)
    images = torch.from_numpy(data.images)
    tf = T.Compose([T.RandomResizedCrop(img_size, antialias=True), T.RandomHorizontalFlip(),
                    T.ToDtype(torch.float32, scale=True), T.Normalize((0.5,), (0.5,))])
    rng = np.random.default_rng(0)

    def step() -> None:
        idx = rng.integers(0, len(images), batch_size)
        with one_thread():  # the same threading as our stream: compare the method, not the thread count
            torch.stack([tf(images[i]) for i in idx])

    return _rate(step, batch_size, seconds)


def _png_tree(root: str, n: int) -> None:
    data = load_mnist_like("/usr/share/datasets/fashion-mnist", "train", FASHION_MNIST_CLASSES)
    for i in range(n):
        d = os.path.join(root, str(int(data.labels[i])))
        os.makedirs(d, exist_ok=True)
        Image.fromarray(data.images[i, 0]).save(os.path.join(d, f"{i:05d}.png"))


def measure(batch_size: int = 256, sizes: tuple[int, ...] = (28, 56), seconds: float = 3.0,
            folder_images: int = 3000) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for size in sizes:
        for name, cfg in (("fashion_mnist stream, crop+flip", DataConfig()),
                          ("fashion_mnist stream, crop+flip+RandAugment 2-10", DataConfig(randaugment="2-10")),
                          ("fashion_mnist stream, no augmentation", DataConfig(inception_crop=False, hflip=False))):
            s = build_train_stream(cfg, img_size=size, in_chans=1, batch_size=batch_size, seed=0)
            rate = _rate(functools.partial(next, s), batch_size, seconds)
            rows.append({"pipeline": name, "img_size": size, "images_per_s": rate})
        rows.append({"pipeline": "per-image torchvision.transforms.v2 crop+flip (baseline)", "img_size": size,
                     "images_per_s": _per_image_baseline(size, batch_size, seconds)})
    with tempfile.TemporaryDirectory() as root:
        _png_tree(root, folder_images)
        for workers in (0, 2):
            cfg = DataConfig(dataset="imagefolder", root=root, num_workers=workers)
            s = build_train_stream(cfg, img_size=sizes[0], in_chans=1, batch_size=batch_size, seed=0)
            rows.append({"pipeline": f"imagefolder PNG, decode+crop+flip, num_workers={workers}",
                         "img_size": sizes[0], "images_per_s": _rate(functools.partial(next, s), batch_size, seconds)})
            s.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--sizes", type=int, nargs="+", default=[28, 56])
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads of the calling process")
    p.add_argument("--seconds", type=float, default=3.0, help="measuring time per row")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = measure(args.batch_size, tuple(args.sizes), args.seconds)
    print(f"batch {args.batch_size}, torch threads {args.threads}, load average {os.getloadavg()[0]:.1f}")
    print(f"| {'pipeline':<62} | px | images/s |")
    print(f"|{'-' * 64}|----|---------:|")
    for r in rows:
        print(f"| {r['pipeline']:<62} | {r['img_size']} | {r['images_per_s']:8.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
