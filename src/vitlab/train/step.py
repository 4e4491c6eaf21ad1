"""One optimizer step: forward and backward over the micro-batches under autocast, global-norm clipping, the
update only when every process saw a finite loss and gradient norm, and a check that the updated weights are
still finite (a finite gradient times a huge learning rate or weight decay is not); `NonFiniteError` is how a run
stops on non-finite numbers."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from ..perf.int8_train import int8_training
from ..perf.linear import rowmajor_weight_grads
from ..perf.onednn import onednn_training_kernels
from ..perf.precision import autocast
from .distributed import DistInfo, all_reduce_mean, all_true
from .mixup import BatchMix


class NonFiniteError(RuntimeError):
    """The run stopped on non-finite numbers: `train.max_bad_steps` non-finite steps in a row, an update that made
    the weights inf / nan, or weights / optimizer state about to be saved that are not finite. Nothing non-finite
    is written; the checkpoints already on disk (all finite) are kept."""


@dataclass
class StepResult:
    """What one optimizer step did: mean loss of its micro-batches, global grad norm, whether it was applied, and
    whether the weights it updated are all finite afterwards (False: the update overflowed them; the caller must
    not save, evaluate or continue from them); the learning rate it applied and the (H, W) of its images (None for
    inputs that are not images, e.g. a linear probe's features), for the log."""

    loss: float
    grad_norm: float
    applied: bool
    weights_finite: bool = True
    lr: float = 0.0
    img_size: tuple[int, int] | None = None


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every element of every tensor is finite, cheaply: the global 2-norm (one fused multi-tensor
    reduction per device and dtype, one sync; about 4 ms for ViT-S/16's 22M weights on one CPU core, a tenth of
    the AdamW update) is nan or inf if any element is. It also overflows for finite weights beyond ~1e15, so only
    then the exact, slower max-|x| norm decides."""
    if not tensors:
        return True

    def finite(norm: torch.Tensor) -> bool:
        return bool(torch.isfinite(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))  # FSDP: global

    get_total_norm = torch.nn.utils.get_total_norm
    return finite(get_total_norm(tensors, norm_type=2.0)) or finite(get_total_norm(tensors, norm_type=float("inf")))


def first_non_finite(tensors: Any, prefix: str = "") -> str | None:
    """The name of the first floating-point tensor holding an inf or nan in a (nested) state dict, else None."""
    if isinstance(tensors, torch.Tensor):
        if tensors.is_floating_point() and not all_finite([tensors]):
            return prefix or "tensor"
        return None
    items = tensors.items() if isinstance(tensors, dict) else enumerate(tensors) if isinstance(
        tensors, list | tuple) else ()
    for k, v in items:
        bad = first_non_finite(v, f"{prefix}.{k}" if prefix else str(k))
        if bad is not None:
            return bad
    return None


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    lr: float,
    device: torch.device,
    precision: str = "auto",
    clip_grad_norm: float | None = None,
    label_smoothing: float = 0.0,
    mix: BatchMix | None = None,
    accum_steps: int = 1,
    info: DistInfo | None = None,
    on_loss: Callable[[torch.Tensor], torch.Tensor] | None = None,
    loss_fn: Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    int8: bool = False,
) -> StepResult:
    """One optimizer step over `accum_steps` micro-batches: forward, backward, clip, and the update only if the
    loss and the global gradient norm are finite on every process (otherwise the gradients are dropped). After an
    update the updated parameters are checked (`all_finite`, on every process): `weights_finite` is False when
    it made any of them inf or nan.

    Args:
        on_loss: A hook applied to each micro-batch loss (tests inject NaN through it).
        loss_fn: The loss of (model output, targets, inputs), computed in fp32 outside autocast; default the
            cross-entropy of the logits with `label_smoothing` (DeiT distillation: `vitlab.train.distill`).
        int8: The linear layers' forward and input-gradient GEMMs in int8 (`vitlab.perf.int8_train`, a CPU only).
    """
    info = info or DistInfo(device=device)
    for group in optimizer.param_groups:
        group["lr"] = lr
    model.train()
    total = 0.0
    batches = list(micro_batches)
    if len(batches) != accum_steps:
        raise ValueError(f"expected {accum_steps} micro-batches, got {len(batches)}")
    for i, (x, y) in enumerate(batches):
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        if mix is not None and mix.enabled:
            x, y = mix(x, y)  # y: (B, classes) soft targets
        sync = i == accum_steps - 1 or not isinstance(model, nn.parallel.DistributedDataParallel)
        no_sync = contextlib.nullcontext() if sync else cast(nn.parallel.DistributedDataParallel, model).no_sync()
        with (no_sync, autocast(device, precision), rowmajor_weight_grads(device, precision),
              onednn_training_kernels(device, precision), int8_training(device, int8)):  # innermost: sees linears first
            logits = model(x)  # (B, classes)
        if loss_fn is not None:
            loss = loss_fn(logits, y, x)
        else:
            loss = F.cross_entropy(logits.float(), y, label_smoothing=label_smoothing)
        if on_loss is not None:
            loss = on_loss(loss)
        (loss / accum_steps).backward()
        total += loss.item()
    loss_value = all_reduce_mean(total / accum_steps, info)
    params = [p for p in model.parameters() if p.grad is not None]
    # The global norm over all parameters (clipped when asked; inf threshold just measures it).
    norm = torch.nn.utils.clip_grad_norm_(params, clip_grad_norm if clip_grad_norm else float("inf"), foreach=True)
    grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    applied = all_true(math.isfinite(loss_value) and math.isfinite(grad_norm), info)
    weights_finite = True
    if applied:
        try:
            optimizer.step()
            stepped = True
        except RuntimeError as e:  # lr / bias correction too large for a float32 scalar: weights half-updated
            if "overflow" not in str(e):
                raise
            stepped = False
        finite = all_finite([p.detach() for p in params])  # every rank calls: a collective under FSDP
        weights_finite = all_true(stepped and finite, info)
    optimizer.zero_grad(set_to_none=True)
    x0 = batches[0][0]
    img_size = (int(x0.shape[-2]), int(x0.shape[-1])) if x0.dim() == 4 else None
    return StepResult(loss_value, grad_norm, applied, weights_finite, lr=lr, img_size=img_size)


def resize_batch(x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """Images (B, C, H, W) resized to hw (bilinear, antialiased when shrinking); unchanged if already hw."""
    if tuple(x.shape[-2:]) == tuple(hw):
        return x
    return F.interpolate(x, size=hw, mode="bilinear", align_corners=False, antialias=True)
