"""int8 training of the linear layers (`train.int8: true`): SwitchBack, for CPUs whose int8 GEMMs outrun bf16.

Wortsman et al., "Stable and low-precision training for large-scale vision-language models" (NeurIPS 2023) train
CLIP ViTs with SwitchBack linear layers: the forward GEMM y = x W^T and the input-gradient GEMM dX = dY W in int8,
the weight-gradient GEMM dW = dY^T X in 16 bits. The first two reduce over a layer's width (a few hundred to a few
thousand terms), where rounding each operand to 8 bits with its own scale costs little; the weight gradient
reduces over every token of the batch (6,304 for ViT-S/16 batch 32), so it keeps the higher precision.

What `Int8Linear` computes, for x (M, in), W (out, in) and a bias:
- forward: x quantised per row (each token its own scale, absmax / 127, symmetric, round to nearest), W per output
  channel, the int8 x int8 -> int32 GEMM (`torch._int_mm`), then y = acc * s_x * s_W + b in the compute dtype;
- backward: dX from dY per row and W per *input* channel (the GEMM's outer axes, so each scale factors out of
  the sum), again int8 -> int32; dW = dY^T X in the compute dtype from the unquantised operands (x as the forward
  saw it), fp32 for the master weights; db = sum(dY) in fp32.
The compute dtype is the autocast dtype (bf16) inside `train.precision: bf16`, else fp32. Weights, optimizer state
and everything that is not a linear layer (attention's two batched GEMMs, the patch embedding's convolution,
LayerNorm, softmax) run as they would without it.

Why: on a CPU with AVX-512 VNNI the int8 GEMM does four multiply-adds per lane where bf16 does two
(`vpdpbusd` / `vdpbf16ps`): on a 2-core Zen 4, 800-870 GFLOP/s int8 against 390-420 bf16 for ViT-S/16's layer
shapes. Quantising and dequantising are element-wise passes that torch.compile fuses into the neighbouring
LayerNorm, GELU and residual kernels; eager they are separate passes and cost what the GEMMs save, so use it with
`train.compile: true`. On CPUs without VNNI (AVX2) the int8 GEMM is no faster than fp32: no gain there.

Non-finite numbers stay non-finite: a row holding inf or nan has an inf or nan scale, so its output row is
non-finite too, the loss or gradient norm is, and the step is dropped as usual (`vitlab.train.step`).

`int8_training(device)` is the context (a torch function mode) that routes `F.linear` calls with gradients on
through `Int8Linear`; `vitlab.train.step.train_step(int8=True)` enters it around the forward pass.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .linear import linear_operands

QMAX = 127  # symmetric int8: -127..127 (-128 unused, so negation is exact)
MAX_REDUCTION = (2**31 - 1) // (QMAX * QMAX)  # int32 accumulators cannot overflow below this many terms
_TINY = 1e-30  # an all-zero row's scale: its values quantise to 0 (127 / _TINY is still finite in fp32)


def quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols) -> int8 values and fp32 scales (rows, 1), symmetric per row: t ~= q * scale, |q| <= 127.

    A row holding inf gets an inf scale and one holding nan a nan scale, so whatever its int8 values are, what
    is dequantised from the row is not finite (inf * 0 and nan * anything are nan)."""
    amax = t.detach().abs().amax(dim=1, keepdim=True).float()  # (rows, 1); nan propagates
    q = (t.float() * (QMAX / amax.clamp_min(_TINY))).round().clamp(-QMAX, QMAX)
    return q.to(torch.int8), amax / QMAX


def int8_matmul(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, bias: torch.Tensor | None = None
                ) -> torch.Tensor:
    """a (M, K) @ b (N, K)^T (+ bias (N,)) through int8: a per row, b per row (b's rows are the output columns),
    int32 accumulation, scaled back and the bias added in fp32, the result (M, N) rounded once to `out_dtype`."""
    if a.shape[1] > MAX_REDUCTION:
        raise ValueError(f"int8_matmul: a reduction over {a.shape[1]} terms could overflow int32 (limit "
                         f"{MAX_REDUCTION})")
    qa, sa = quantize_rows(a)
    qb, sb = quantize_rows(b)
    out = torch._int_mm(qa, qb.t()).float() * sa * sb.t()  # (M, N): int32 sums scaled back
    return (out if bias is None else out + bias.float()).to(out_dtype)


