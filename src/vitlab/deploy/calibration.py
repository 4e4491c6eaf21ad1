"""Calibration images: the one reader of what `calib=` takes, for every int8 path (the runtimes' int8, static int8
in `vitlab.deploy.quant`, `optimize(..., calib=...)` and mode "auto").

    images = calibration_tensor(calib, input_chw(model), limit=300)   # (n, C, H, W) fp32 on the CPU
    batches = calibration_batches(calib, chw)                         # [(1, C, H, W) arrays]: NNCF's / ORT's readers

(Image files, folders and data set specs become such a tensor first: `vitlab export --calib`, in `vitlab.cli.export`.)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

DEFAULT_CALIB_IMAGES = 300  # NNCF's default subset_size


def calibration_tensor(calib: Any, chw: tuple[int, int, int] | None, limit: int = DEFAULT_CALIB_IMAGES
                       ) -> torch.Tensor:
    """`calib` as one fp32 (n, C, H, W) CPU tensor of at most `limit` images, each checked against `chw`.

    The one reader of calibration inputs: the int8 runtimes (`calibration_batches`), static int8
    (`vitlab.deploy.quant`), `optimize(..., calib=...)` and mode "auto" all take what it takes.

    Args:
        calib: A (N, C, H, W) or (C, H, W) tensor or array, or an iterable of such batches or of (images, labels,
            ...) tuples (a DataLoader, `vitlab.data.build_eval_data(...)`).
        chw: The (C, H, W) the model takes (`input_chw`); None: every batch must match the first.
        limit: Images to keep.

    Raises:
        ValueError: No calibration data, no images in it, or images of another shape, channel count or kind (the
            message says which).
    """
    if calib is None:
        raise ValueError("int8 needs calibration images (calib=...): real images prepared as for the model, e.g. "
                         "32-300 of the training set")
    batches: Iterable[Any] = [calib] if isinstance(calib, torch.Tensor | np.ndarray) else calib
    out: list[torch.Tensor] = []
    n = 0
    for b in batches:
        x = torch.as_tensor(b[0] if isinstance(b, tuple | list) else b)
        if x.dim() == 3:
            x = x[None]  # one image
        if chw is None and x.dim() == 4:
            chw = (int(x.shape[1]), int(x.shape[2]), int(x.shape[3]))
        if x.dim() != 4:
            raise ValueError(f"calibration images have shape {tuple(x.shape)}; the model takes (N, C, H, W) images "
                             f"with (C, H, W) = {chw}")
        if tuple(x.shape[1:]) != chw:
            assert chw is not None
            channels = f"{x.shape[1]} channel(s), " if x.shape[1] != chw[0] else ""
            raise ValueError(f"calibration images have {channels}shape {tuple(x.shape[1:])} per image (batch shape "
                             f"{tuple(x.shape)}), but the model takes (C, H, W) = {chw}")
        if not x.is_floating_point():
            raise ValueError(f"calibration images must be float images prepared for the model, got {x.dtype}")
        out.append(x[: limit - n].detach().to("cpu", torch.float32))
        n += len(out[-1])
        if n >= limit:
            break
    if n == 0:
        raise ValueError("the calibration data holds no images")
    return torch.cat(out)  # (n, C, H, W)


def input_chw(model: nn.Module) -> tuple[int, int, int] | None:
    """The (C, H, W) a vitlab model takes, from its config (None for a model without one)."""
    cfg = getattr(model, "cfg", None)
    if cfg is None or not hasattr(cfg, "in_chans") or not hasattr(cfg, "img_size"):
        return None
    size = cfg.img_size
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    return int(cfg.in_chans), int(h), int(w)


def calibration_batches(calib: Any, chw: tuple[int, int, int], limit: int = DEFAULT_CALIB_IMAGES
                        ) -> list[np.ndarray]:
    """`calibration_tensor(calib, chw, limit)` as the list of fp32 (1, C, H, W) arrays that NNCF's and ONNX
    Runtime's calibration readers take, one image each."""
    return [a[None] for a in calibration_tensor(calib, chw, limit).numpy()]
