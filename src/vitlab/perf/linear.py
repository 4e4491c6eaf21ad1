"""Linear layers' weight gradients with both GEMM operands row-major: bf16 training on AMX CPUs.

Autograd's linear backward computes the weight gradient as dW = dY^T X (dY: (M, out), X: (M, in), M = batch x
tokens). Both come row-major, so oneDNN gets dY^T with its reduction axis M strided (layout "ba"). On AMX its
matmul reorders such a source before the tiles can use it, and ViT-S/16's four weight-gradient GEMMs per block ran
at about half the speed of the forward GEMMs of the same size (ONEDNN_VERBOSE, one core: 1536x6304 @ 6304x384 in
13 ms with the source "ba", 6 ms with it "ab"); they were a quarter of the whole training step.

`rowmajor_weight_grads()` is a context (a torch function mode) that routes `F.linear` in a bf16 autocast region
through `RowMajorLinear`: the same forward, and a backward that hands the GEMM the smaller of dY^T and X^T as a
row-major copy (`vitlab::mm_rowmajor`, whose inputs torch.compile must materialize as traced, so the transposed
copy is written by the fused kernel that produces it). dX is computed as before. The results are the same bf16
GEMMs with fp32 accumulation as autocast's; only operand layouts differ. Without AMX (AVX-512 bf16, AVX2, GPUs)
the layout did not matter (ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16: within noise) and the context does nothing.
It acts only while torch.compile traces: eager, the transposed copies (torch's own transpose) cost what the GEMMs
save (ViT-S/16 eager: 0.99x), so eager steps keep autograd's linear as it is.

`VITLAB_ROWMAJOR_GRADS` overrides the choice: `auto` (the default: AMX only), `on` (any CPU, bf16; e.g. to measure
it on an AVX-512 bf16 host such as Zen 4, where it has not been measured), `off`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .cpu import amx_kernels
from .precision import resolve_precision


@torch.library.custom_op("vitlab::mm_rowmajor", mutates_args=(), tags=(torch.Tag.needs_fixed_stride_order,))
def mm_rowmajor(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with both operands row-major (copied if they are not; under torch.compile they arrive as traced)."""
    return torch.mm(a.contiguous(), b.contiguous())


@mm_rowmajor.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"mm_rowmajor: shapes {tuple(a.shape)} and {tuple(b.shape)} do not multiply")
    return a.new_empty(a.shape[0], b.shape[1])


def _mm_rowmajor_backward(ctx, grad):  # (M, N) -> (M, K), (K, N): so it stays differentiable
    a, b = ctx.saved_tensors
    return grad @ b.t(), a.t() @ grad


def _mm_rowmajor_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


mm_rowmajor.register_autograd(_mm_rowmajor_backward, setup_context=_mm_rowmajor_setup)


