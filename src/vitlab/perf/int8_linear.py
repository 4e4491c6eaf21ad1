"""Static int8 linear layers for x86 CPUs with AVX512-VNNI: `vitlab::int8_linear`, uint8 activation codes times an
int8 weight packed once, with the epilogue a ViT needs in the same pass (`vitlab.deploy.quant`, `gemm=`).

    packed = pack(w_int8, w_scale, x_scale, x_zero_point, bias)      # once per layer (the weight's constants)
    y = int8_linear(x_codes, packed)                                 # (..., N) fp32
    y = int8_linear(x_codes, packed, residual=r)                     # + r (fp32), the residual stream
    c = int8_linear(x_codes, packed, gelu=True, out_dtype=torch.uint8, out_scale=s, out_zero_point=z)

y = (x w^T - zp_x sum_k w) * (s_x s_w[n]) + bias, exactly in int32 before the scale. Why vitlab has its own: on a
2-core Zen 4 (AVX512-VNNI, no AMX) the GEMMs are ~85% of a static int8 ViT-B/16's time, and oneDNN's
`qlinear_pointwise` runs them at 65-78% of the CPU's VPDPBUSD rate; this kernel's 6 x 64 register tile, with the
weight packed in panels of 64 columns the way VPDPBUSD reads them, at 85-95% (docs/speed.md, "int8 GEMMs").
The C++ kernel is int8_linear.cpp beside this file (built and registered by `vitlab.perf.native`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from . import cpu, native

__all__ = ["PANEL", "REQUIRED_FLAGS", "PackedLinear", "int8_linear", "int8_linear_unavailable", "pack",
           "unsupported_weight"]

REQUIRED_FLAGS = ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni")  # what the kernel's code uses
PANEL = 64  # output columns per packed panel: N must be a multiple of it
OUT_DTYPES = (torch.float32, torch.bfloat16, torch.uint8)
_SOURCE = "int8_linear.cpp"

INT8_LINEAR = native.define_op(_SOURCE, "int8_linear(Tensor x, Tensor w_packed, Tensor zc, Tensor scale, "
                              "Tensor bias, Tensor? residual, bool gelu, ScalarType out_dtype, float out_scale, "
                              "int out_zero_point) -> Tensor")


class PackedLinear(NamedTuple):
    """A linear layer's constants as the kernel reads them (`pack`)."""

    weight: torch.Tensor  # int8 (N/64, K/4, 64, 4): panels of 64 output columns, 4 consecutive k per column
    zc: torch.Tensor  # int32 (N,): x's zero point * sum_k w[n, k]
    scale: torch.Tensor  # fp32 (N,): s_x * s_w[n]
    bias: torch.Tensor  # fp32 (N,)

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[1]) * 4

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0]) * PANEL


def _cpu_lacks() -> str | None:
    """Why this CPU cannot execute the kernel's instructions (one line), or None."""
    return cpu.lacking(REQUIRED_FLAGS, "int8_linear needs AVX512-VNNI")


def int8_linear_unavailable() -> str | None:
    """Why the kernel cannot run here (one line: the CPU lacks AVX512-VNNI, or the kernel does not build), or None."""
    return _cpu_lacks() or native.build_error(_SOURCE)


def unsupported_weight(weight: torch.Tensor) -> str | None:
    """Why `pack` does not take this weight (one line), or None: int8 (N, K) with N a multiple of 64 and K of 4."""
    if weight.dtype != torch.int8 or weight.dim() != 2:
        return f"int8_linear packs an int8 (out, in) weight; got {weight.dtype} {tuple(weight.shape)}"
    n, k = weight.shape
    if n % PANEL or k % 4 or n == 0 or k == 0:
        return f"int8_linear needs out features a multiple of {PANEL} and in features of 4; got ({n}, {k})"
    if weight.device.type != "cpu":
        return f"int8_linear runs on the CPU; the weight is on {weight.device}"
    return None


