"""Fused int8 attention, softmax(scale * q k^T) v, for x86 CPUs with AVX512-VNNI: `vitlab::int8_attention`.

Static int8 (`vitlab.deploy.quant`) runs every linear layer in int8, but attention's two batched GEMMs have no int8
kernel in torch (Inductor lowers a quantised `matmul` to dequantise + fp32 `bmm`; `torch._int_mm` is 2-D only, and
one call per head is no faster than oneDNN's bf16 `bmm`). This op is one: a C++ kernel (int8_attention.cpp beside
this file, compiled on first use by Inductor's C++ builder, cached on disk as Inductor caches its own kernels, and
registered with torch as the op's CPU kernel: `vitlab.perf.native`) that takes each (image, head) through, in L1/L2:

1. q and k quantised to int8 per row (per token), v per column (per head channel), symmetric, round half to even;
2. S = q8 k8^T with VPDPBUSD (u8 x s8 -> s32; q shifted to uint8, the shift taken back out exactly), rescaled to
   fp32 by the row and column steps and `scale`;
3. softmax in fp32, the probabilities over the row's largest stored as uint8 (step 1/255: the largest is 255);
4. out = p8 v8 with VPDPBUSD, rescaled by the column steps of v and 1 / the row's sum of probabilities, written
   in the inputs' dtype (fp32 or bf16) straight into (B, N, H, D) memory: the `transpose(1, 2).reshape(B, N, H*D)`
   after attention is then free. `int8_attention_quantized` writes instead the uint8 codes the output projection's
   int8 GEMM reads (its input's static scale and zero point), so the graph needs no loop to quantise them.

q, k, v may be strided views (the `permute` of a fused qkv projection: no copy is made); only their last dimension
must be contiguous. Non-finite inputs give non-finite outputs where they reach (a row of q, a column of k: that
row's scores; a column of v: that output channel). Error against fp32 attention: ~1-2% relative (rms), against
bf16 attention's ~0.2-0.5%; what matters, top-1 agreement of a trained model with fp32, is measured in docs/speed.md.
"""

from __future__ import annotations

import math

import torch

from . import cpu, native

__all__ = ["REQUIRED_FLAGS", "int8_attention", "int8_attention_build_error", "int8_attention_quantized",
           "int8_attention_unavailable", "unsupported_inputs"]

REQUIRED_FLAGS = ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni")  # what the kernel's code uses
# kernel-emulation values (`vitlab.perf.cpu.kernel_emulation`) that hold a process below AVX512-VNNI: torch's own
# kernels (ATEN_CPU_CAPABILITY) and oneDNN's (ONEDNN_MAX_CPU_ISA, whose ISAs from AVX512_CORE_VNNI up all have it)
_BELOW_VNNI = {"ATEN_CPU_CAPABILITY": ("default", "avx2"),
               "ONEDNN_MAX_CPU_ISA": ("sse41", "avx", "avx2", "avx2_vnni", "avx2_vnni_2", "avx512_core")}
_SOURCE = "int8_attention.cpp"  # the kernel, and its registration as the CPU kernels of the ops below


def _cpu_lacks() -> str | None:
    """Why this CPU cannot execute the kernel's instructions (one line), or None."""
    return cpu.lacking(REQUIRED_FLAGS, "int8 attention needs AVX512-VNNI")


def int8_attention_unavailable() -> str | None:
    """Why `int8_attention` cannot run here (one line), or None when it can: the CPU lacks one of `REQUIRED_FLAGS`,
    or a kernel-emulation variable (`vitlab.perf.cpu.kernel_emulation`) holds this process to a CPU without
    AVX512-VNNI (e.g. `ONEDNN_MAX_CPU_ISA=AVX2`): the kernel would run what that CPU cannot. What `quantize_static`
    plans with; the ops themselves check only the CPU (`_cpu_lacks` in Python, cpuid in the C++ kernel)."""
    lacks = _cpu_lacks()
    if lacks:
        return lacks
    held = {k: v for k, v in cpu.kernel_emulation().items() if v.lower() in _BELOW_VNNI.get(k, ())}
    if held:
        return "int8 attention needs AVX512-VNNI kernels; " + " ".join(f"{k}={v}" for k, v in held.items()) + \
            " holds this process to a lesser CPU's"
    return None


def int8_attention_build_error() -> str | None:
    """Why the kernel does not compile here (one line), or None once it has (compiled on first use: ~10 s, then
    cached on disk by Inductor; `vitlab.perf.native`)."""
    error = native.build_error(_SOURCE)
    return f"{error}; attention='bf16-math' avoids it" if error else None


