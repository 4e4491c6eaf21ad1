"""RandAugment for a whole batch: per-sample ops, applied one op group at a time.

torchvision's RandAugment draws one op sequence per call, so a batch tensor gets the same ops everywhere.
RandAugment (Cubuk et al. 2020) draws ops per image. Here each image's ops (and signs) are drawn up front,
then for each layer every distinct (op, sign) is applied once, to the sub-batch that drew it: at most
2 x 14 batched calls per layer instead of one call per image.

The op table (`OPS`: names, strength ranges, which ops take a random sign) is ours; the pixel work is done by
the public `torchvision.transforms.v2.functional` ops, with the settings torchvision's `RandAugment` uses
(nearest-neighbour resampling, 11 magnitude bins), so an image comes out exactly as torchvision's per-image
RandAugment makes it given the same draws (tests/test_data_arrays.py checks this op by op).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torchvision.transforms.v2.functional as F
from torchvision.transforms.v2 import InterpolationMode

MAX_MAGNITUDE = 10  # the 0-10 scale of the paper and big_vision (torchvision's num_magnitude_bins=11)


@dataclass(frozen=True)
class Op:
    """One RandAugment op: its strength moves linearly from `start` (magnitude 0) to `end` (magnitude 10).

    Attributes:
        name: The paper's name of the op.
        start: Strength at magnitude 0.
        end: Strength at magnitude 10; None for ops without a strength (Identity, AutoContrast, Equalize).
        signed: Applied as +strength or -strength, each with probability 1/2.
        per_pixel: The strength is a fraction of the image side (translations), scaled by it.
    """

    name: str
    start: float = 0.0
    end: float | None = None
    signed: bool = False
    per_pixel: bool = False


# The ops and ranges of RandAugment (Cubuk et al. 2020, Sec. 3; ranges as in AutoAugment, Cubuk et al. 2019):
# shear up to 0.3, translation up to 150/331 of the side (150 px on AutoAugment's 331-px images), rotation up
# to 30 degrees, the four PIL-style enhancements with factor 1 +- 0.9, posterize from 8 down to 4 bits,
# solarize with the threshold from the top of the range (nothing inverted) down to 0 (everything inverted).
# The order is the draw order: changing it changes which op an index means, so every seeded run.
OPS: tuple[Op, ...] = (
    Op("Identity"),
    Op("ShearX", end=0.3, signed=True),
    Op("ShearY", end=0.3, signed=True),
    Op("TranslateX", end=150 / 331, signed=True, per_pixel=True),
    Op("TranslateY", end=150 / 331, signed=True, per_pixel=True),
    Op("Rotate", end=30.0, signed=True),
    Op("Brightness", end=0.9, signed=True),
    Op("Color", end=0.9, signed=True),
    Op("Contrast", end=0.9, signed=True),
    Op("Sharpness", end=0.9, signed=True),
    Op("Posterize", start=8.0, end=4.0),  # bits kept
    Op("Solarize", start=1.0, end=0.0),  # threshold, as a fraction of 255
    Op("AutoContrast"),
    Op("Equalize"),
)
_BY_NAME = {op.name: op for op in OPS}


def strength(op: Op, magnitude: int, side: int = 0) -> float:
    """`op`'s strength at `magnitude` (0-10); `side`: the image side along the op's axis (translations)."""
    if op.end is None:
        return 0.0
    end = op.end * side if op.per_pixel else op.end
    # float32 steps, as torch.linspace makes them: the exact values torchvision's RandAugment applies
    value = float(torch.linspace(op.start, end, MAX_MAGNITUDE + 1)[magnitude])
    return float(round(value)) if op.name == "Posterize" else value


def apply_op(x: torch.Tensor, name: str, v: float, fill: int | float) -> torch.Tensor:
    """Op `name` with signed strength `v` on uint8 images (..., C, H, W)."""
    nearest = InterpolationMode.NEAREST
    match name:
        case "Identity":
            return x
        case "ShearX" | "ShearY":  # v is the shear factor (the slope); F.affine takes an angle in degrees
            angle = math.degrees(math.atan(v))
            shear = [angle, 0.0] if name == "ShearX" else [0.0, angle]
            return F.affine(x, angle=0.0, translate=[0, 0], scale=1.0, shear=shear, interpolation=nearest,
                            fill=fill, center=[0, 0])
        case "TranslateX" | "TranslateY":  # whole pixels
            shift = [int(v), 0] if name == "TranslateX" else [0, int(v)]
            return F.affine(x, angle=0.0, translate=shift, scale=1.0, shear=[0.0, 0.0], interpolation=nearest,
                            fill=fill)
        case "Rotate":
            return F.rotate(x, angle=v, interpolation=nearest, fill=fill)
        case "Brightness":
            return F.adjust_brightness(x, brightness_factor=1.0 + v)
        case "Color":
            return F.adjust_saturation(x, saturation_factor=1.0 + v)
        case "Contrast":
            return F.adjust_contrast(x, contrast_factor=1.0 + v)
        case "Sharpness":
            return F.adjust_sharpness(x, sharpness_factor=1.0 + v)
        case "Posterize":
            return F.posterize(x, bits=int(v))
        case "Solarize":
            return F.solarize(x, threshold=255.0 * v)
        case "AutoContrast":
            return F.autocontrast(x)
        case "Equalize":
            return F.equalize(x)
    raise ValueError(f"unknown RandAugment op {name!r}")


class BatchRandAugment:
    """RandAugment(num_ops, magnitude) with per-sample draws over uint8 batches (B, C, H, W).

    The magnitude is on the 0-10 scale of the paper and big_vision (torchvision with 11 magnitude bins).
    """

    def __init__(self, num_ops: int, magnitude: int, fill: int = 128):
        if not 0 <= magnitude <= MAX_MAGNITUDE:
            raise ValueError(f"RandAugment magnitude must be in [0, {MAX_MAGNITUDE}], got {magnitude}")
        self.ops = [op.name for op in OPS]
        self.num_ops, self.magnitude, self.fill = num_ops, magnitude, fill

    def draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Per-sample choices: op indices int (num_ops, n) and negative-sign flags bool (num_ops, n)."""
        return rng.integers(0, len(self.ops), size=(self.num_ops, n)), rng.random((self.num_ops, n)) <= 0.5

    def magnitude_of(self, op: str, negative: bool, height: int, width: int) -> float:
        """The signed strength `op` applies to an image of height x width."""
        spec = _BY_NAME[op]
        v = strength(spec, self.magnitude, height if op == "TranslateY" else width)
        return -v if spec.signed and negative else v

    def apply_one(self, x: torch.Tensor, op: str, magnitude: float) -> torch.Tensor:
        """One op with signed strength `magnitude` on a (sub-)batch."""
        return apply_op(x, op, magnitude, self.fill)

    def __call__(self, x: torch.Tensor, ops: np.ndarray, negative: np.ndarray) -> torch.Tensor:
        """x: uint8 (B, C, H, W); ops, negative: (num_ops, B) from `draw`. Returns uint8 (B, C, H, W)."""
        if x.dtype != torch.uint8:
            raise ValueError(f"RandAugment works on uint8 images, got {x.dtype}")
        H, W = x.shape[-2:]
        x = x.clone()
        signed = np.array([op.signed for op in OPS], dtype=bool)
        for layer in range(ops.shape[0]):
            group = ops[layer] * 2 + (negative[layer] & signed[ops[layer]])  # the sign matters only for signed ops
            for g in np.unique(group):
                idx = torch.from_numpy(np.flatnonzero(group == g))
                op = self.ops[g // 2]
                if op == "Identity":
                    continue
                x[idx] = self.apply_one(x[idx], op, self.magnitude_of(op, bool(g % 2), H, W))
        return x
