"""Speed modes for inference: one call turns a trained fp32 model into a faster one.

    fast = vitlab.optimize(model, mode="int8")
    logits = fast(images)  # (B, num_classes) fp32, whatever the mode computes in

Modes (see docs/speed.md for what each costs in accuracy and what it gains on a measured machine):

    fp32          eager, unchanged (the reference every other mode is compared to)
    bf16          eager, weights and activations in bfloat16
    fp16          eager, weights and activations in float16 (fast on CPUs with AVX512-FP16)
    compile       torch.compile (Inductor) in fp32; on CPU with weight freezing, so oneDNN/MKL pre-pack weights
    compile-bf16  the same in bfloat16
    int8          dynamic quantisation of every Linear: int8 weights (per output channel), activations quantised
                  per call, int8 x int8 -> int32 GEMMs (FBGEMM, using AVX512-VNNI where the CPU has it)

The returned `OptimizedModel` takes and returns fp32 tensors; it is for inference only.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

MODES = ("fp32", "bf16", "fp16", "compile", "compile-bf16", "int8")

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "compile": torch.float32,
           "compile-bf16": torch.bfloat16, "int8": torch.float32}


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


def optimize(model: nn.Module, mode: str = "fp32", *, dynamic: bool | None = None) -> OptimizedModel:
    """Return a faster inference copy of `model` (the original is not modified).

    Args:
        model: A `VisionTransformer` (or any classifier `nn.Module` taking (B, C, H, W) images).
        mode: One of `MODES`.
        dynamic: Passed to `torch.compile` for the compile modes (None lets it decide; False specialises on the
            first batch size, recompiling once per new size).

    Returns:
        An `OptimizedModel` that takes fp32 (or any float) images and returns fp32 logits.

    Raises:
        ValueError: For an unknown mode.
        RuntimeError: When the mode cannot run here (int8 without a quantisation engine, compile without a C++
            compiler is reported by torch at the first call).
    """
    if mode not in MODES:
        raise ValueError(f"unknown speed mode {mode!r}; choose one of {', '.join(MODES)}")
    dtype = _DTYPES[mode]
    ref = next(model.parameters(), None)
    device = ref.device if ref is not None else torch.device("cpu")
    m = copy.deepcopy(model).eval().requires_grad_(False)
    if mode == "int8":
        return OptimizedModel(_quantize_int8(m, device), mode, dtype)
    m = m.to(dtype)
    if mode.startswith("compile"):
        # on CPU: pre-packed weights, folded constants
        options: dict[str, Any] | None = {"freezing": True} if device.type == "cpu" else None
        compiled = torch.compile(m, dynamic=dynamic, options=options)
        return OptimizedModel(m, mode, dtype, compiled)
    return OptimizedModel(m, mode, dtype)


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
