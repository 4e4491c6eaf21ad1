"""Random erasing (Zhong et al., 2020) for whole batches of in-memory images.

Each image, with probability p, has one rectangle replaced: its area a fraction of the image drawn uniformly from
`scale`, its log aspect ratio uniform in log `ratio`, 10 tries to fit inside the image (no erasing if none fits),
its position uniform over the places it fits. This is torchvision's `v2.RandomErasing` rule, which the file
datasets use image by image; here the boxes of the whole (global) batch are drawn at once with NumPy.

The fill is "random" (per-pixel standard normal noise, the paper's random values on the normalised scale;
torchvision's value="random") or "zero" (the normalisation's mean). The noise of each image comes from its own
generator seeded by (seed, epoch, step, index in the global batch), so a data-parallel rank's slice is the same
as the single-process batch's, and a resumed run draws the same noise.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .batch_augment import derive_seed
from .config import ERASING_VALUES


def sample_erase_boxes(
    rng: np.random.Generator,
    n: int,
    height: int,
    width: int,
    p: float,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    tries: int = 10,
) -> np.ndarray:
    """Erase boxes for n images as int64 (n, 4): top, left, h, w; h = w = 0 where an image is left alone.

    Always consumes the same amount of randomness from `rng`, whatever is drawn, so streams stay aligned.
    """
    apply = rng.random(n) < p
    area = rng.uniform(scale[0], scale[1], size=(n, tries)) * (height * width)
    aspect = np.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1]), size=(n, tries)))
    h = np.rint(np.sqrt(area * aspect)).astype(np.int64)
    w = np.rint(np.sqrt(area / aspect)).astype(np.int64)
    fits = (h < height) & (w < width) & (h > 0) & (w > 0)
    first = fits.argmax(axis=1)  # the first try that fits (0 when none does; masked below)
    ok = apply & fits.any(axis=1)
    h = np.where(ok, h[np.arange(n), first], 0)
    w = np.where(ok, w[np.arange(n), first], 0)
    u, v = rng.random(n), rng.random(n)
    top = np.where(ok, np.minimum((u * (height - h + 1)).astype(np.int64), height - h), 0)
    left = np.where(ok, np.minimum((v * (width - w + 1)).astype(np.int64), width - w), 0)
    return np.stack([top, left, h, w], axis=1)


def erase_batch(
    x: torch.Tensor, boxes: np.ndarray, value: str, seeds: tuple[int, ...], first_index: int
) -> torch.Tensor:
    """Fill each image's box in place. x: normalised float (B, C, H, W); boxes: (B, 4) from `sample_erase_boxes`.

    `seeds` (seed, epoch, step) and `first_index` (this slice's offset in the global batch) seed the noise.
    """
    if value not in ERASING_VALUES:
        raise ValueError(f"data.erasing_value must be one of {ERASING_VALUES}, got {value!r}")
    gen = torch.Generator()
    C = x.shape[1]
    for i in np.flatnonzero(boxes[:, 2] > 0):
        t, left, h, w = (int(b) for b in boxes[i])
        if value == "zero":
            x[i, :, t : t + h, left : left + w] = 0.0
        else:
            gen.manual_seed(derive_seed(*seeds, first_index + int(i)))
            x[i, :, t : t + h, left : left + w] = torch.randn((C, h, w), generator=gen, dtype=x.dtype)
    return x
