"""The optimizer: AdamW (paper pre-training) or SGD with momentum (paper fine-tuning), with weight decay only on
tensors of 2+ dims that the model does not list in `no_weight_decay()` (nanoGPT / timm convention)."""

from __future__ import annotations

import torch
from torch import nn

from .recipe import OptimSection


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: matrices and kernels decay; biases, LayerNorm gains, position embeddings, class token don't."""
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        # DDP / torch.compile wrap names ("module.", "_orig_mod."); match on the bare name.
        bare = name.removeprefix("module.").removeprefix("_orig_mod.")
        if p.ndim < 2 or bare in skip:
            no_decay.append(p)
        else:
            decay.append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def _fusable(groups: list[dict]) -> bool:
    """Whether torch's fused AdamW takes these parameters: plain float tensors (not FSDP's DTensors), all on one
    CPU or CUDA device."""
    params = [p for g in groups for p in g["params"]]
    devices = {p.device for p in params}
    return (bool(params) and len(devices) == 1 and next(iter(devices)).type in ("cpu", "cuda")
            and all(type(p.data) is torch.Tensor and p.is_floating_point() for p in params))


def build_optimizer(model: nn.Module, cfg: OptimSection) -> torch.optim.Optimizer:
    """The optimizer of a recipe's `optim` section, lr set to the peak (the schedule scales it per step)."""
    groups = param_groups(model, cfg.weight_decay)
    if cfg.name == "adamw":
        # fused: one kernel for the whole update on CPU and CUDA (fewer passes over the weights than foreach)
        impl = {"fused": True} if _fusable(groups) else {"foreach": True}
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.betas[0], cfg.betas[1]), eps=cfg.eps, **impl)
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov, foreach=True)
    raise ValueError(f"unknown optimizer {cfg.name!r}; valid: adamw, sgd")
