"""Mixup / CutMix on whole batches (torchvision.transforms.v2), giving soft targets for the cross-entropy."""

from __future__ import annotations

import torch
import torchvision.transforms.v2 as T


class BatchMix:
    """Mixup (Zhang et al. 2018) and/or CutMix (Yun et al. 2019); with both, one of them is picked per batch.

    Randomness comes from torch's global generator, which the checkpoint saves, so resuming replays it exactly.
    """

    def __init__(self, num_classes: int, mixup: float = 0.0, cutmix: float = 0.0):
        ops = []
        if mixup > 0:
            ops.append(T.MixUp(alpha=mixup, num_classes=num_classes))
        if cutmix > 0:
            ops.append(T.CutMix(alpha=cutmix, num_classes=num_classes))
        self.op = None if not ops else ops[0] if len(ops) == 1 else T.RandomChoice(ops)

    @property
    def enabled(self) -> bool:
        return self.op is not None

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, C, H, W), (B,) int labels -> mixed images, (B, num_classes) soft targets (or the inputs unchanged)."""
        if self.op is None:
            return x, y
        return self.op(x, y)
