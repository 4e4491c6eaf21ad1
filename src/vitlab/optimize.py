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
    int8-static   static int8 (vitlab.quant): PT2E export quantisation calibrated on `calib`, lowered by Inductor
                  to oneDNN int8 kernels (needs torchao: vitlab[quant])
    openvino, openvino-int8, ort, ort-int8
                  the model run by OpenVINO / ONNX Runtime (vitlab.deploy), int8 calibrated on `calib`
                  (OpenVINO: NNCF post-training quantisation; ORT: static QDQ)
    ort-int8-dynamic
                  ONNX Runtime dynamic int8 (weights int8, activations quantised per call; no calibration): the
                  int8 that still beats fp32 on x86 CPUs without VNNI
    auto          the candidate modes this CPU can run fast (vitlab.autoselect.plan_candidates: pruned by CPU
                  flags before anything is built), measured once per machine and model shape (vitlab.autotune, kind
                  "optimize-mode") within a time budget; the fastest whose top-1 agrees with fp32 on >= 99% of
                  the checked `calib` images wins. `fast.auto_report` says what was measured, skipped and why

The returned `OptimizedModel` takes and returns fp32 tensors; it is for inference only.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

RUNTIME_MODES = ("openvino", "openvino-int8", "ort", "ort-int8", "ort-int8-dynamic")
MODES = ("fp32", "bf16", "fp16", "compile", "compile-bf16", "int8", "int8-static", *RUNTIME_MODES, "auto")
CALIBRATED_MODES = ("int8-static", "openvino-int8", "ort-int8", "auto")  # these need `calib`

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "compile": torch.float32,
           "compile-bf16": torch.bfloat16}


