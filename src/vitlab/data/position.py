"""Where a deterministic training stream stands: (epoch, step), and the global order of samples.

Every stream in this package is a pure function of (seed, epoch, step): epoch e visits the training set in
the permutation drawn from (seed, e), step s of it takes the s-th block of `global_batch` indices, and rank r
of world_size takes the r-th slice of that block. Augmentation randomness is drawn from (seed, epoch, step)
(whole-batch) or (seed, epoch, step, position in the global batch) (per sample), never from global RNG
state, so a restored position replays exactly and the ranks' batches concatenate to the single-process one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .batch_augment import derive_seed


@dataclass
class Position:
    """The next batch to produce."""

    epoch: int = 0
    step: int = 0

    def advance(self, steps_per_epoch: int) -> None:
        self.step += 1
        if self.step >= steps_per_epoch:
            self.epoch, self.step = self.epoch + 1, 0


def epoch_permutation(seed: int, epoch: int, n: int) -> torch.Tensor:
    """int64 (n,): the visiting order of epoch `epoch`."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(derive_seed(seed, epoch, 0xE90C)))


def check_state(state: dict[str, Any], expected: dict[str, Any], what: str) -> None:
    """Refuse to resume a stream whose defining settings changed; name what differs."""
    if not isinstance(state, dict) or "epoch" not in state or "step" not in state:
        raise ValueError(f"{what}: not a data-stream state (expected a dict with 'epoch' and 'step'), got {state!r}")
    diffs = [f"{k}: checkpoint {state[k]!r} != now {v!r}" for k, v in expected.items() if k in state and state[k] != v]
    if diffs:
        raise ValueError(f"{what}: cannot resume exactly, the data settings changed ({'; '.join(diffs)})")
