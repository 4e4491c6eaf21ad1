"""LayerNorm then uint8 quantisation in one pass over each row: `vitlab::layer_norm_quantize`.

In a static int8 ViT (`vitlab.deploy.quant`) every LayerNorm but the last feeds an int8 GEMM through a per-tensor
quantise: `quantize_per_tensor(layer_norm(x), scale, zero_point, 0, 255, uint8)`. Inductor (torch 2.14) fuses
the two into one generated loop, but splits the LayerNorm's two reductions and its normalisation into separate
`omp for` passes over the whole (tokens, width) tensor: three reads of the fp32 residual stream from L3 and four
thread barriers per LayerNorm (ViT-B/16, batch 8: ~0.45 ms each, 24 of them). This op (norm_quant.cpp beside this
file, compiled on first use by Inductor's C++ builder) takes each row through once, in L1.

Arithmetic as Inductor's loop and `torch.ops.quantized_decomposed.quantize_per_tensor`: fp32, mean and the mean
of squared deviations in two passes over the row, y = (x - mean) / sqrt(var + eps) * w + b, then
clamp(round_half_even(y * (1 / scale)) + zero_point, quant_min, quant_max). Codes agree with that reference except
where y / scale lands within float rounding of a half (summation order differs): one code apart, and rarely.
"""

from __future__ import annotations

import ctypes
import functools
import math
from typing import Any

import torch

from . import cpp_kernel

__all__ = ["layer_norm_quantize", "layer_norm_quantize_build_error", "unsupported_inputs"]


@functools.cache
def _kernel() -> Any:
    args = ([ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
             ctypes.c_int64] + [ctypes.c_float] * 5 + [ctypes.c_int])
    return cpp_kernel.kernel("norm_quant.cpp", "vitlab_layer_norm_quantize", args,
                             "static int8 keeps Inductor's own LayerNorm loop")


def layer_norm_quantize_build_error() -> str | None:
    """Why the kernel does not compile here (one line), or None once it has."""
    try:
        _kernel()
    except RuntimeError as e:
        return str(e)
    return None


def unsupported_inputs(x: torch.Tensor, normalized_shape: list[int] | tuple[int, ...], weight: torch.Tensor | None,
                       bias: torch.Tensor | None, quant_min: int, quant_max: int) -> str | None:
    """Why `layer_norm_quantize` does not take these (one line), or None when it does: a CPU fp32 or bf16 tensor
    normalised over its last dimension alone, weight and bias of that size (or None), a uint8 range in [0, 255]."""
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16):
        return f"layer_norm_quantize takes a CPU fp32 or bf16 tensor; got {x.dtype} on {x.device}"
    if x.dim() < 1 or len(normalized_shape) != 1 or int(normalized_shape[0]) != x.shape[-1] or x.shape[-1] < 1:
        return (f"layer_norm_quantize normalises over the last dimension alone; got normalized_shape "
                f"{list(normalized_shape)} for a tensor of shape {tuple(x.shape)}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and (p.dim() != 1 or p.shape[0] != x.shape[-1] or p.device.type != "cpu"):
            return f"layer_norm_quantize needs a CPU {name} of shape ({x.shape[-1]},); got {tuple(p.shape)}"
    if not 0 <= quant_min <= quant_max <= 255:
        return f"layer_norm_quantize writes uint8 codes: quant range [{quant_min}, {quant_max}] is not within [0, 255]"
    return None


@torch.library.custom_op("vitlab::layer_norm_quantize", mutates_args=())
def layer_norm_quantize(x: torch.Tensor, normalized_shape: list[int], weight: torch.Tensor | None,
                        bias: torch.Tensor | None, eps: float, scale: float, zero_point: int, quant_min: int,
                        quant_max: int) -> torch.Tensor:
    """quantize_per_tensor(layer_norm(x, normalized_shape, weight, bias, eps), scale, zero_point, quant_min,
    quant_max, uint8) in one pass (module docstring): x (..., C) fp32 or bf16, normalised over C; returns uint8 of
    x's shape, contiguous."""
    reason = unsupported_inputs(x, normalized_shape, weight, bias, quant_min, quant_max)
    if reason:
        raise ValueError(reason)
    if not 0 < scale < math.inf:
        raise ValueError(f"layer_norm_quantize needs a positive, finite scale; got {scale}")
    c = x.shape[-1]
    x = x.contiguous()
    w = torch.ones(c) if weight is None else weight.detach().float().contiguous()
    b = torch.zeros(c) if bias is None else bias.detach().float().contiguous()
    out = torch.empty(x.shape, dtype=torch.uint8)
    rows = x.numel() // c
    if rows == 0:
        return out
    rc = _kernel()(x.data_ptr(), int(x.dtype == torch.bfloat16), w.data_ptr(), b.data_ptr(), out.data_ptr(), rows, c,
                   float(eps), float(1.0 / scale), float(zero_point), float(quant_min), float(quant_max),
                   torch.get_num_threads())
    if rc:
        raise RuntimeError(f"layer_norm_quantize's kernel refused shape {tuple(x.shape)} (code {rc})")
    return out


@layer_norm_quantize.register_fake
def _(x: torch.Tensor, normalized_shape: list[int], weight: torch.Tensor | None, bias: torch.Tensor | None,
      eps: float, scale: float, zero_point: int, quant_min: int, quant_max: int) -> torch.Tensor:
    reason = unsupported_inputs(x, normalized_shape, weight, bias, quant_min, quant_max)
    if reason:
        raise ValueError(reason)
    return torch.empty_like(x, dtype=torch.uint8, memory_format=torch.contiguous_format)
