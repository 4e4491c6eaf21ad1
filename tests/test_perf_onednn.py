"""oneDNN's biased GEMM and GELU in compiled bf16 training (`vitlab.perf.onednn`): the same forward as autocast's
linear and torch's GELU, gradients as accurate as autograd's own (against an fp32 reference), used only where it
was measured faster (bf16 on AVX-512 bf16 without AMX), and a compiled training step that goes through it."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile

from vitlab.perf import cpu, linear, onednn
from vitlab.perf.onednn import OneDNNLinear, gelu, linear_bias, onednn_training_kernels, onednn_wanted

from .linear_helpers import BF16, check_linear_function, fp32_grads, inputs, rel_err, step_grads, tiny_vit

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    yield
    torch._dynamo.reset()


def MODE():
    return onednn_training_kernels("cpu", "bf16")


@pytest.mark.parametrize("out_f,in_f", [(96, 32), (32, 96), (48, 48)])
def test_linear_is_autocasts_forward_and_as_accurate_backward(out_f, in_f):
    check_linear_function(lambda x, w, b: OneDNNLinear.apply(x, w, b, BF16), out_f, in_f)


def test_frozen_weights_get_no_gradient():
    x, w, b, dy = inputs(64, 32)
    xg = x.clone().requires_grad_()
    OneDNNLinear.apply(xg, w, b, BF16).backward(dy.to(BF16))
    want = (dy.reshape(-1, 64) @ w).reshape(x.shape)
    assert rel_err(xg.grad, want) < 2e-2 and w.grad is None and b.grad is None


def test_gelu_is_torchs_gelu_forward_and_backward():
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(7, 33, 130, generator=g) * 3).to(BF16)  # odd sizes: vector tails
    dy = torch.randn(7, 33, 130, generator=g).to(BF16)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = gelu(xa), F.gelu(xb)
    torch.testing.assert_close(ya, yb, rtol=0, atol=0)
    ya.backward(dy)
    yb.backward(dy)
    torch.testing.assert_close(xa.grad, xb.grad, rtol=0, atol=0)
    # and it is the exact (erf) GELU, not the tanh one: against float64
    x64 = x.double()
    exact = x64 * 0.5 * (1 + torch.erf(x64 / 2**0.5))

    def worst(y: torch.Tensor) -> float:  # relative error where the value is not tiny
        keep = exact.abs() > 1e-3
        return float(((y.detach().double() - exact).abs() / exact.abs())[keep].max())

    assert worst(ya) <= 2**-8  # bf16 rounding of the exact value
    assert worst(F.gelu(x, approximate="tanh")) > 2**-8  # the check tells the two apart


def test_gelu_is_differentiable_in_float64():
    x = torch.randn(5, 9, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(gelu, (x,))


def test_fake_kernels_name_bad_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), pytest.raises(ValueError, match=r"linear_bias: shapes \(4, 8\), \(6, 9\), \(6,\)"):
        linear_bias(torch.empty(4, 8), torch.empty(6, 9), torch.empty(6))
    with FakeTensorMode(), pytest.raises(ValueError, match=r"gelu_backward: gradient shape \(2, 3\) differs"):
        onednn.gelu_backward(torch.empty(2, 3), torch.empty(3, 2))


@pytest.fixture
def zen4(monkeypatch):
    """An AVX-512 bf16 host without AMX (Zen 4 class), kernels not held to a lesser ISA."""
    for var in (*cpu.EMULATION_VARS, linear.ENV, onednn.ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(cpu, "cpu_has_amx", lambda: False)
    monkeypatch.setattr(onednn, "amx_kernels", lambda: False)
    monkeypatch.setattr(onednn, "bf16_kernels", lambda: True)


def test_wanted_for_bf16_without_amx_only(zen4, monkeypatch):
    assert onednn_wanted("cpu", "bf16") and isinstance(onednn_training_kernels("cpu", "bf16"), TorchFunctionMode)
    assert not onednn_wanted("cpu", "fp32")
    assert isinstance(onednn_training_kernels("cpu", "fp32"), contextlib.nullcontext)
    assert not onednn_wanted("meta", "bf16")
    monkeypatch.setattr(onednn, "bf16_kernels", lambda: False)  # AVX2, or kernels held to AVX2: not measured there
    assert not onednn_wanted("cpu", "bf16")
    monkeypatch.setattr(onednn, "bf16_kernels", lambda: True)
    monkeypatch.setattr(onednn, "amx_kernels", lambda: True)  # AMX: the row-major weight gradients' ground
    monkeypatch.setattr(cpu, "cpu_has_amx", lambda: True)
    assert linear.rowmajor_wanted("cpu", "bf16") and not onednn_wanted("cpu", "bf16")
    monkeypatch.setenv(onednn.ENV, "on")  # forced on, but one function mode routes F.linear: the row-major one
    assert not onednn_wanted("cpu", "bf16")
    monkeypatch.setenv(linear.ENV, "off")
    assert onednn_wanted("cpu", "bf16")


def test_environment_overrides_the_cpu_rule(zen4, monkeypatch):
    monkeypatch.setattr(onednn, "bf16_kernels", lambda: False)
    monkeypatch.setenv(onednn.ENV, "on")
    assert onednn_wanted("cpu", "bf16") and not onednn_wanted("cpu", "fp32")
    monkeypatch.setattr(onednn, "bf16_kernels", lambda: True)
    monkeypatch.setenv(onednn.ENV, " Off ")
    assert not onednn_wanted("cpu", "bf16")
    monkeypatch.setenv(onednn.ENV, "fast")
    with pytest.raises(ValueError, match="VITLAB_ONEDNN_TRAIN='fast' is not one of auto, on, off"):
        onednn_wanted("cpu", "bf16")


def test_compiled_step_goes_through_it_and_keeps_the_gradients(zen4):
    model = tiny_vit()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 5, (4,), generator=g)
    want = fp32_grads(model, x, y)
    loss_p, plain, _ = step_grads(model, x, y, context=None, compiled=True)
    loss_o, ours, ops = step_grads(model, x, y, context=MODE, compiled=True)
    assert "vitlab::linear_bias" in ops and "vitlab::gelu" in ops and "vitlab::gelu_backward" in ops
    assert abs(loss_o - loss_p) < 1e-2
    for n, w in want.items():
        assert ours[n] is not None, n
        assert rel_err(ours[n], w) <= 1.5 * rel_err(plain[n], w) + 2e-3, n
    _, _, eager_ops = step_grads(model, x, y, context=MODE, compiled=False)
    assert "vitlab::linear_bias" not in eager_ops and "vitlab::gelu" not in eager_ops  # eager: torch's own


def test_tanh_gelu_and_inference_pass_through(zen4):
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 5, (4,), generator=g)
    _, _, ops = step_grads(tiny_vit("gelu_tanh"), x, y, context=MODE, compiled=True)
    assert "vitlab::gelu" not in ops and "vitlab::linear_bias" in ops  # SigLIP2's tanh GELU keeps torch's
    model = tiny_vit().eval()
    net = torch.compile(model, fullgraph=True)
    with torch.no_grad(), torch.autocast("cpu", dtype=BF16), onednn_training_kernels("cpu", "bf16"):
        got = net(x)
    with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
        want = model(x)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_train_step_uses_it_where_wanted(zen4, monkeypatch):
    """vitlab's own training step enters the context: on this (patched) host class its compiled step runs the
    oneDNN kernels; with VITLAB_ONEDNN_TRAIN=off it does not."""
    from vitlab.train.step import train_step

    g = torch.Generator().manual_seed(5)
    batch = [(torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 5, (4,), generator=g))]
    for env, expect in (("auto", True), ("off", False)):
        monkeypatch.setenv(onednn.ENV, env)
        torch._dynamo.reset()
        model = tiny_vit()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            train_step(torch.compile(model), opt, batch, lr=0.1, device=torch.device("cpu"), precision="bf16")
        assert ("vitlab::linear_bias" in [e.key for e in prof.key_averages()]) is expect, env


def test_compiled_with_gradient_checkpointing(zen4):
    """With block recomputation in the backward pass (non-reentrant checkpoint under torch.compile) the context
    still gives the gradients of the step without checkpointing. (torch.compile traces a checkpointed block without
    the function mode, so only the head goes through oneDNN there: docs/speed.md.)"""
    model = tiny_vit()
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 5, (4,), generator=g)
    _, plain, _ = step_grads(model, x, y, context=MODE, compiled=True)
    model.set_grad_checkpointing(True)
    _, ckpt, ops = step_grads(model, x, y, context=MODE, compiled=True)
    assert "vitlab::linear_bias" in ops
    for n, w in plain.items():
        torch.testing.assert_close(ckpt[n], w, rtol=2e-2, atol=1e-4, msg=n)