class RowMajorLinear(torch.autograd.Function):
    """y = x W^T + b in the autocast dtype; backward: dX = dY W, dW from row-major operands, db = sum(dY)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
        x2, w = save_linear_operands(ctx, x, weight, dtype)
        with torch.autocast("cpu", enabled=False):
            # (M, out); with the bias, addmm as autocast runs it (the bias added before the one rounding to dtype)
            out = torch.mm(x2, w.t()) if bias is None else torch.addmm(bias.to(dtype), x2, w.t())
        return out.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        return linear_backward(ctx, dy, _rowmajor_weight_grad)


def _rowmajor_weight_grad(dy2: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """dW (out, in) = dY^T X with both GEMM operands row-major: the smaller of X^T and dY^T is the copy."""
    out_f, in_f = dy2.shape[1], x2.shape[1]
    if in_f <= out_f:  # transpose the smaller operand: X^T (in, M) @ dY (M, out) = dW^T
        return mm_rowmajor(x2.t().contiguous(), dy2.contiguous()).t()
    return mm_rowmajor(dy2.t().contiguous(), x2.contiguous())  # dY^T (out, M) @ X (M, in) = dW


def save_linear_operands(ctx, x: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype):
    """A linear Function's forward operands as its GEMM takes them, x as (M, in) and the weight (out, in), both in
    `dtype`; saved on `ctx` for `linear_backward`."""
    with torch.autocast("cpu", enabled=False):
        x2 = x.reshape(-1, x.shape[-1]).to(dtype)  # (M, in)
        w = weight.to(dtype)  # (out, in)
    ctx.save_for_backward(x2, w)
    ctx.x_shape = x.shape
    return x2, w


def linear_backward(ctx, dy: torch.Tensor, weight_grad: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    """The gradients of y = x W^T + b for a Function whose forward called `save_linear_operands`: dX = dY W,
    dW = `weight_grad(dY, X)` (both (M, .) in the GEMM dtype), db = sum(dY) in fp32; None for what needs none."""
    x2, w = ctx.saved_tensors
    dy2 = dy.reshape(-1, dy.shape[-1]).to(w.dtype)  # (M, out)
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    dx = torch.mm(dy2, w).reshape(ctx.x_shape) if need_x else None  # (..., in); autograd casts to x's dtype
    dw = weight_grad(dy2, x2) if need_w else None  # (out, in)
    db = dy2.sum(0, dtype=torch.float32) if need_b else None  # a missing bias needs no gradient
    return dx, dw, db, None


def linear_operands(args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
    """The (x, weight, bias) of an `F.linear(*args, **kwargs)` call that a gradient-routing context may take over:
    plain CPU tensors (not DTensors or other subclasses), x with a batch axis, a 2-D weight, a gradient wanted by x
    or the weight. None for any other call (it runs as it is)."""
    x = args[0] if args else kwargs.get("input")
    weight = args[1] if len(args) > 1 else kwargs.get("weight")
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    if not (plain_tensor(x) and plain_tensor(weight) and (bias is None or plain_tensor(bias))):
        return None
    x, weight = cast(torch.Tensor, x), cast(torch.Tensor, weight)
    if x.device.type == "cpu" and x.ndim >= 2 and weight.ndim == 2 and (x.requires_grad or weight.requires_grad):
        return x, weight, bias
    return None


def traced_bf16_linear(args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
    """The (x, weight, bias) of an `F.linear(*args, **kwargs)` call that vitlab's training contexts may route:
    torch.compile tracing, gradients on, bf16 CPU autocast, and the operands `linear_operands` takes. None for any
    other call (it runs as it is)."""
    return linear_operands(args, kwargs) if tracing_bf16_training() else None


def tracing_bf16_training() -> bool:
    """torch.compile is tracing a region with gradients on under bf16 CPU autocast: where the contexts act."""
    return (torch.compiler.is_compiling() and torch.is_grad_enabled() and torch.is_autocast_enabled("cpu")
            and torch.get_autocast_dtype("cpu") == torch.bfloat16)


def plain_tensor(t: object) -> bool:
    """A torch.Tensor or Parameter itself, not a subclass (DTensor, FakeTensor wrappers...): what the contexts route."""
    return type(t) in (torch.Tensor, torch.nn.Parameter)


class _RowMajorMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and (operands := traced_bf16_linear(args, kwargs)) is not None:
            return RowMajorLinear.apply(*operands, torch.bfloat16)
        return func(*args, **kwargs)


ENV = "VITLAB_ROWMAJOR_GRADS"
CHOICES = ("auto", "on", "off")


def rowmajor_wanted(device: torch.device | str, precision: str) -> bool:
    """Whether `rowmajor_weight_grads` acts: bf16 ("auto" as `resolve_precision` says) on a CPU whose AMX tiles
    run in this process (`vitlab.perf.cpu.amx_kernels`); `VITLAB_ROWMAJOR_GRADS=on|off` overrides the AMX condition
    (a CPU and bf16 stay required)."""
    choice = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ValueError(f"{ENV}={os.environ[ENV]!r} is not one of {', '.join(CHOICES)}")
    device = torch.device(device)
    if choice == "off" or device.type != "cpu" or resolve_precision(precision, device) != "bf16":
        return False
    return choice == "on" or amx_kernels()


def rowmajor_weight_grads(device: torch.device | str, precision: str) -> contextlib.AbstractContextManager:
    """The context for a training forward pass: row-major weight-gradient GEMMs where that is faster (AMX, bf16,
    compiled), else a no-op. Forward results are unchanged; the model is not modified."""
    return _RowMajorMode() if rowmajor_wanted(device, precision) else contextlib.nullcontext()