class OptimizedModel(nn.Module):
    """An inference-only wrapper: casts the input to the compute dtype and the logits back to fp32.

    Attributes:
        module: The converted model (a copy; the original is left untouched).
        mode: The speed mode it was built with.
        dtype: The floating dtype it computes in.
    """

    def __init__(self, module: nn.Module, mode: str, dtype: torch.dtype, compiled: Callable[..., Any] | None = None):
        super().__init__()
        self.module = module
        self.mode = mode
        self.dtype = dtype
        self._run = compiled if compiled is not None else module
        self.auto_report: Any = None  # mode "auto": its vitlab.autoselect.AutoReport (candidates, timings, skipped)
        super().train(False)  # born in eval mode: callers that save and restore `.training` never ask for train

    @torch.inference_mode()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x.to(self.dtype)).float()  # (B, num_classes) in fp32

    def train(self, mode: bool = True) -> OptimizedModel:
        if mode:
            raise RuntimeError(f"an optimize(mode={self.mode!r}) model is for inference only; train the original")
        return super().train(False)

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}, dtype={self.dtype}"


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
        candidates: The modes "auto" chooses among (default: `vitlab.autoselect.plan_candidates()`, the modes
            this CPU's features let be fast; explicit candidates are taken as given).
        budget_s: Seconds a first "auto" may spend building and timing (default `vitlab.autoselect.BUDGET_S`,
            120 s); candidates whose estimated cost no longer fits are skipped and said so.

    Returns:
        An `OptimizedModel` that takes fp32 (or any float) images and returns fp32 logits.

    Raises:
        ValueError: An unknown mode, a calibrated mode without `calib`, bad calibration images or candidates.
        RuntimeError: When the mode cannot run here (int8 without a quantisation engine, a CPU-only mode on a GPU
            model; compile without a C++ compiler is reported by torch at the first call).
        MissingExtraError: The mode's optional dependency is missing (torchao, openvino, onnxruntime).
    """
    if mode not in MODES:
        raise ValueError(f"unknown speed mode {mode!r}; choose one of {', '.join(MODES)}")
    if mode in CALIBRATED_MODES and calib is None:
        raise ValueError(f"mode {mode!r} needs calibration images: optimize(model, {mode!r}, calib=images), with a "
                         "few real images prepared as for the model")
    if (candidates is not None or budget_s is not None) and mode != "auto":
        raise ValueError(f"candidates= and budget_s= are for mode 'auto', not {mode!r}")
    if mode == "auto":
        from .autoselect import BUDGET_S, select_mode

        return select_mode(model, calib, example=example, candidates=candidates, dynamic=dynamic,
                           budget_s=BUDGET_S if budget_s is None else budget_s)
    ref = next(model.parameters(), None)
    device = ref.device if ref is not None else torch.device("cpu")
    if mode in RUNTIME_MODES:
        return _runtime(model, mode, calib, example, device)
    m = copy.deepcopy(model).eval().requires_grad_(False)
    if mode == "int8":
        return OptimizedModel(_quantize_int8(m, device), mode, torch.float32)
    if mode == "int8-static":
        from .quant import quantize_static

        qmodel, run = quantize_static(m, calib)
        return OptimizedModel(qmodel, mode, torch.float32, run)
    dtype = _DTYPES[mode]
    m = m.to(dtype)
    if mode.startswith("compile"):
        # on CPU: pre-packed weights, folded constants
        options: dict[str, Any] | None = {"freezing": True} if device.type == "cpu" else None
        compiled = torch.compile(m, dynamic=dynamic, options=options)
        return OptimizedModel(m, mode, dtype, compiled)
    return OptimizedModel(m, mode, dtype)


def example_batch(model: nn.Module, calib: Any, example: torch.Tensor | None, batch: int = 8) -> torch.Tensor:
    """The (B, C, H, W) images a mode is built and timed for: `example`, else the first `batch` calibration images,
    else zeros of a vitlab model's input shape."""
    from .quant import calibration_tensor, input_chw

    chw = input_chw(model)
    if example is not None:
        if example.dim() != 4 or (chw is not None and tuple(example.shape[1:]) != chw):
            raise ValueError(f"example must be images (B, C, H, W) with (C, H, W) = {chw}, got {tuple(example.shape)}")
        return example.detach().float().cpu()
    if calib is not None:
        return calibration_tensor(calib, chw, batch)
    if chw is None:
        raise ValueError("pass example= (images of the batch shape to run): this model has no config to read it from")
    return torch.zeros(batch, *chw)


def _runtime(model: nn.Module, mode: str, calib: Any, example: torch.Tensor | None,
             device: torch.device) -> OptimizedModel:
    """The OpenVINO / ONNX Runtime modes, built by vitlab.deploy."""
    if device.type != "cpu":
        raise RuntimeError(f"mode {mode!r} runs on the CPU only (the model is on {device}); move it with .cpu()")
    from . import deploy

    x = example_batch(model, calib, example)
    m = copy.deepcopy(model).eval().requires_grad_(False)
    if mode == "ort-int8-dynamic":
        fast = deploy.to_onnxruntime(m, x, int8=True, method="dynamic")
        fast.mode = mode
        return fast
    int8 = mode.endswith("-int8")
    if mode.startswith("openvino"):
        return deploy.to_openvino(m, x, int8=int8, calib=calib if int8 else None)
    return deploy.to_onnxruntime(m, x, int8=int8, calib=calib if int8 else None)


def _quantize_int8(model: nn.Module, device: torch.device) -> nn.Module:
    """Dynamic int8 quantisation of the Linear layers, weights per output channel (CPU only)."""
    if device.type != "cpu":
        raise RuntimeError(f"mode 'int8' runs on the CPU only (the model is on {device}); move it with .cpu()")
    engines = torch.backends.quantized.supported_engines
    engine = "fbgemm" if "fbgemm" in engines else ("x86" if "x86" in engines else None)
    if engine is None:
        raise RuntimeError(f"mode 'int8' needs the fbgemm or x86 quantisation engine; this torch has {engines}")
    torch.backends.quantized.engine = engine
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao; the kernels remain
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.filterwarnings("ignore", message=r"torch\.quantize_per_\w+.*deprecated", category=UserWarning)
        return quantize_dynamic(model.float(), {nn.Linear: per_channel_dynamic_qconfig}, inplace=True)