def pack(weight: torch.Tensor, w_scale: torch.Tensor, x_scale: float, x_zero_point: int,
         bias: torch.Tensor | None = None) -> PackedLinear:
    """The kernel's constants for a linear layer with int8 `weight` (N, K) quantised per output channel (symmetric,
    steps `w_scale` (N,)) reading uint8 codes of step `x_scale` and zero point `x_zero_point`.

    Raises:
        ValueError: a weight the kernel does not take (`unsupported_weight`), or bad scales, zero point or bias.
    """
    reason = unsupported_weight(weight)
    if reason:
        raise ValueError(reason)
    n, k = weight.shape
    if w_scale.shape != (n,) or not bool(torch.isfinite(w_scale).all()) or not bool((w_scale > 0).all()):
        raise ValueError(f"int8_linear needs {n} positive, finite weight scales; got shape {tuple(w_scale.shape)}")
    if not 0 < x_scale < math.inf or not 0 <= x_zero_point <= 255:
        raise ValueError(f"int8_linear reads uint8 codes: needs a positive, finite x_scale and a zero point in "
                         f"[0, 255]; got {x_scale}, {x_zero_point}")
    if bias is not None and (bias.shape != (n,) or not bias.is_floating_point()):
        raise ValueError(f"int8_linear needs a floating-point bias of shape ({n},); got {bias.dtype} "
                         f"{tuple(bias.shape)}")
    panels = weight.reshape(n // PANEL, PANEL, k // 4, 4).permute(0, 2, 1, 3).contiguous()  # (N/64, K/4, 64, 4)
    zc = (weight.sum(1, dtype=torch.int64) * int(x_zero_point)).to(torch.int32)  # |.| <= 255 * 128 * K: int32
    scale = (w_scale.double() * float(x_scale)).float()
    b = torch.zeros(n) if bias is None else bias.detach().float()
    return PackedLinear(panels, zc, scale.contiguous(), b.contiguous())


def _check(x: torch.Tensor, packed: PackedLinear, residual: torch.Tensor | None, out_dtype: torch.dtype,
           out_scale: float, out_zero_point: int) -> None:
    if x.dtype != torch.uint8 or x.dim() < 1:
        raise ValueError(f"int8_linear takes uint8 codes x (..., K); got {x.dtype} {tuple(x.shape)}")
    if x.shape[-1] != packed.in_features:
        raise ValueError(f"int8_linear: x's last dimension {x.shape[-1]} is not the weight's {packed.in_features}")
    n = packed.out_features
    if packed.weight.dtype != torch.int8 or packed.weight.dim() != 4 or tuple(packed.weight.shape[2:]) != (PANEL, 4) \
            or packed.zc.dtype != torch.int32 or any(t.dtype != torch.float32 for t in (packed.scale, packed.bias)) \
            or any(tuple(t.shape) != (n,) for t in (packed.zc, packed.scale, packed.bias)):
        raise ValueError("int8_linear takes the constants `pack` makes: int8 (N/64, K/4, 64, 4) weight, int32 zc and "
                         "fp32 scale and bias of shape (N,)")
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"int8_linear writes fp32, bf16 or uint8 codes; got out_dtype {out_dtype}")
    if out_dtype == torch.uint8 and not (0 < out_scale < math.inf and 0 <= out_zero_point <= 255):
        raise ValueError(f"int8_linear writing uint8 codes needs a positive, finite out_scale and a zero point in "
                         f"[0, 255]; got {out_scale}, {out_zero_point}")
    shape = (*x.shape[:-1], packed.out_features)
    if residual is not None and (residual.dtype != torch.float32 or tuple(residual.shape) != shape):
        raise ValueError(f"int8_linear's residual must be fp32 of the output's shape {shape}; got {residual.dtype} "
                         f"{tuple(residual.shape)}")
    devices = {str(t.device) for t in (x, *packed, *([residual] if residual is not None else []))}
    if devices != {"cpu"}:
        raise ValueError(f"int8_linear runs on the CPU; got tensors on {', '.join(sorted(devices))}")


def int8_linear(x: torch.Tensor, packed: PackedLinear, residual: torch.Tensor | None = None, *, gelu: bool = False,
                out_dtype: torch.dtype = torch.float32, out_scale: float = 1.0,
                out_zero_point: int = 0) -> torch.Tensor:
    """The linear layer `packed` on uint8 codes `x` (..., K): (..., N) in `out_dtype` (fp32, bf16, or uint8 codes
    clamp(round_half_even(y / out_scale) + out_zero_point, 0, 255)), after the erf GELU if `gelu` and + `residual`
    (fp32, the output's shape) if given. The op `torch.ops.vitlab.int8_linear`.

    Raises:
        ValueError: inputs it does not take (dtype, shapes, device, out scale or zero point).
        RuntimeError: a CPU without AVX512-VNNI, or a kernel that does not build here.
    """
    _check(x, packed, residual, out_dtype, out_scale, out_zero_point)
    lacks = _cpu_lacks()
    if lacks:
        raise RuntimeError(lacks)
    return INT8_LINEAR(x, packed.weight, packed.zc, packed.scale, packed.bias, residual, gelu,  # type: ignore[no-any-return]
                       out_dtype, out_scale, out_zero_point)


@torch.library.register_fake("vitlab::int8_linear")
def _(x: torch.Tensor, w_packed: torch.Tensor, zc: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor,
      residual: torch.Tensor | None, gelu: bool, out_dtype: torch.dtype, out_scale: float,
      out_zero_point: int) -> torch.Tensor:
    _check(x, PackedLinear(w_packed, zc, scale, bias), residual, out_dtype, out_scale, out_zero_point)
    return x.new_empty((*x.shape[:-1], w_packed.shape[0] * PANEL), dtype=out_dtype)
