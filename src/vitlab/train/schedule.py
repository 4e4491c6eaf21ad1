"""Learning rate per step: linear warm-up from 0 to the peak, then cosine / linear decay to `end_lr`.

A pure function of the step, so resuming needs nothing but the step (paper: 10k warm-up + linear decay for
pre-training, 500 warm-up + cosine for fine-tuning).
"""

from __future__ import annotations

import math

from .recipe import ScheduleSection


def lr_at(step: int, total_steps: int, peak_lr: float, cfg: ScheduleSection) -> float:
    """Learning rate of optimizer step `step` (0-based) out of `total_steps`."""
    warmup = min(cfg.warmup_steps, total_steps)
    if step < warmup:
        return peak_lr * (step + 1) / warmup  # the first step already moves: lr = peak / warmup
    if cfg.name == "constant":
        return peak_lr
    decay_steps = max(total_steps - warmup, 1)
    t = min((step - warmup) / decay_steps, 1.0)  # 0 -> 1 over the decay phase
    if cfg.name == "linear":
        frac = 1.0 - t
    elif cfg.name == "cosine":
        frac = 0.5 * (1.0 + math.cos(math.pi * t))
    else:
        raise ValueError(f"unknown schedule {cfg.name!r}; valid: cosine, linear, constant")
    return cfg.end_lr + (peak_lr - cfg.end_lr) * frac
