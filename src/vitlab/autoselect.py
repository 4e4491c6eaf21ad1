"""`vitlab.optimize(model, "auto", calib=images)`: the fastest speed mode that keeps the fp32 model's answers.

Each candidate mode is built, checked (top-1 agreement with the fp32 model on every calibration image must reach
`MIN_AGREEMENT`; a mode below it, or one that cannot run here, counts as not eligible) and timed on the example
batch (median of a few calls after warm-up). The timings are stored by vitlab.autotune under the kind
"optimize-mode", keyed by machine and model shape (`shape_key`), so the next call on this machine for a model of
the same shape builds only the winner. Agreement depends on the weights, not only the shape, so the cached winner is
checked again on this model's calibration images; when it falls short, the next fastest stored candidate is tried,
down to fp32 (always eligible).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from . import autotune
from ._extras import MissingExtraError
from .optimize import MODES, OptimizedModel, example_batch, optimize
from .quant import calibration_tensor, input_chw

__all__ = ["KIND", "MIN_AGREEMENT", "agreement", "auto_candidates", "select_mode", "shape_key"]

log = logging.getLogger("vitlab.optimize")

KIND = "optimize-mode"
MIN_AGREEMENT = 0.99  # top-1 agreement with fp32 on the calibration images a mode must reach
_WARMUP, _ROUNDS = 2, 5


def auto_candidates(device: torch.device | str = "cpu") -> tuple[str, ...]:
    """The modes "auto" tries by default on `device`, fp32 first (the answer when autotune is off).

    fp16 is left out on CPUs (without AVX512-FP16 it runs emulated, many times slower); the runtime modes only
    where their package is installed (an optional extra).
    """
    import importlib.util

    if torch.device(device).type != "cpu":
        return ("fp32", "bf16", "fp16", "compile", "compile-bf16")
    out = ["fp32", "compile", "bf16", "compile-bf16", "int8"]
    if importlib.util.find_spec("torchao") is not None:
        out.append("int8-static")
    if importlib.util.find_spec("openvino") is not None:
        out += ["openvino"] + (["openvino-int8"] if importlib.util.find_spec("nncf") is not None else [])
    if importlib.util.find_spec("onnxruntime") is not None and importlib.util.find_spec("onnxscript") is not None:
        out += ["ort", "ort-int8"]
    return tuple(out)


def shape_key(model: nn.Module, example: torch.Tensor) -> str:
    """What a timing holds for: the model's class and shape (its config's name and sizes, else its parameter count)
    and the input batch shape."""
    cfg = getattr(model, "cfg", None)
    if cfg is not None and hasattr(cfg, "embed_dim"):
        what = (f"{type(model).__name__} d{cfg.embed_dim} L{cfg.depth} h{cfg.num_heads} p{cfg.patch_size} "
                f"mlp{getattr(cfg, 'mlp_dim', '?')} cls{cfg.num_classes}")
    else:
        what = f"{type(model).__name__} params={sum(p.numel() for p in model.parameters())}"
    return f"{what} in={'x'.join(map(str, example.shape))}"


@torch.no_grad()
def agreement(fast: nn.Module, logits: torch.Tensor, images: torch.Tensor, batch: int) -> float:
    """Share of `images` on which `fast` picks the same top-1 class as the reference `logits` (N, classes)."""
    same = 0
    for i in range(0, len(images), batch):
        same += int((fast(images[i : i + batch]).argmax(-1) == logits[i : i + batch].argmax(-1)).sum())
    return same / len(images)


def select_mode(model: nn.Module, calib: Any, *, example: torch.Tensor | None = None,
                candidates: Sequence[str] | None = None, dynamic: bool | None = None) -> OptimizedModel:
    """The "auto" mode of `vitlab.optimize` (see the module docstring); its `.mode` is the chosen mode.

    Raises:
        ValueError: Bad calibration images or candidates (unknown, repeated, "auto" itself).
    """
    ref = next(model.parameters(), None)
    device = ref.device if ref is not None else torch.device("cpu")
    cands = list(candidates) if candidates is not None else list(auto_candidates(device))
    bad = [c for c in cands if c not in MODES or c == "auto"]
    if bad or not cands:
        raise ValueError(f"auto candidates must be speed modes other than 'auto'; got {bad or cands}")
    x = example_batch(model, calib, example).to(device)  # (B, C, H, W): the batch shape timed
    images = calibration_tensor(calib, input_chw(model), 1 << 62).to(device)  # (N, C, H, W): all of them
    model = model.eval()
    with torch.no_grad():
        logits = torch.cat([model(c) for c in images.split(len(x))])  # (N, classes): the fp32 answers
    key = shape_key(model, x)
    best: dict[str, OptimizedModel] = {}  # the fastest built so far, kept to hand back without building it again
    best_time = [float("inf")]

    def build(mode: str) -> OptimizedModel | None:
        """`mode` built, or None when it cannot run here or falls short of MIN_AGREEMENT on the images."""
        try:
            fast = optimize(model, mode, dynamic=dynamic, calib=images, example=x)
            agree = agreement(fast, logits, images, len(x))
        except (MissingExtraError, RuntimeError, NotImplementedError, ValueError) as e:  # logged, not hidden
            log.info("auto: %s cannot run here: %s", mode, str(e).splitlines()[0] if str(e) else type(e).__name__)
            return None
        if agree < MIN_AGREEMENT:
            log.info("auto: %s agrees with fp32 on %.2f%% of %d images (< %.0f%%): not eligible", mode,
                     100 * agree, len(images), 100 * MIN_AGREEMENT)
            return None
        return fast

    def measure(mode: str) -> float | None:
        fast = build(mode)
        if fast is None:
            return None
        with torch.no_grad():
            for _ in range(_WARMUP):
                fast(x)
            times = []
            for _ in range(_ROUNDS):
                t = _clock(device)
                fast(x)
                times.append(_clock(device) - t)
        seconds = statistics.median(times)
        if seconds < best_time[0]:
            best.clear()
            best[mode], best_time[0] = fast, seconds
        return seconds

    winner = autotune.cached_choice(KIND, key, cands, measure, device=device)
    if winner in best:
        return best[winner]
    # cached (or autotune off): build it, and check agreement for this model's weights; fall back in time order
    stored = autotune.timings(KIND, key, device=device)
    faster = sorted((c for c in cands if c != winner and stored.get(c) is not None), key=lambda c: stored[c] or 0.0)
    order = [winner, *faster]
    for mode in [*order, *(["fp32"] if "fp32" not in order else [])]:
        fast = build(mode)
        if fast is not None:
            return fast
        log.info("auto: stored winner %s is not eligible for this model; trying the next", mode)
    raise AssertionError("unreachable: fp32 always agrees with itself")  # pragma: no cover


def _clock(device: torch.device) -> float:
    import time

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
