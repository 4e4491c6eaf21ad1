"""int8 training of the linear layers (`train.int8`, `vitlab.perf.int8_train`): the forward and input-gradient GEMMs
are the closed-form int8 products (per-row symmetric scales, round half to even, int32 sums) written out in numpy
here, the weight gradient is the unquantised GEMM, non-finite numbers stay non-finite so a bad step is still
dropped, and a step (eager and compiled) stays as close to fp32 as the quantisation allows."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile

from vitlab.perf import int8_train
from vitlab.perf.int8_train import Int8Linear, check_int8_training, int8_training, quantize_rows, routed_linear

from .linear_helpers import BF16, fp32_grads, inputs, rel_err, step_grads, tiny_vit


@pytest.fixture(autouse=True)
def fresh_dynamo():
    yield
    torch._dynamo.reset()


def np_quantize(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row int8: q = round_half_even(a * 127 / max|row|), scale = max|row| / 127."""
    amax = np.abs(a).max(axis=1, keepdims=True).astype(np.float64)
    q = np.clip(np.round(a.astype(np.float64) * (127 / np.maximum(amax, 1e-30))), -127, 127).astype(np.int64)
    return q, amax / 127


def np_int8_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a (M, K) @ b (N, K)^T with both quantised per row, summed exactly in int64, scaled back in float64."""
    qa, sa = np_quantize(a)
    qb, sb = np_quantize(b)
    return (qa @ qb.T) * sa * sb.T


def test_quantize_rows_is_symmetric_per_row_absmax():
    g = torch.Generator().manual_seed(0)
    t = torch.randn(5, 40, generator=g) * torch.tensor([1e-3, 1.0, 30.0, 0.0, 1e4])[:, None]
    q, s = quantize_rows(t)
    assert q.dtype == torch.int8 and s.shape == (5, 1) and s.dtype == torch.float32
    want_q, want_s = np_quantize(t.numpy())
    assert np.array_equal(q.numpy(), want_q)
    np.testing.assert_allclose(s.numpy(), want_s, rtol=1e-6)
    assert int(q.abs().max()) == 127 and int(q[3].abs().max()) == 0  # the all-zero row stays zero
    assert (q.float() * s - t).abs().le(s / 2 * 1.0001).all()  # each value within half a step


@pytest.mark.parametrize("out_f,in_f", [(96, 32), (32, 96), (48, 48)])
def test_forward_and_input_gradient_are_the_int8_products(out_f, in_f):
    x, w, b, dy = inputs(out_f, in_f)
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    y = Int8Linear.apply(xg, wg, bg, torch.float32)
    y.backward(dy)
    x2, dy2 = x.reshape(-1, in_f).numpy(), dy.reshape(-1, out_f).numpy()
    want_y = np_int8_matmul(x2, w.numpy()) + b.numpy()
    np.testing.assert_allclose(y.detach().reshape(-1, out_f).numpy(), want_y, rtol=1e-5, atol=1e-5)
    want_dx = np_int8_matmul(dy2, w.numpy().T)  # W per input channel: the rows of W^T
    np.testing.assert_allclose(xg.grad.reshape(-1, in_f).numpy(), want_dx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(wg.grad.numpy(), dy2.T.astype(np.float64) @ x2, rtol=1e-4, atol=1e-4)  # unquantised
    np.testing.assert_allclose(bg.grad.numpy(), dy2.sum(0), rtol=1e-5, atol=1e-5)
    # and the quantisation error is what 8 bits give: ~1% of the fp32 product, not more
    assert rel_err(y.detach(), F.linear(x, w, b)) < 1e-2
    assert rel_err(xg.grad, dy @ w) < 2e-2


def test_bf16_compute_keeps_autocasts_dtypes_and_weight_gradient():
    x, w, b, dy = inputs(64, 32)
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    with torch.autocast("cpu", dtype=BF16), int8_training("cpu"):
        y = F.linear(xg, wg, bg)
    assert y.dtype == BF16
    y.backward(dy.to(BF16))
    assert xg.grad.dtype == wg.grad.dtype == bg.grad.dtype == torch.float32
    # dW: the bf16 GEMM autocast's linear runs, from the same output gradient
    want = torch.mm(dy.reshape(-1, 64).to(BF16).t(), x.reshape(-1, 32).to(BF16)).float()
    torch.testing.assert_close(wg.grad, want, rtol=0, atol=0)
    assert rel_err(y.detach(), F.linear(x, w, b)) < 2e-2


def test_non_finite_rows_stay_non_finite():
    x, w, b, dy = inputs(16, 8)
    x[0, 3, 5] = float("nan")
    x[1, 7, 0] = float("inf")
    xg = x.clone().requires_grad_()
    y = Int8Linear.apply(xg, w, b, torch.float32)
    finite = torch.isfinite(y).all(-1)
    assert not finite[0, 3] and not finite[1, 7] and int(finite.sum()) == finite.numel() - 2
    dy[2, 1, 4] = float("inf")
    y.backward(dy)
    assert not torch.isfinite(xg.grad[2, 1]).all() and torch.isfinite(xg.grad[2, 2]).all()


def test_routes_only_training_linears_on_plain_cpu_tensors(monkeypatch):
    x, w, b, _ = inputs(8, 8)
    xg = x.clone().requires_grad_()
    assert routed_linear((xg, w, b), {}) is not None
    assert routed_linear((x, w, b), {}) is None  # nothing wants a gradient
    with torch.no_grad():
        assert routed_linear((xg, w, b), {}) is None  # evaluation
    assert routed_linear((xg.double(), w.double()), {}) is None  # float64: left exact
    assert routed_linear((), {"input": xg, "weight": w, "bias": None})[3] == torch.float32
    with torch.autocast("cpu", dtype=BF16):
        assert routed_linear((xg, w), {})[3] == BF16
    monkeypatch.setattr(int8_train, "MAX_REDUCTION", 4)  # an int32 sum that could overflow: left as it is
    assert routed_linear((xg, w, b), {}) is None


def test_a_step_is_int8_and_close_to_fp32_eager_and_compiled():
    model = tiny_vit()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 5, (4,), generator=g)
    want = fp32_grads(model, x, y)
    loss_bf16, plain, _ = step_grads(model, x, y, context=None, compiled=False)
    whole = torch.cat([v.flatten() for v in want.values()])
    for compiled in (False, True):
        loss, ours, ops = step_grads(model, x, y, context=lambda: int8_training("cpu"), compiled=compiled)
        assert "aten::_int_mm" in ops, compiled
        assert abs(loss - loss_bf16) < 2e-2 * abs(loss_bf16)
        got = torch.cat([ours[n].flatten() for n in want])
        assert rel_err(got, whole) < 5e-2, compiled  # bf16 autocast alone: ~1e-2
        for n in want:
            assert ours[n] is not None and torch.isfinite(ours[n]).all(), n
    _, _, bf16_ops = step_grads(model, x, y, context=None, compiled=False)
    assert "aten::_int_mm" not in bf16_ops
    plain_all = torch.cat([plain[n].flatten() for n in want])
    assert rel_err(plain_all, whole) < 5e-2  # the bound above is bf16's own order, not a loose one


def test_train_step_int8_trains_and_drops_a_non_finite_step():
    from vitlab.train.step import train_step

    g = torch.Generator().manual_seed(3)
    centers = torch.randn(5, 3, 16, 16, generator=g)  # a learnable problem: a noisy class template per label

    def batch():
        y = torch.randint(0, 5, (16,), generator=g)
        return [(centers[y] + 0.5 * torch.randn(16, 3, 16, 16, generator=g), y)]

    losses = {}
    for int8 in (False, True):
        model = tiny_vit()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        kw = dict(lr=3e-3, device=torch.device("cpu"), precision="bf16", clip_grad_norm=1.0, int8=int8)
        g.manual_seed(4)
        first = train_step(model, opt, batch(), **kw).loss
        for _ in range(25):
            last = train_step(model, opt, batch(), **kw)
        assert last.applied and last.loss < 0.5 * first, (int8, first, last.loss)
        losses[int8] = last.loss
        bad = batch()
        bad[0][0][0, 0, 0, 0] = float("nan")
        before = [p.detach().clone() for p in model.parameters()]
        r = train_step(model, opt, bad, **kw)
        assert not r.applied and all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert abs(losses[True] - losses[False]) < 0.25 * losses[False] + 0.05


def test_int8_needs_a_cpu():
    check_int8_training("cpu")
    with pytest.raises(ValueError, match=r"train.int8 runs on a CPU; this run's device is cuda:0"):
        check_int8_training("cuda:0")
    with pytest.raises(ValueError, match=r"train.int8 with parallel: fsdp: .* use parallel: ddp"):
        check_int8_training("cpu", fsdp=True)
    assert isinstance(int8_training("meta", enabled=False), contextlib.nullcontext)  # off: nothing is checked
    assert isinstance(int8_training("cpu"), TorchFunctionMode)


@pytest.mark.parametrize("other,why", [("grad_checkpointing", "recomputed"), ("linear_probe", "extracted features")])
def test_recipe_refuses_what_int8_cannot_reach(other, why):
    from vitlab.train.recipe import Recipe

    base = {"model": {"name": "ViT-Ti/16", "img_size": 32}, "data": {"dataset": "synthetic"},
            "train": {"steps": 1, "int8": True, other: True}}
    if other == "linear_probe":
        base["init"] = {"checkpoint": "x.safetensors"}
    with pytest.raises(ValueError, match=rf"train.int8 and train.{other} cannot be combined: .*{why}"):
        Recipe.from_dict(base, check_data=False)
    with pytest.raises(ValueError, match=r"train\.int8"):
        Recipe.from_dict({**base, "train": {"steps": 1, "int8": "yes"}}, check_data=False)
    ok = Recipe.from_dict({**base, "train": {"steps": 1, "int8": True}}, check_data=False)
    assert ok.train.int8 and Recipe.from_dict(ok.to_dict(), check_data=False).train.int8


def test_profile_of_a_compiled_linear_has_no_bf16_forward_gemm():
    """Under torch.compile the forward GEMM of a routed linear is the int8 one: no float mm / addmm in the forward."""
    lin = torch.nn.Linear(32, 48)
    net = torch.compile(lambda t: lin(t), fullgraph=True)
    x = torch.randn(2, 20, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=BF16), int8_training("cpu"):
        net(x)  # compile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            net(x)
    keys = [e.key for e in prof.key_averages()]
    assert "aten::_int_mm" in keys and "aten::addmm" not in keys and "aten::mm" not in keys


def test_caveat_names_what_makes_int8_slow_here():
    from vitlab.perf.int8_train import int8_training_caveat

    vnni = {"avx512f", "avx512_vnni", "avx512_bf16"}
    assert int8_training_caveat(True, vnni) is None
    assert "without train.compile" in int8_training_caveat(False, vnni)
    msg = int8_training_caveat(True, {"avx2", "fma"})  # an AVX2-only host
    assert msg.startswith("train.int8 on a CPU without") and "avx512_vnni" in msg and "no faster than fp32" in msg
