"""LayerNorm and the per-tensor uint8 quantise after it in one pass, for x86 CPUs with AVX-512:
`vitlab::layer_norm_quantized`, the input of a static int8 linear layer (`vitlab.deploy.quant`).

In a static int8 ViT every block starts twice with LayerNorm -> quantise -> int8 GEMM (before qkv and before fc1).
Inductor compiles the first two into one loop that reads each row three times (mean, variance, normalise), with a
barrier between the passes: ViT-B/16 at batch 8 (1576 rows of 768), 0.41-0.49 ms a call on a 2-core Zen 4 against
0.20 ms for this kernel, which reads a row once and keeps it in L1 for the other passes (layernorm_quant.cpp beside
this file; built and registered as the op's CPU kernel by `vitlab.perf.native`). Same arithmetic as Inductor's
(two-step variance; `quantize_per_tensor`'s round half to even and clamp), so the codes are the same but for a
rounding tie now and then.
"""

from __future__ import annotations

import math

import torch

from . import cpu, native

__all__ = ["REQUIRED_FLAGS", "layer_norm_quantized", "layer_norm_quantized_unavailable", "unsupported_inputs"]

REQUIRED_FLAGS = ("avx512f", "avx512bw", "avx512dq", "avx512vl")  # what the kernel's code uses
_SOURCE = "layernorm_quant.cpp"

LAYER_NORM_QUANTIZED = native.define_op(_SOURCE, "layer_norm_quantized(Tensor x, Tensor weight, Tensor bias, "
                                       "float eps, float out_scale, int out_zero_point) -> Tensor")


def _cpu_lacks() -> str | None:
    """Why this CPU cannot execute the kernel's instructions (one line), or None."""
    return cpu.lacking(REQUIRED_FLAGS, "layer_norm_quantized needs AVX-512")


def layer_norm_quantized_unavailable() -> str | None:
    """Why the kernel cannot run here (one line: the CPU lacks AVX-512, or the kernel does not build), or None."""
    return _cpu_lacks() or native.build_error(_SOURCE)


def unsupported_inputs(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> str | None:
    """Why `layer_norm_quantized` does not take these (one line), or None: x fp32 or bf16 with a last dimension D,
    weight and bias fp32 of shape (D,), all on the CPU."""
    if x.dim() < 1 or x.shape[-1] < 1:
        return f"layer_norm_quantized normalises x's last dimension; got shape {tuple(x.shape)}"
    if x.dtype not in (torch.float32, torch.bfloat16):
        return f"layer_norm_quantized takes fp32 or bf16 x; got {x.dtype}"
    d = x.shape[-1]
    if weight.shape != (d,) or bias.shape != (d,) or weight.dtype != torch.float32 or bias.dtype != torch.float32:
        return (f"layer_norm_quantized needs fp32 weight and bias of shape ({d},); got {weight.dtype} "
                f"{tuple(weight.shape)}, {bias.dtype} {tuple(bias.shape)}")
    if not all(t.device.type == "cpu" for t in (x, weight, bias)):
        return f"layer_norm_quantized runs on the CPU; got {x.device}, {weight.device}, {bias.device}"
    return None


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, out_scale: float,
           out_zero_point: int) -> None:
    reason = unsupported_inputs(x, weight, bias)
    if reason:
        raise ValueError(reason)
    if not 0 < out_scale < math.inf or not 0 <= out_zero_point <= 255 or not eps >= 0:
        raise ValueError(f"layer_norm_quantized writes uint8 codes: needs a positive, finite scale, a zero point in "
                         f"[0, 255] and eps >= 0; got scale {out_scale}, zero point {out_zero_point}, eps {eps}")


def layer_norm_quantized(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, out_scale: float,
                         out_zero_point: int) -> torch.Tensor:
    """`quantize_per_tensor(layer_norm(x, (D,), weight, bias, eps), out_scale, out_zero_point, 0, 255, uint8)` in
    one pass: uint8 codes of x's shape (round half to even, clamped to [0, 255]; a row with a NaN or an infinity
    gives 0s). The op `torch.ops.vitlab.layer_norm_quantized`.

    Raises:
        ValueError: inputs it does not take (`unsupported_inputs`), a bad scale, zero point or eps.
        RuntimeError: a CPU without AVX-512, or a kernel that does not build here.
    """
    _check(x, weight, bias, eps, out_scale, out_zero_point)
    lacks = _cpu_lacks()
    if lacks:
        raise RuntimeError(lacks)
    return LAYER_NORM_QUANTIZED(x, weight, bias, eps, out_scale, out_zero_point)  # type: ignore[no-any-return]


@torch.library.register_fake("vitlab::layer_norm_quantized")
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, out_scale: float,
      out_zero_point: int) -> torch.Tensor:
    _check(x, weight, bias, eps, out_scale, out_zero_point)
    return x.new_empty(x.shape, dtype=torch.uint8)