class Int8Linear(torch.autograd.Function):
    """y = x W^T + b with the forward and input-gradient GEMMs in int8 and the weight gradient in `dtype`."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
        with torch.autocast(x.device.type, enabled=False):
            # (M, in) in the compute dtype: what the weight gradient multiplies, as autocast's linear saves it, and
            # what is quantised (from bf16 rather than fp32: torch.compile then fuses the cast, the row maxima and
            # the rounding into the kernel that makes x, instead of keeping an fp32 copy; 1.18x against 1.07x
            # for ViT-S/16's compiled step on Zen 4, and bf16's 8 bits of mantissa are finer than int8's 7)
            x2 = x.reshape(-1, x.shape[-1]).to(dtype)
            y = int8_matmul(x2, weight, dtype, bias)  # (M, out); W quantised per output channel
        ctx.save_for_backward(x2, weight)
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        with torch.autocast(dy.device.type, enabled=False):
            dy2 = dy.reshape(-1, dy.shape[-1])  # (M, out)
            dx = dw = db = None
            if need_x:  # dY (M, out) @ W (out, in): W quantised per input channel
                dx = int8_matmul(dy2, weight.t(), x2.dtype).reshape(ctx.x_shape).to(ctx.x_dtype)
            if need_w:  # dW (out, in) = dY^T X, unquantised
                dw = torch.mm(dy2.to(x2.dtype).t(), x2).to(weight.dtype)
            if need_b:
                db = dy2.sum(0, dtype=torch.float32)
        return dx, dw, db, None


def routed_linear(args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None,
                                                      torch.dtype] | None:
    """(x, weight, bias, compute dtype) of an `F.linear(*args, **kwargs)` call that `int8_training` routes: gradients
    on and wanted, plain CPU tensors (not DTensors or other subclasses), x with a batch axis in fp32 or bf16, a 2-D
    weight; the compute dtype is CPU autocast's when it is on, else x's. None for any other call."""
    operands = linear_operands(args, kwargs) if torch.is_grad_enabled() else None
    if operands is None:
        return None
    x, weight, bias = operands
    if weight.shape[1] > MAX_REDUCTION or weight.shape[0] > MAX_REDUCTION:
        return None
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype
    if dtype not in (torch.float32, torch.bfloat16) or not weight.is_floating_point():
        return None
    return x, weight, bias, dtype


class _Int8Mode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and (operands := routed_linear(args, kwargs)) is not None:
            return Int8Linear.apply(*operands)
        return func(*args, **kwargs)


def check_int8_training(device: torch.device | str, *, fsdp: bool = False) -> None:
    """Raise if `train.int8` cannot run as asked: on a device other than a CPU (torch's int8 GEMM on a GPU has other
    shape rules and was not measured; bf16 tensor cores are the fast path there), or under FSDP (`fsdp`: its
    sharded weights are DTensors, which the int8 layers do not take, so the run would silently train without them)."""
    device = torch.device(device)
    if device.type != "cpu":
        raise ValueError(f"train.int8 runs on a CPU; this run's device is {device}: set train.int8 false "
                         "(train.precision bf16 is the fast path on a GPU)")
    if fsdp:
        raise ValueError("train.int8 with parallel: fsdp: FSDP's sharded weights are not routed through the int8 "
                         "layers, so the run would train without them; use parallel: ddp")


def int8_training_caveat(compile: bool, flags: frozenset[str] | set[str] | None = None) -> str | None:
    """Why `train.int8` will likely not be faster on this machine with this setting, in one line, or None: without
    torch.compile (separate quantising passes), or on a CPU whose int8 products are not accumulated natively (no
    VNNI / AMX: `vitlab.perf.cpu.native_int8`)."""
    from .cpu import INT8_FLAGS, native_int8

    if native_int8(flags) is False:
        return (f"train.int8 on a CPU without {' / '.join(INT8_FLAGS)}: its int8 GEMMs are no faster than fp32 "
                "here, so the int8 linear layers cost accuracy for no speed; set train.int8 false")
    if not compile:
        return ("train.int8 without train.compile: eager, the quantising passes run as separate loops and cost "
                "about what the int8 GEMMs save; set train.compile true")
    return None


def int8_training(device: torch.device | str, enabled: bool = True) -> contextlib.AbstractContextManager:
    """The context for a training forward pass: every linear layer with gradients on through `Int8Linear` when
    `enabled` (on a CPU: `check_int8_training`), else a no-op. The model is not modified."""
    if not enabled:
        return contextlib.nullcontext()
    check_int8_training(device)
    return _Int8Mode()
