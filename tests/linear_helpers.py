"""Shared by the tests of vitlab's training-linear contexts (`tests/test_perf_linear.py`, `tests/test_perf_onednn.py`):
operands, gradients against an fp32 reference, a tiny ViT, and one training step with or without a context."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from vitlab.models.config import ViTConfig
from vitlab.models.vit import VisionTransformer

BF16 = torch.bfloat16


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.float() - ref).norm() / ref.norm().clamp_min(1e-12))


def inputs(out_f: int, in_f: int, seed: int = 0):
    """x (3, 50, in): the (B, N, D) tokens of a block; W (out, in), b (out,), and an output gradient dY."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 50, in_f, generator=g)
    w = torch.randn(out_f, in_f, generator=g) / in_f**0.5
    b = torch.randn(out_f, generator=g)
    dy = torch.randn(3, 50, out_f, generator=g)
    return x, w, b, dy


def grads(fn, x, w, b, dy):
    """fn(x, w, b) and the gradients of <fn(x, w, b), dy> with respect to x, w and b."""
    x, w, b = (t.clone().requires_grad_() for t in (x, w, b))
    y = fn(x, w, b)
    y.backward(dy.to(y.dtype))
    return y.detach(), x.grad, w.grad, b.grad


def autocast_linear(x, w, b):
    """What autocast runs for a bf16 training linear: the reference both contexts' forward is held to, bit for bit."""
    with torch.autocast("cpu", dtype=BF16):
        return F.linear(x, w, b)


def check_linear_function(apply: Callable, out_f: int, in_f: int) -> None:
    """`apply(x, w, b)` (a bf16 linear autograd Function) against autocast's linear and fp32: the forward bit for bit
    autocast's (the bias added in the fp32 accumulator before the one rounding, as addmm does), each fp32 gradient as
    close to fp32's as autograd's own bf16 one (bf16 GEMM, fp32 accumulation), with a little slack."""
    x, w, b, dy = inputs(out_f, in_f)
    ref = grads(F.linear, x, w, b, dy)  # fp32
    plain = grads(autocast_linear, x, w, b, dy)
    ours = grads(apply, x, w, b, dy)
    assert ours[0].dtype == plain[0].dtype == BF16
    torch.testing.assert_close(ours[0], plain[0], rtol=0, atol=0)
    for got, theirs, want in zip(ours[1:], plain[1:], ref[1:], strict=True):
        assert got.dtype == want.dtype == torch.float32 and got.shape == want.shape
        assert rel_err(got, want) <= 1.25 * rel_err(theirs, want) + 1e-3, (rel_err(got, want), rel_err(theirs, want))
        assert rel_err(got, want) < 2e-2


def tiny_vit(act: str = "gelu") -> VisionTransformer:
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(embed_dim=32, depth=2, num_heads=2, mlp_dim=64, img_size=16, patch_size=4,
                                        num_classes=5, act=act))
    torch.nn.init.normal_(model.head.weight, std=0.1)  # the zero-initialised head would leave the blocks no gradient
    return model


def step_grads(model, x, y, *, context: Callable[[], contextlib.AbstractContextManager] | None, compiled: bool
               ) -> tuple[float, dict[str, torch.Tensor], list[str]]:
    """One bf16 forward + backward of a copy of `model` (compiled or eager) inside `context()` (None: none): the
    loss, every parameter's gradient, and the names of the ops the profiler saw."""
    model = copy.deepcopy(model)
    net = torch.compile(model, fullgraph=True) if compiled else model
    ctx = context() if context is not None else contextlib.nullcontext()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with torch.autocast("cpu", dtype=BF16), ctx:
            loss = F.cross_entropy(net(x).float(), y)
        loss.backward()
    ops = [e.key for e in prof.key_averages()]
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}, ops


def fp32_grads(model, x, y) -> dict[str, torch.Tensor]:
    """The fp32 eager gradients of the same step: the reference for the bf16 ones."""
    with torch.autocast("cpu", enabled=False):
        ref = copy.deepcopy(model)
        F.cross_entropy(ref(x), y).backward()
    return {n: p.grad for n, p in ref.named_parameters()}
