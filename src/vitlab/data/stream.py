"""`TrainStream` (endless, resumable, rank-splittable batches) and `EvalData`, with the in-memory versions.

In-memory datasets (Fashion-MNIST, MNIST, CIFAR) augment whole batches as tensors: one gather, one
grid_sample for crop + flip + resize over the batch, one normalisation. RandAugment, when on, is the only
per-image step (torchvision's RandAugment draws one op sequence per call).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torchvision.transforms.v2 as T

from ..models.config import to_hw
from .arrays import ArrayDataset
from .batch_augment import (
    center_crop_batch,
    derive_seed,
    full_boxes,
    normalize_255,
    resized_crop_batch,
    sample_crop_boxes,
)
from .batch_erasing import erase_batch, sample_erase_boxes
from .batch_randaugment import BatchRandAugment
from .config import DataConfig, parse_randaugment
from .position import Position, check_state, epoch_permutation

Batch = tuple[torch.Tensor, torch.Tensor]  # images float32 (B, C, H, W), labels int64 (B,)

LUMA = (0.299, 0.587, 0.114)  # ITU-R 601-2, what PIL's convert("L") uses


def check_batch_size(batch_size: Any) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")


def match_channels(x: torch.Tensor, in_chans: int, expand: bool, what: str) -> torch.Tensor:
    """(B, C, H, W) -> (B, in_chans, H, W): grey -> RGB only when asked, RGB -> grey by luma."""
    c = x.shape[1]
    if c == in_chans:
        return x
    if c == 1 and in_chans == 3:
        if not expand:
            raise ValueError(
                f"{what} is greyscale (1 channel) but the model takes in_chans=3; set data.expand_channels: true "
                "to repeat the grey channel, or build the model with in_chans=1"
            )
        return x.expand(-1, 3, -1, -1)
    if c == 3 and in_chans == 1:
        w = torch.tensor(LUMA, dtype=x.dtype).view(1, 3, 1, 1)
        return (x * w).sum(dim=1, keepdim=True)
    raise ValueError(f"{what} has {c} channels; cannot feed a model with in_chans={in_chans}")


def randaugment_op(spec: str | None, fill: int = 128) -> T.RandAugment | None:
    """big_vision's "N-M" -> torchvision RandAugment. Magnitude M on the 0-10 scale of the RandAugment paper
    is torchvision's magnitude M with 11 bins (bin 10 = each op's maximum)."""
    if spec is None:
        return None
    n, m = parse_randaugment(spec)
    return T.RandAugment(num_ops=n, magnitude=m, num_magnitude_bins=11, fill=fill)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the pipeline's tensor ops on one intra-op thread, then restore the caller's setting.

    Input-pipeline tensors are small (a batch of 28-56 px images is 0.2-3 M values): splitting them across
    threads costs more in synchronisation than it saves, and on a busy 2-core machine a second thread that
    has to wait for a core makes every op far slower (measured in docs/data.md).
    """
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


class TrainStream:
    """Endless training batches: iterate for (images float32 (B, C, H, W), labels int64 (B,)).

    Attributes:
        num_classes, classes: The label space.
        epoch_size: Training samples per epoch (all ranks together).
        steps_per_epoch: Batches per epoch (epoch_size // (batch_size * world_size); the rest of an epoch's
            permutation is dropped and comes back in later epochs' permutations).
        report: Counts and skipped files with reasons.
    """

    def __init__(
        self,
        *,
        name: str,
        classes: list[str],
        epoch_size: int,
        batch_size: int,
        seed: int,
        rank: int,
        world_size: int,
        report: dict[str, Any],
    ):
        check_batch_size(batch_size)
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
        self.name, self.classes = name, list(classes)
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, int(seed), rank, world_size
        self.global_batch = batch_size * world_size
        self.epoch_size = epoch_size
        self.steps_per_epoch = epoch_size // self.global_batch
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"{name}: {epoch_size} training samples cannot fill one global batch of {self.global_batch} "
                f"(batch_size {batch_size} x world_size {world_size})"
            )
        self.report = report
        self.position = Position()

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        with one_thread():
            batch = self._produce(self.position.epoch, self.position.step)
        self.position.advance(self.steps_per_epoch)
        return batch

    def _produce(self, epoch: int, step: int) -> Batch:
        raise NotImplementedError

    def _restart(self) -> None:
        """Drop any prefetched state after the position was changed."""

    def close(self) -> None:
        """Release what the stream holds (worker processes); nothing to do for in-memory data."""
        self._restart()

    # -- resume -----------------------------------------------------------------------------------------
    def _identity(self) -> dict[str, Any]:
        return {"dataset": self.name, "seed": self.seed, "global_batch": self.global_batch,
                "epoch_size": self.epoch_size}

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.position.epoch, "step": self.position.step, **self._identity()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, self._identity(), f"{self.name} stream")
        step = int(state["step"])
        if not 0 <= step < self.steps_per_epoch:
            raise ValueError(f"{self.name} stream: step {step} outside [0, {self.steps_per_epoch})")
        self.position = Position(int(state["epoch"]), step)
        self._restart()


