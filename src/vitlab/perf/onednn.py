"""oneDNN's own linear-with-bias and GELU kernels inside compiled bf16 training, on CPUs with AVX-512 bf16 but no AMX.

torch.compile turns a training step's `F.linear(x, W, b)` into `addmm`, which first copies the broadcast bias into
the output and then accumulates the GEMM onto it, and lowers the exact GELU into its own loop, whose vectorised erf
(a division and an exp per element) runs at about half the speed of oneDNN's GELU. On a 2-core Zen 4 (AVX-512
bf16 + VNNI, no AMX), ViT-S/16 batch 32's fc1: Inductor's addmm 21.2 ms, the same GEMM with the bias as oneDNN's
fused epilogue (`mkldnn::_linear_pointwise`) 18.1 ms, bit for bit the same result; and Inductor's GELU 4.8 ms
forward and 6.5 ms backward per block against oneDNN's 2.4 and 5.0 ms (benchmarks/onednn_kernels.py; docs/speed.md,
"Training speed", runs S and T: 1.03x the compiled step without it).

`onednn_training_kernels()` is a context (a torch function mode, active only while torch.compile traces) that
routes, in a bf16 CPU autocast region with gradients on,
- `F.linear` with a bias through `OneDNNLinear`: forward `mkldnn::_linear_pointwise` (the bias added in the GEMM's
  fp32 accumulator before the one rounding to bf16: bit-identical to autocast's addmm), backward the same three
  GEMMs / sum autograd runs;
- the exact `F.gelu` on bf16 through `vitlab::gelu` (torch's eager GELU, which on these CPUs is oneDNN's, and its
  eager backward), opaque to Inductor, so the GELU's output is kept for the backward instead of recomputed.
Results equal autocast's (linear: exactly; GELU: the kernel eager timm runs).

`VITLAB_ONEDNN_TRAIN` overrides the choice: `auto` (the default: a CPU with native bf16 (avx512_bf16) and no AMX,
where it was measured faster; on AMX `vitlab.perf.linear`'s row-major weight gradients act instead), `on` (any
CPU with oneDNN, bf16), `off`.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .cpu import amx_kernels, bf16_kernels
from .linear import (
    linear_backward,
    plain_tensor,
    rowmajor_wanted,
    save_linear_operands,
    traced_bf16_linear,
    tracing_bf16_training,
)
from .precision import resolve_precision


@torch.library.custom_op("vitlab::gelu", mutates_args=())
def gelu(x: torch.Tensor) -> torch.Tensor:
    """The exact GELU, x * Phi(x), by torch's eager kernel (oneDNN's on x86 for bf16)."""
    return torch.ops.aten.gelu.default(x)


@gelu.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("vitlab::gelu_backward", mutates_args=())
def gelu_backward(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """d GELU(x) / dx * grad, by torch's eager kernel."""
    return torch.ops.aten.gelu_backward.default(grad, x)


@gelu_backward.register_fake
def _(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if grad.shape != x.shape:
        raise ValueError(f"gelu_backward: gradient shape {tuple(grad.shape)} differs from input {tuple(x.shape)}")
    return torch.empty_like(x)


def _gelu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _gelu_grad(ctx, grad):
    (x,) = ctx.saved_tensors
    return gelu_backward(grad, x)


gelu.register_autograd(_gelu_grad, setup_context=_gelu_setup)


@torch.library.custom_op("vitlab::linear_bias", mutates_args=())
def linear_bias(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """x (M, in) @ weight (out, in)^T + bias (out,), the bias in the GEMM's epilogue (oneDNN)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


@linear_bias.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    if x.ndim != 2 or weight.ndim != 2 or x.shape[1] != weight.shape[1] or bias.shape != weight.shape[:1]:
        raise ValueError(f"linear_bias: shapes {tuple(x.shape)}, {tuple(weight.shape)}, {tuple(bias.shape)} "
                         "are not (M, in), (out, in), (out,)")
    return x.new_empty(x.shape[0], weight.shape[0])


class OneDNNLinear(torch.autograd.Function):
    """y = x W^T + b in `dtype` (bf16), the bias fused into oneDNN's GEMM; backward: dX = dY W, dW = dY^T X,
    db = sum(dY) in fp32, as autograd computes them for autocast's linear."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, dtype: torch.dtype):
        x2, w = save_linear_operands(ctx, x, weight, dtype)
        with torch.autocast("cpu", enabled=False):
            out = linear_bias(x2, w, bias.to(dtype))  # (M, out)
        return out.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        return linear_backward(ctx, dy, lambda dy2, x2: torch.mm(dy2.t(), x2))


class _OneDNNMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            operands = traced_bf16_linear(args, kwargs)
            if operands is not None and operands[2] is not None:  # bias-free: autocast's mm is the same GEMM
                return OneDNNLinear.apply(*operands, torch.bfloat16)
        elif func is F.gelu and tracing_bf16_training():
            x = args[0] if args else kwargs.get("input")
            approximate = args[1] if len(args) > 1 else kwargs.get("approximate", "none")
            if plain_tensor(x) and x.device.type == "cpu" and x.dtype == torch.bfloat16 and approximate == "none":
                return gelu(x)
        return func(*args, **kwargs)


ENV = "VITLAB_ONEDNN_TRAIN"
CHOICES = ("auto", "on", "off")


def onednn_wanted(device: torch.device | str, precision: str) -> bool:
    """Whether `onednn_training_kernels` acts: bf16 ("auto" as `resolve_precision` says) on a CPU with oneDNN whose
    bf16 runs natively (`bf16_kernels`) without AMX tiles (`amx_kernels`); `VITLAB_ONEDNN_TRAIN=on|off` overrides
    the CPU condition (a CPU, oneDNN and bf16 stay required)."""
    choice = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ValueError(f"{ENV}={os.environ[ENV]!r} is not one of {', '.join(CHOICES)}")
    device = torch.device(device)
    if choice == "off" or device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if resolve_precision(precision, device) != "bf16" or rowmajor_wanted(device, precision):
        return False  # fp32; or AMX's row-major weight gradients act (one function mode routes F.linear)
    return choice == "on" or (bf16_kernels() and not amx_kernels())


def onednn_training_kernels(device: torch.device | str, precision: str) -> contextlib.AbstractContextManager:
    """The context for a compiled training forward pass: oneDNN's biased GEMM and GELU where they are faster
    (bf16 on AVX-512 bf16 without AMX), else a no-op. Results are unchanged; the model is not modified."""
    return _OneDNNMode() if onednn_wanted(device, precision) else contextlib.nullcontext()