def unsupported_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """Why `int8_attention` does not take these q, k, v (one line), or None when it does: (B, heads, N, head_dim)
    CPU tensors of one shape and one dtype (fp32 or bf16), the head dimension a multiple of 16 in [16, 256]."""
    if not (q.dim() == k.dim() == v.dim() == 4):
        return (f"int8_attention takes (B, heads, N, head_dim) q, k, v; got shapes {tuple(q.shape)}, "
                f"{tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.shape == k.shape == v.shape):
        return (f"int8_attention needs q, k, v of one shape (no cross-attention, no grouped heads); got "
                f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float32, torch.bfloat16):
        return f"int8_attention takes fp32 or bf16 q, k, v of one dtype; got {q.dtype}, {k.dtype}, {v.dtype}"
    if not all(t.device.type == "cpu" for t in (q, k, v)):
        return f"int8_attention runs on the CPU; got {q.device}, {k.device}, {v.device}"
    d = q.shape[-1]
    if d % 16 or not 16 <= d <= 256:
        return f"int8_attention needs a head dimension that is a multiple of 16 in [16, 256]; got {d}"
    return None


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    reason = unsupported_inputs(q, k, v)
    if reason:
        raise ValueError(reason)


# The ops: their C++ kernels (int8_attention.cpp, registered for the CPU when `native.load` loads it) are what a
# compiled graph calls, with no Python on the way; the functions below are the Python entry points, which check
# their inputs first (ValueErrors naming the problem; the C++ kernel checks the same, as RuntimeErrors).
INT8_ATTENTION = native.define_op(_SOURCE, "int8_attention(Tensor q, Tensor k, Tensor v, float scale) -> Tensor")
INT8_ATTENTION_QUANTIZED = native.define_op(_SOURCE, "int8_attention_quantized(Tensor q, Tensor k, Tensor v, "
                                            "float scale, float out_scale, int out_zero_point) -> Tensor")


def _check_cpu() -> None:
    reason = _cpu_lacks()
    if reason:
        raise RuntimeError(reason)


def int8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(scale * q k^T) v in int8 (module docstring): q, k, v (B, heads, N, head_dim), fp32 or bf16, the
    last dimension contiguous (else copied); returns (B, heads, N, head_dim) in their dtype, laid out as
    (B, N, heads, head_dim) in memory. The op `torch.ops.vitlab.int8_attention`.

    Raises:
        ValueError: inputs it does not take (`unsupported_inputs`). RuntimeError: a CPU without AVX512-VNNI, or a
            kernel that does not build here.
    """
    _check(q, k, v)
    _check_cpu()
    return INT8_ATTENTION(q, k, v, scale)  # type: ignore[no-any-return]


@torch.library.register_fake("vitlab::int8_attention")
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    _check(q, k, v)
    b, h, n, d = q.shape
    return q.new_empty((b, n, h, d)).permute(0, 2, 1, 3)


def _check_out_quant(out_scale: float, out_zero_point: int) -> None:
    if not 0 < out_scale < math.inf or not 0 <= out_zero_point <= 255:
        raise ValueError(f"int8_attention_quantized writes uint8 codes: needs a positive, finite scale and a zero "
                         f"point in [0, 255]; got {out_scale}, {out_zero_point}")


def int8_attention_quantized(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, out_scale: float,
                             out_zero_point: int) -> torch.Tensor:
    """`int8_attention` with its output quantised for the int8 GEMM after it: `quantize_per_tensor(out, out_scale,
    out_zero_point, 0, 255, torch.uint8)` of the fp32 result (round half to even, clamped to [0, 255]; NaN gives
    0), written as uint8 (B, heads, N, head_dim) over (B, N, heads, head_dim) memory. One pass less over the
    output, and a quarter of the bytes fp32 would write. The op `torch.ops.vitlab.int8_attention_quantized`."""
    _check_out_quant(out_scale, out_zero_point)
    _check(q, k, v)
    _check_cpu()
    return INT8_ATTENTION_QUANTIZED(q, k, v, scale, out_scale, out_zero_point)  # type: ignore[no-any-return]


@torch.library.register_fake("vitlab::int8_attention_quantized")
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, out_scale: float,
      out_zero_point: int) -> torch.Tensor:
    _check(q, k, v)
    _check_out_quant(out_scale, out_zero_point)
    b, h, n, d = q.shape
    return q.new_empty((b, n, h, d), dtype=torch.uint8).permute(0, 2, 1, 3)
