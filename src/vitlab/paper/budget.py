"""`--budget MINUTES`: fit an experiment's training into a wall-clock budget by scaling its step counts.

The experiment lists its training jobs (model, batch, input size, steps). Each distinct model is timed for a few
optimizer steps on random inputs in this process (its threads, this machine's load), the experiment's training time
is predicted from those timings, and every step count is multiplied by one factor so the prediction meets the
budget. One factor for all jobs keeps what the experiment compares equal: the data-scale runs of one model still
get the same steps (the same compute) whatever their data size. Evaluation is not in the prediction; the report
states the probe, the factor and the time it really took.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..weights import create_model

MIN_STEPS = 2  # no job is scaled below this many steps
PROBE_STEPS = 3  # timed steps per model, after one untimed


@dataclass(frozen=True)
class Job:
    """One training job of an experiment, as the budget sees it.

    Attributes:
        model: The recipe's model section (a zoo name plus overrides).
        batch_size: Images per step.
        steps: Steps at factor 1.
        num_classes: Classes of the head.
    """

    model: dict[str, Any]
    batch_size: int
    steps: int
    num_classes: int = 10

    def key(self) -> str:
        return json.dumps({**self.model, "batch_size": self.batch_size, "num_classes": self.num_classes},
                          sort_keys=True)


def step_seconds(model: dict[str, Any], batch_size: int, num_classes: int = 10) -> float:
    """Seconds per AdamW step (forward, backward, update) of `model` on random inputs, fp32, this process."""
    over = dict(model)
    name = over.pop("name")
    net = create_model(name, num_classes=num_classes, **over)
    size = over.get("img_size", 224)
    h, w = (size, size) if isinstance(size, int) else size
    x = torch.randn(batch_size, over.get("in_chans", 3), h, w)
    y = torch.randint(0, num_classes, (batch_size,))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    t0 = 0.0
    for i in range(PROBE_STEPS + 1):
        if i == 1:
            t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return (time.perf_counter() - t0) / PROBE_STEPS


def budget_factor(jobs: Sequence[Job], budget_min: float) -> tuple[float, dict[str, Any]]:
    """The factor for every job's steps so that the predicted training time is `budget_min` minutes.

    Returns:
        (factor, probe): probe holds each timed model's seconds per step, the prediction at factor 1 and the
        budget, for the report.
    """
    if not budget_min > 0:
        raise ValueError(f"--budget must be a positive number of minutes, got {budget_min!r}")
    timings: dict[str, float] = {}
    for job in jobs:
        if job.key() not in timings:
            timings[job.key()] = step_seconds(job.model, job.batch_size, job.num_classes)
    predicted = sum(job.steps * timings[job.key()] for job in jobs)
    factor = budget_min * 60.0 / predicted
    probe = {"budget_min": budget_min, "predicted_min_at_factor_1": predicted / 60.0, "factor": factor,
             "seconds_per_step": {k: v for k, v in timings.items()}}
    return factor, probe


def scale_steps(steps: int, factor: float) -> int:
    """`steps` times `factor`, rounded, at least MIN_STEPS."""
    return max(MIN_STEPS, round(steps * factor))

