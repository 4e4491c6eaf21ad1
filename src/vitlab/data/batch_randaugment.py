"""RandAugment for a whole batch: per-sample ops, applied one op group at a time.

torchvision's RandAugment draws one op sequence per call, so a batch tensor gets the same ops everywhere.
RandAugment (Cubuk et al. 2020) draws ops per image. Here each image's ops (and signs) are drawn up front,
then for each layer every distinct (op, sign) is applied once, to the sub-batch that drew it, with
torchvision's own op implementations (RandAugment's op table and magnitudes), so an image comes out exactly
as torchvision's per-image RandAugment would make it given the same draws, at the cost of at most
2 x 14 batched calls per layer instead of one call per image.
"""

from __future__ import annotations

import numpy as np
import torch
import torchvision.transforms.v2 as T


class BatchRandAugment:
    """RandAugment(num_ops, magnitude) with per-sample draws over uint8 batches (B, C, H, W).

    The magnitude is on the 0-10 scale of the paper and big_vision (torchvision with 11 magnitude bins).
    """

    def __init__(self, num_ops: int, magnitude: int, fill: int = 128):
        self.ra = T.RandAugment(num_ops=num_ops, magnitude=magnitude, num_magnitude_bins=11, fill=fill)
        self.ops = list(self.ra._AUGMENTATION_SPACE)  # op name -> (magnitudes(bins, h, w), signed)
        self.num_ops, self.magnitude = num_ops, magnitude

    def draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Per-sample choices: op indices int (num_ops, n) and negative-sign flags bool (num_ops, n)."""
        return rng.integers(0, len(self.ops), size=(self.num_ops, n)), rng.random((self.num_ops, n)) <= 0.5

    def magnitude_of(self, op: str, negative: bool, height: int, width: int) -> float:
        magnitudes_fn, signed = self.ra._AUGMENTATION_SPACE[op]
        mags = magnitudes_fn(11, height, width)
        if mags is None:
            return 0.0
        m = float(mags[self.magnitude])
        return -m if signed and negative else m

    def apply_one(self, x: torch.Tensor, op: str, magnitude: float) -> torch.Tensor:
        """One op on a (sub-)batch, through torchvision's RandAugment implementation."""
        return self.ra._apply_image_or_video_transform(x, op, magnitude, interpolation=self.ra.interpolation,
                                                       fill=self.ra._fill)

    def __call__(self, x: torch.Tensor, ops: np.ndarray, negative: np.ndarray) -> torch.Tensor:
        """x: uint8 (B, C, H, W); ops, negative: (num_ops, B) from `draw`. Returns uint8 (B, C, H, W)."""
        if x.dtype != torch.uint8:
            raise ValueError(f"RandAugment works on uint8 images, got {x.dtype}")
        H, W = x.shape[-2:]
        x = x.clone()
        for layer in range(ops.shape[0]):
            signed = np.array([self.ra._AUGMENTATION_SPACE[self.ops[o]][1] for o in ops[layer]], dtype=bool)
            group = ops[layer] * 2 + (negative[layer] & signed)  # the sign matters only for signed ops
            for g in np.unique(group):
                idx = torch.from_numpy(np.flatnonzero(group == g))
                op = self.ops[g // 2]
                if op == "Identity":
                    continue
                x[idx] = self.apply_one(x[idx], op, self.magnitude_of(op, bool(g % 2), H, W))
        return x