class ArrayTrainStream(TrainStream):
    """TrainStream over an in-memory uint8 dataset, augmented a whole batch at a time."""

    def __init__(self, data: ArrayDataset, cfg: DataConfig, *, img_size, in_chans: int, **kw: Any):
        super().__init__(classes=data.classes, epoch_size=len(data), **kw)
        self.cfg, self.out_hw, self.in_chans = cfg, to_hw(img_size), in_chans
        self.images, self.labels = data.tensors()  # uint8 (N, C, H, W), int64 (N,)
        match_channels(self.images[:1].float(), in_chans, cfg.expand_channels, self.name)  # fail before training
        self.randaug = BatchRandAugment(*parse_randaugment(cfg.randaugment)) if cfg.randaugment else None
        self._perm_epoch, self._perm = -1, torch.empty(0, dtype=torch.long)

    def set_output_size(self, hw: tuple[int, int]) -> None:
        """Resample the next batches to hw (progressive resizing); the crops and flips drawn stay the same."""
        self.out_hw = to_hw(tuple(hw))

    def _permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._perm_epoch:
            self._perm, self._perm_epoch = epoch_permutation(self.seed, epoch, len(self.images)), epoch
        return self._perm

    def _produce(self, epoch: int, step: int) -> Batch:
        G, B, r = self.global_batch, self.batch_size, self.rank
        idx = self._permutation(epoch)[step * G : (step + 1) * G][r * B : (r + 1) * B]  # this rank's slice
        _, _, H, W = self.images.shape
        cfg = self.cfg
        # Randomness for the GLOBAL batch from (seed, epoch, step); each rank keeps its slice.
        rng = np.random.default_rng(derive_seed(self.seed, epoch, step))
        if cfg.inception_crop:
            boxes = sample_crop_boxes(rng, G, H, W, cfg.crop_scale, cfg.crop_ratio)[r * B : (r + 1) * B]
        else:
            boxes = full_boxes(B, H, W)
        flip = torch.from_numpy(rng.random(G) < 0.5)[r * B : (r + 1) * B] if cfg.hflip else None
        x = self.images[idx]  # uint8 (B, C, H, W)
        resample = cfg.inception_crop or flip is not None or self.out_hw != (H, W)
        if self.randaug is not None:  # RandAugment works on uint8 pixels: crop first, normalise last
            x = resized_crop_batch(x, boxes, self.out_hw, flip, antialias=True).round_().clamp_(0, 255).to(torch.uint8)
            ops, negative = self.randaug.draw(rng, G)  # per sample, for the global batch
            x = self._normalize(self.randaug(x, ops[:, r * B : (r + 1) * B], negative[:, r * B : (r + 1) * B]))
        else:
            # normalise the (smaller) input, then resample: bilinear weights sum to one, so the two commute
            x = self._normalize(x)
            if resample:
                x = resized_crop_batch(x, boxes, self.out_hw, flip, antialias=True)  # (B, C, h, w)
        if cfg.random_erasing > 0:  # on the normalised output, drawn last so other draws keep their values
            erase = sample_erase_boxes(rng, G, *self.out_hw, cfg.random_erasing, cfg.erasing_scale, cfg.erasing_ratio)
            x = erase_batch(x, erase[r * B : (r + 1) * B], cfg.erasing_value, (self.seed, epoch, step), r * B)
        return x, self.labels[idx]

    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] != self.in_chans:
            x = match_channels(x.float(), self.in_chans, self.cfg.expand_channels, self.name).contiguous()
        return normalize_255(x, self.cfg.normalize)


class EvalData:
    """Deterministic evaluation batches (no augmentation): iterate for (images, labels).

    Attributes:
        num_classes, classes: The label space (the training set's).
        num_samples: Images evaluated (bad files skipped for file datasets).
        report: Counts and skipped files.
    """

    classes: list[str]
    num_samples: int
    batch_size: int
    report: dict[str, Any]

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __len__(self) -> int:
        return math.ceil(self.num_samples / self.batch_size)

    def __iter__(self) -> Iterator[Batch]:
        raise NotImplementedError


class ArrayEvalData(EvalData):
    """EvalData over an in-memory dataset: the training pipeline with the whole image and no flip (or, with
    `eval_resize: center_crop`, the centre crop that file datasets get from `images.eval_transform`)."""

    def __init__(self, data: ArrayDataset, cfg: DataConfig, *, name: str, img_size, in_chans: int,
                 batch_size: int, report: dict[str, Any]):
        check_batch_size(batch_size)
        self.cfg, self.name, self.out_hw, self.in_chans = cfg, name, to_hw(img_size), in_chans
        self.images, self.labels = data.tensors()
        self.classes, self.num_samples, self.batch_size, self.report = data.classes, len(data), batch_size, report
        match_channels(self.images[:1].float(), in_chans, cfg.expand_channels, name)

    def __iter__(self) -> Iterator[Batch]:
        _, _, H, W = self.images.shape
        for start in range(0, self.num_samples, self.batch_size):
            with one_thread():
                batch = self._batch(start, H, W)
            yield batch  # outside the context: the caller's code runs with its own thread count

    def _batch(self, start: int, H: int, W: int) -> Batch:
        x = self.images[start : start + self.batch_size]
        if x.shape[1] != self.in_chans:
            x = match_channels(x.float(), self.in_chans, self.cfg.expand_channels, self.name).contiguous()
        y = self.labels[start : start + self.batch_size]
        if self.cfg.eval_resize == "center_crop":  # crop 0-255 pixels, so any zero padding is black as torchvision's
            return normalize_255(center_crop_batch(x, self.out_hw, self.cfg.eval_crop_fraction), self.cfg.normalize), y
        x = normalize_255(x, self.cfg.normalize)
        if self.out_hw != (H, W):
            x = resized_crop_batch(x, full_boxes(len(x), H, W), self.out_hw, antialias=True)  # a downsample averages
        return x, y
