"""`train.precision: auto` for a training run: the faster of fp32 and bf16 autocast for this model's own step.

A copy of the model and a fresh optimizer of the run's kind take a few full steps (`train_step`: forward,
backward, clipping, the update) on a random batch of the run's micro-batch shape, in each precision, interleaved;
the run's model, optimizer, data stream and random numbers are untouched. The step is timed eager, as a proxy for
the compiled one: compiling the step twice (once per precision) would cost more than a short run does in all
(~45 s each for the Fashion-MNIST hybrid on 2 cores). The answer is cached per machine and shape
(`vitlab.perf.autotune`), so the measuring (a few seconds to a minute, once) is paid by the first run only.
`run_precision` is a run's decision: the main process measures, the others take its answer.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

from ..models.config import to_hw
from ..perf.precision import choose_precision, model_signature, resolve_precision
from .distributed import DistInfo
from .optim import build_optimizer
from .step import train_step


def train_precision(model: nn.Module, make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
                    batch_shape: tuple[int, ...], num_classes: int, device: torch.device | str,
                    precision: str = "auto", *, clip_grad_norm: float | None = None) -> str:
    """`precision` itself unless "auto"; then the precision whose training step is faster here (measured once
    per machine and shape, see `vitlab.perf.precision.choose_precision`).

    Args:
        model: The model to train (copied for the measurement, not changed).
        make_optimizer: Builds the run's optimizer for a model (called on the copy).
        batch_shape: One micro-batch's input shape (B, C, H, W).
        num_classes: The model's output classes (the random labels' range).
        clip_grad_norm: As the run clips (its cost is part of the step).
    """
    device = torch.device(device)
    if precision != "auto":
        return resolve_precision(precision, device)  # checked, as it is
    if len(batch_shape) < 2 or batch_shape[0] < 1 or num_classes < 1:
        raise ValueError(f"train_precision: need a batch shape (B, C, ...) with B >= 1 and num_classes >= 1, got "
                         f"{batch_shape} and {num_classes}")
    with torch.random.fork_rng(devices=[]):  # dropout in the copy must not move the run's random numbers
        g = torch.Generator().manual_seed(0)
        x = torch.randn(batch_shape, generator=g).to(device)
        y = torch.randint(num_classes, (batch_shape[0],), generator=g).to(device)
        twin = copy.deepcopy(model)
        opt = make_optimizer(twin)
        lr = float(opt.param_groups[0]["lr"])

        def step(p: str) -> None:
            train_step(twin, opt, [(x, y)], lr=lr, device=device, precision=p, clip_grad_norm=clip_grad_norm)

        fused = any(g.get("fused") for g in opt.param_groups)
        key = f"{model_signature(model)} x{tuple(batch_shape)} {type(opt).__name__}{' fused' if fused else ''}"
        return choose_precision("auto", device, kind="train-precision", shape_key=key, run=step, what="training step")


def run_precision(model: nn.Module, model_cfg: Any, recipe: Any, info: DistInfo, num_classes: int) -> str:
    """A run's `train.precision`, "auto" resolved; on a CPU decided by timing this model's step in fp32 and bf16 here
    (`train_precision` on the main process, on a micro-batch of `model_cfg`'s images; the others take its answer)."""
    tr = recipe.train
    if tr.precision != "auto" or info.device.type != "cpu":
        return resolve_precision(tr.precision, info.device)
    choice: list[str | None] = [None]
    if info.is_main:
        micro = tr.batch_size // tr.accum_steps // info.world_size  # (B, C, H, W) of one micro-batch
        shape = (micro, model_cfg.in_chans, *to_hw(model_cfg.img_size))
        choice[0] = train_precision(model, lambda m: build_optimizer(m, recipe.optim), shape, num_classes,
                                    info.device, clip_grad_norm=recipe.optim.clip_grad_norm)
    if info.distributed:
        torch.distributed.broadcast_object_list(choice, src=0)
    return cast(str, choice[0])
