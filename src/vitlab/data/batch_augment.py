"""Whole-batch augmentation for in-memory datasets: inception crop + flip + resize as ONE grid_sample.

Per-sample crop boxes follow torchvision's RandomResizedCrop (area fraction uniform in `scale`, log aspect
ratio uniform in `ratio`, 10 tries, then a centre crop), drawn for the whole batch at once. The sampling grid
reproduces "crop, then bilinear resize with align_corners=False" exactly, i.e. what
`torchvision.transforms.v2.functional.resized_crop(..., antialias=False)` computes image by image, and a
flip is the same grid read right to left. The streams pass `antialias=True`: a downsample (Fashion-MNIST's 28 px
read at 16 px) is low-passed first, as torchvision's default antialiased resize is, instead of aliasing.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

INCEPTION_MEAN, INCEPTION_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)  # [0, 1] -> [-1, 1]
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def derive_seed(*keys: int) -> int:
    """A 63-bit seed from a tuple of non-negative ints (seed, epoch, step, ...), via numpy's SeedSequence."""
    state = np.random.SeedSequence([int(k) for k in keys]).generate_state(1, dtype=np.uint64)[0]
    return int(state) >> 1  # shift the Python int: numpy 1.x has no uint64 >> int


def norm_stats(normalize: str, channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) per channel on the [0, 1] scale; one channel takes the average of the three."""
    mean, std = {"inception": (INCEPTION_MEAN, INCEPTION_STD), "imagenet": (IMAGENET_MEAN, IMAGENET_STD)}[normalize]
    if channels == 1:
        return (sum(mean) / 3,), (sum(std) / 3,)
    if channels != 3:
        raise ValueError(f"normalisation is defined for 1 or 3 channels, got {channels}")
    return mean, std


def normalize_255(x: torch.Tensor, normalize: str) -> torch.Tensor:
    """Pixels on the 0-255 scale (B, C, H, W), uint8 or float -> normalised float32 (a new tensor).

    (x - 255 mean) / (255 std), uint8 -> float32 by type promotion; 0 and 255 land exactly on -1 and 1 for
    "inception".
    """
    mean, std = norm_stats(normalize, x.shape[1])
    if len(set(mean)) == 1 and len(set(std)) == 1:  # the same affine map on every channel
        return torch.sub(x, 255.0 * mean[0]).div_(255.0 * std[0]).float()
    m = torch.tensor([255.0 * v for v in mean], dtype=torch.float32).view(1, -1, 1, 1)
    s = torch.tensor([255.0 * v for v in std], dtype=torch.float32).view(1, -1, 1, 1)
    return torch.sub(x, m).div_(s).float()


def sample_crop_boxes(
    rng: np.random.Generator,
    n: int,
    height: int,
    width: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    tries: int = 10,
) -> torch.Tensor:
    """Random resized crop boxes for n images of one size, as int64 (n, 4): top, left, h, w.

    Drawn with numpy (a few hundred numbers: no thread-pool overhead, deterministic across platforms).
    """
    area = height * width
    target = area * rng.uniform(scale[0], scale[1], size=(n, tries))  # (n, tries)
    aspect = np.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1]), size=(n, tries)))
    w = np.round(np.sqrt(target * aspect)).astype(np.int64)
    h = np.round(np.sqrt(target / aspect)).astype(np.int64)
    ok = (w > 0) & (w <= width) & (h > 0) & (h <= height)  # (n, tries)
    first = ok.argmax(axis=1)  # first try that fits
    rows = np.arange(n)
    w, h, found = w[rows, first], h[rows, first], ok.any(axis=1)
    # fallback: the largest centred crop within the ratio range (torchvision's rule)
    in_ratio = width / height
    if in_ratio < min(ratio):
        fw, fh = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        fh, fw = height, round(height * max(ratio))
    else:
        fw, fh = width, height
    w, h = np.where(found, w, fw), np.where(found, h, fh)
    u = rng.random((n, 2))
    top = np.where(found, (u[:, 0] * (height - h + 1)).astype(np.int64), (height - h) // 2)
    left = np.where(found, (u[:, 1] * (width - w + 1)).astype(np.int64), (width - w) // 2)
    return torch.from_numpy(np.stack([top, left, h, w], axis=1))


def _axis(start: np.ndarray, length: np.ndarray, out: int, full: int) -> np.ndarray:
    """Normalised source coordinates (n, out) of a crop [start, start+length) resized to `out` samples."""
    j = np.arange(out, dtype=np.float64) + 0.5  # (out,)
    src = j[None] * (length[:, None] / out) - 0.5  # (n, out): align_corners=False, in crop pixels
    src = np.minimum(np.maximum(src, 0.0), length[:, None] - 1.0)  # interpolate's edge clamping
    src = src + start[:, None]  # (n, out) in image pixels
    return ((2 * src + 1) / full - 1).astype(np.float32)  # grid_sample's align_corners=False normalisation


def resized_crop_batch(
    x: torch.Tensor, boxes: torch.Tensor, out_hw: tuple[int, int], flip: torch.Tensor | None = None,
    antialias: bool = False,
) -> torch.Tensor:
    """Crop each image to its box and resize it bilinearly to out_hw, flipping where `flip` is set.

    Args:
        x: Images (B, C, H, W), any real dtype (uint8 is read as 0-255 floats).
        boxes: int64 (B, 4) top, left, h, w.
        out_hw: Output (h, w).
        flip: bool (B,), mirror left-right after the resize.
        antialias: Where every box shrinks (a downsample), low-pass first as torchvision's antialiased resize
            does, so a downsampled image holds the average of the pixels it covers instead of a 2x2 sample of
            them. Whole-image boxes give exactly `F.interpolate(..., antialias=True)` (torchvision's `Resize`);
            crops are shrunk over the batch by the smallest factor any of them needs, then sampled as without
            antialiasing. Upsampling is unchanged.

    Returns:
        float32 (B, C, out_h, out_w) on the input's value scale.
    """
    B, _, H, W = x.shape
    oh, ow = out_hw
    if antialias and B:
        x, boxes, done = _shrink_for(x, boxes, out_hw)
        if done:  # whole images, already at out_hw
            return torch.where(flip[:, None, None, None], torch.flip(x, dims=[-1]), x) if flip is not None else x
        B, _, H, W = x.shape
    b = boxes.numpy()
    gx = _axis(b[:, 1], b[:, 3], ow, W)  # (B, ow)
    gy = _axis(b[:, 0], b[:, 2], oh, H)  # (B, oh)
    if flip is not None:
        gx = np.where(flip.numpy()[:, None], gx[:, ::-1], gx)
    grid = np.empty((B, oh, ow, 2), dtype=np.float32)  # (B, oh, ow, (x, y))
    grid[..., 0] = gx[:, None, :]
    grid[..., 1] = gy[:, :, None]
    return F.grid_sample(x.float(), torch.from_numpy(grid), mode="bilinear", padding_mode="border",
                         align_corners=False)


def _shrink_for(x: torch.Tensor, boxes: torch.Tensor,
                out_hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Antialiased pre-shrink of a batch whose boxes all downsample: (images, boxes, done). Whole-image boxes:
    the images resized to out_hw (done); crops: the images shrunk by the smallest factor of the batch and the
    boxes in the shrunk image's pixels (float64); nothing to shrink: both unchanged."""
    _, _, H, W = x.shape
    oh, ow = out_hw
    b = boxes.numpy().astype(np.float64)
    fy, fx = float((b[:, 2] / oh).min()), float((b[:, 3] / ow).min())  # the smallest shrink of any box
    if fy <= 1.0 and fx <= 1.0:
        return x, boxes, False
    if (b == np.array([0, 0, H, W])).all():  # whole images: torchvision's antialiased Resize, exactly
        return F.interpolate(x.float(), size=(oh, ow), mode="bilinear", align_corners=False, antialias=True), \
            boxes, True
    nh, nw = max(round(H / max(fy, 1.0)), 1), max(round(W / max(fx, 1.0)), 1)
    small = F.interpolate(x.float(), size=(nh, nw), mode="bilinear", align_corners=False, antialias=True)
    scale = np.array([nh / H, nw / W, nh / H, nw / W])
    return small, torch.from_numpy(b * scale), False


def center_crop_batch(x: torch.Tensor, out_hw: tuple[int, int], crop_fraction: float) -> torch.Tensor:
    """The eval "center_crop": resize the shorter side to min(out_hw) / crop_fraction, keep the centre out_hw.

    The geometry of torchvision's `Resize(short)` + `CenterCrop(out_hw)` (what `images.eval_transform` does image
    by image, integer sizes and offsets included) as one bilinear grid_sample over the batch. No antialiasing:
    exact for upsampling, as Fashion-MNIST's 28 px to a larger model input is. Where the crop reaches past the
    resized image (an output longer than the resized side) it is padded with zeros, as CenterCrop pads: pass
    pixels on the 0-255 scale and normalise afterwards to get its black borders.

    Args:
        x: Images (B, C, H, W), any real dtype.
        out_hw: Output (h, w).
        crop_fraction: Fraction of the resized shorter side kept, in (0, 1].

    Returns:
        float32 (B, C, out_h, out_w) on the input's value scale.
    """
    if not 0.0 < crop_fraction <= 1.0:
        raise ValueError(f"crop_fraction must be in (0, 1], got {crop_fraction!r}")
    B, _, H, W = x.shape
    oh, ow = out_hw
    short = round(min(oh, ow) / crop_fraction)
    rh, rw = (short, int(short * W / H)) if H <= W else (int(short * H / W), short)  # Resize(short)'s size
    top, left = round((rh - oh) / 2), round((rw - ow) / 2)  # CenterCrop's offsets

    def axis(out: int, offset: int, full: int, resized: int) -> tuple[torch.Tensor, torch.Tensor]:
        i = np.arange(out, dtype=np.float64) + offset  # (out,) pixel index in the resized image
        src = (i + 0.5) * (full / resized) - 0.5  # in image pixels; the resize clamps to the edge (border mode)
        inside = torch.from_numpy((i >= 0) & (i < resized))  # False: CenterCrop's zero padding
        return torch.from_numpy(((2 * src + 1) / full - 1).astype(np.float32)), inside

    (gy, in_y), (gx, in_x) = axis(oh, top, H, rh), axis(ow, left, W, rw)
    grid = torch.stack(torch.meshgrid(gx, gy, indexing="xy"), dim=-1).expand(B, oh, ow, 2)  # (B, oh, ow, (x, y))
    out = F.grid_sample(x.float(), grid, mode="bilinear", padding_mode="border", align_corners=False)
    if not (in_y.all() and in_x.all()):
        out = out * (in_y[:, None] & in_x[None, :])  # (B, C, oh, ow) * (oh, ow)
    return out


def full_boxes(n: int, height: int, width: int) -> torch.Tensor:
    """Boxes (n, 4) covering the whole image: the eval-time 'resize' of the same pipeline."""
    return torch.tensor([0, 0, height, width], dtype=torch.long).repeat(n, 1)
