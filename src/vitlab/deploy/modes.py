"""The speed modes, one concrete mode built at a time: `build_mode(model, "int8")` is what `vitlab.optimize` does
for every mode but "auto", and what "auto" (`vitlab.deploy.autoselect`) calls for each candidate it tries.

    fp32 | bf16 | fp16          eager, in that dtype
    compile | compile-bf16      torch.compile (Inductor); on CPU with weight freezing
    int8                        torch.ao dynamic quantisation of every Linear (FBGEMM)
    int8-static                 PT2E static int8, calibrated (`vitlab.deploy.quant`)
    openvino[-int8], ort[-int8], ort-int8-dynamic
                                the model run by OpenVINO / ONNX Runtime (`vitlab.deploy.runtimes`)

What each costs and gains: `vitlab.deploy.optimize` and docs/speed.md.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
from torch import nn

from ..models.vit import VisionTransformer
from . import runtimes
from .calibration import calibration_tensor, input_chw
from .optimized import OptimizedModel
from .quant import quantize_static

RUNTIME_MODES = ("openvino", "openvino-int8", "ort", "ort-int8", "ort-int8-dynamic")
MODES = ("fp32", "bf16", "fp16", "compile", "compile-bf16", "int8", "int8-static", *RUNTIME_MODES, "auto")
CALIBRATED_MODES = ("int8-static", "openvino-int8", "ort-int8", "auto")  # these need `calib`

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "compile": torch.float32,
           "compile-bf16": torch.bfloat16}


def check_mode(mode: str, calib: Any) -> None:
    """ValueError for an unknown mode, or a calibrated one without calibration images."""
    if mode not in MODES:
        raise ValueError(f"unknown speed mode {mode!r}; choose one of {', '.join(MODES)}")
    if mode in CALIBRATED_MODES and calib is None:
        raise ValueError(f"mode {mode!r} needs calibration images: optimize(model, {mode!r}, calib=images), with a "
                         "few real images prepared as for the model")


def build_mode(model: nn.Module, mode: str, *, dynamic: bool | None = None, calib: Any = None,
               example: torch.Tensor | None = None) -> OptimizedModel:
    """A faster inference copy of `model` in one concrete `mode` (any of `MODES` but "auto"); the arguments are
    `vitlab.optimize`'s. The original model is not modified."""
    check_mode(mode, calib)
    if mode == "auto":
        raise ValueError("build_mode builds one concrete mode; 'auto' chooses among them (vitlab.optimize)")
    ref = next(model.parameters(), None)
    device = ref.device if ref is not None else torch.device("cpu")
    if mode in RUNTIME_MODES:
        return _runtime(model, mode, calib, example, device)
    m = inference_copy(model, prune=mode != "fp32")  # fp32 stays the unchanged reference
    if mode == "int8":
        return OptimizedModel(_quantize_int8(m, device), mode, torch.float32)
    if mode == "int8-static":
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


def inference_copy(model: nn.Module, prune: bool = True) -> nn.Module:
    """A copy of `model` for a speed mode: in eval mode, without gradients, and (`prune`) for a `VisionTransformer`
    whose head reads the leading tokens alone, with `prune_last_block` on: its last block runs for those tokens only
    (their keys and values still come from every token). The logits are the same up to rounding; ViT-B/16 does ~6%
    less work (1.06-1.07x with int8-static on a 2-core Zen 4, docs/speed.md)."""
    m = copy.deepcopy(model).eval().requires_grad_(False)
    if prune and isinstance(m, VisionTransformer) and m.head_rows is not None:
        m.prune_last_block = True
    return m


def example_batch(model: nn.Module, calib: Any, example: torch.Tensor | None, batch: int = 8) -> torch.Tensor:
    """The (B, C, H, W) images a mode is built and timed for: `example`, else the first `batch` calibration images,
    else zeros of a vitlab model's input shape."""
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
    """The OpenVINO / ONNX Runtime modes, built by `vitlab.deploy.runtimes`."""
    if device.type != "cpu":
        raise RuntimeError(f"mode {mode!r} runs on the CPU only (the model is on {device}); move it with .cpu()")
    x = example_batch(model, calib, example)
    m = inference_copy(model)
    if mode == "ort-int8-dynamic":
        fast = runtimes.to_onnxruntime(m, x, int8=True, method="dynamic")
        fast.mode = mode
        return fast
    int8 = mode.endswith("-int8")
    if mode.startswith("openvino"):
        return runtimes.to_openvino(m, x, int8=int8, calib=calib if int8 else None)
    return runtimes.to_onnxruntime(m, x, int8=int8, calib=calib if int8 else None)


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
