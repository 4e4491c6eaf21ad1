"""Speed modes for inference: one call turns a trained fp32 model into a faster one.

    fast = vitlab.optimize(model, mode="int8")
    fast = vitlab.optimize(model, mode="int8-static", calib=images)   # images: real, prepared as for the model
    fast = vitlab.optimize(model, mode="auto", calib=images)          # the fastest that keeps top-1 (see below)
    logits = fast(images)  # (B, num_classes) fp32, whatever the mode computes in

Modes (see docs/speed.md for what each costs in accuracy and what it gains on a measured machine):

    fp32          eager, unchanged (the reference every other mode is compared to)
    bf16          eager, weights and activations in bfloat16
    fp16          eager, weights and activations in float16 (fast on CPUs with AVX512-FP16)
    compile       torch.compile (Inductor) in fp32; on CPU with weight freezing, so oneDNN/MKL pre-pack weights
    compile-bf16  the same in bfloat16
    int8          dynamic quantisation of every Linear (torch.ao `quantize_dynamic`, deprecated by torch but kept
                  while measured competitive): int8 weights per output channel, activations quantised per call,
                  FBGEMM int8 GEMMs (AVX512-VNNI where the CPU has it); needs no calibration
    int8-static   static int8 (vitlab.deploy.quant): PT2E export quantisation calibrated on `calib`, lowered by Inductor
                  to oneDNN int8 kernels (needs torchao: vitlab[quant])
    openvino, openvino-int8, ort, ort-int8
                  the model run by OpenVINO / ONNX Runtime (vitlab.deploy.runtimes), int8 calibrated on `calib`
                  (OpenVINO: NNCF post-training quantisation; ORT: static QDQ)
    ort-int8-dynamic
                  ONNX Runtime dynamic int8 (weights int8, activations quantised per call; no calibration): the
                  int8 that still beats fp32 on x86 CPUs without VNNI
    auto          the candidate modes this CPU can run fast (vitlab.deploy.autoselect.plan_candidates: pruned by
                  CPU flags before anything is built), measured once per machine and model shape
                  (vitlab.perf.autotune, kind "optimize-mode") within a time budget; the fastest whose top-1
                  agrees with fp32 on >= 99% of the checked `calib` images wins. `fast.auto_report` says what was
                  measured, skipped and why

The returned `OptimizedModel` takes and returns fp32 tensors; it is for inference only. In every mode but fp32, a
`VisionTransformer` whose head reads the class token runs its last block for that token alone (the same logits, ~6%
less work for ViT-B/16: `vitlab.deploy.modes.inference_copy`). Each concrete mode is built
by `vitlab.deploy.modes.build_mode`; "auto" by `vitlab.deploy.autoselect.select_mode`, which builds its candidates
the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .autoselect import BUDGET_S, select_mode
from .modes import CALIBRATED_MODES, MODES, RUNTIME_MODES, build_mode, check_mode, example_batch
from .optimized import OptimizedModel

__all__ = ["CALIBRATED_MODES", "MODES", "RUNTIME_MODES", "OptimizedModel", "example_batch", "optimize"]


def optimize(model: nn.Module, mode: str = "fp32", *, dynamic: bool | None = None, calib: Any = None,
             example: torch.Tensor | None = None, candidates: Sequence[str] | None = None,
             budget_s: float | None = None) -> OptimizedModel:
    """Return a faster inference copy of `model` (the original is not modified).

    Args:
        model: A `VisionTransformer` (or any classifier `nn.Module` taking (B, C, H, W) images).
        mode: One of `MODES`.
        dynamic: Passed to `torch.compile` for the compile modes (None lets it decide; False specialises on the
            first batch size, recompiling once per new size).
        calib: Real images prepared as for the model ((N, C, H, W) tensor, or an iterable of such batches or of
            (images, labels) pairs), needed by `CALIBRATED_MODES`: the int8 modes calibrate on them, "auto"
            checks top-1 agreement with fp32 on them (all of them; the int8 modes calibrate on at most 128).
        example: Images of the batch shape to run ((B, C, H, W)): what "auto" times and the runtimes build for
            (default: the first 8 calibration images, or zeros of the model's input shape).
        candidates: The modes "auto" chooses among (default: `vitlab.deploy.autoselect.plan_candidates()`, the modes
            this CPU's features let be fast; explicit candidates are taken as given).
        budget_s: Seconds a first "auto" may spend building and timing (default `vitlab.deploy.autoselect.BUDGET_S`,
            120 s); candidates whose estimated cost no longer fits are skipped and said so.

    Returns:
        An `OptimizedModel` that takes fp32 (or any float) images and returns fp32 logits.

    Raises:
        ValueError: An unknown mode, a calibrated mode without `calib`, bad calibration images or candidates.
        RuntimeError: When the mode cannot run here (int8 without a quantisation engine, a CPU-only mode on a GPU
            model; compile without a C++ compiler is reported by torch at the first call).
        MissingExtraError: The mode's optional dependency is missing (torchao, openvino, onnxruntime).
    """
    check_mode(mode, calib)
    if (candidates is not None or budget_s is not None) and mode != "auto":
        raise ValueError(f"candidates= and budget_s= are for mode 'auto', not {mode!r}")
    if mode == "auto":
        return select_mode(model, calib, example=example, candidates=candidates, dynamic=dynamic,
                           budget_s=BUDGET_S if budget_s is None else budget_s)
    return build_mode(model, mode, dynamic=dynamic, calib=calib, example=example)
