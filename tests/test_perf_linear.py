"""Row-major weight-gradient GEMMs (`vitlab.perf.linear`): the same forward as autocast's linear, gradients as
accurate as autograd's own (both against an fp32 reference), used only where it pays (compiled bf16 training on
AMX), and a training step that goes through it under torch.compile."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.overrides import TorchFunctionMode

from vitlab.perf import cpu, linear
from vitlab.perf.linear import RowMajorLinear, mm_rowmajor, rowmajor_wanted, rowmajor_weight_grads

from .linear_helpers import BF16, check_linear_function, fp32_grads, grads, inputs, rel_err, step_grads, tiny_vit


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Forget what torch.compile saw here: its per-function shape history would otherwise make the next test's
    compile of the same forward (another model size, same worker) symbolic in its shapes, which for the hybrid
    recipe takes minutes."""
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("out_f,in_f", [(96, 32), (32, 96), (48, 48)])  # X^T copied, dY^T copied, either
def test_rowmajor_linear_matches_autocast_and_fp32(out_f, in_f):
    check_linear_function(lambda x, w, b: RowMajorLinear.apply(x, w, b, BF16), out_f, in_f)


def test_frozen_weights_get_no_gradient_and_inputs_still_do():
    x, w, b, dy = inputs(64, 32)
    xg = x.clone().requires_grad_()
    y = RowMajorLinear.apply(xg, w, b, BF16)  # weight and bias frozen (plain tensors without grad)
    y.backward(dy.to(BF16))
    want = (dy.reshape(-1, 64) @ w).reshape(x.shape)
    assert rel_err(xg.grad, want) < 2e-2 and w.grad is None and b.grad is None
    xw = grads(lambda x, w, b: RowMajorLinear.apply(x, w, None, BF16), x, w, b, dy)
    assert xw[3] is None  # no bias: none to differentiate


def test_mm_rowmajor_multiplies_any_layout_and_names_bad_shapes():
    a, b = torch.randn(40, 8), torch.randn(8, 24)
    torch.testing.assert_close(mm_rowmajor(a.t().contiguous().t(), b.t().contiguous().t()), a @ b)
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"):
        mm_rowmajor(a, a)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), pytest.raises(ValueError, match=r"mm_rowmajor: shapes \(40, 8\) and \(40, 8\)"):
        mm_rowmajor(torch.empty(40, 8), torch.empty(40, 8))


def test_mm_rowmajor_is_differentiable():
    a = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(mm_rowmajor, (a, b))


@pytest.fixture
def amx(monkeypatch):
    """An AMX host whose kernels are not held to a lesser ISA (the suite may run anywhere)."""
    for var in (*cpu.EMULATION_VARS, linear.ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(cpu, "cpu_has_amx", lambda: True)


def test_wanted_only_for_bf16_on_amx(amx, monkeypatch):
    assert rowmajor_wanted("cpu", "bf16") and isinstance(rowmajor_weight_grads("cpu", "bf16"), TorchFunctionMode)
    assert isinstance(rowmajor_weight_grads("cpu", "fp32"), contextlib.nullcontext)
    assert not rowmajor_wanted("cpu", "fp32")
    assert not rowmajor_wanted("meta", "bf16")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # kernels held to AVX2: no AMX tiles to feed
    assert not rowmajor_wanted("cpu", "bf16")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setattr(cpu, "cpu_has_amx", lambda: False)  # AVX-512 bf16 (Zen 4) or AVX2: layout did not matter
    assert not rowmajor_wanted("cpu", "bf16")
    assert isinstance(rowmajor_weight_grads("cpu", "bf16"), contextlib.nullcontext)


@pytest.mark.parametrize("amx_here", [True, False])
def test_environment_overrides_the_cpu_rule(amx, monkeypatch, amx_here):
    monkeypatch.setattr(cpu, "cpu_has_amx", lambda: amx_here)
    monkeypatch.setenv(linear.ENV, "on")
    assert rowmajor_wanted("cpu", "bf16") and not rowmajor_wanted("cpu", "fp32")  # bf16 still required
    monkeypatch.setenv(linear.ENV, "OFF")
    assert not rowmajor_wanted("cpu", "bf16")
    monkeypatch.setenv(linear.ENV, "")
    assert rowmajor_wanted("cpu", "bf16") == amx_here
    monkeypatch.setenv(linear.ENV, "yes")
    with pytest.raises(ValueError, match="VITLAB_ROWMAJOR_GRADS='yes' is not one of auto, on, off"):
        rowmajor_wanted("cpu", "bf16")


def MODE():
    return rowmajor_weight_grads("cpu", "bf16")


def test_compiled_step_goes_through_it_and_keeps_the_gradients(amx):
    model = tiny_vit()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 5, (4,), generator=g)
    want = fp32_grads(model, x, y)
    loss_p, plain, _ = step_grads(model, x, y, context=None, compiled=True)
    loss_o, ours, ops = step_grads(model, x, y, context=MODE, compiled=True)
    assert "vitlab::mm_rowmajor" in ops  # the weight gradients went through the row-major GEMM
    assert abs(loss_o - loss_p) < 1e-2
    for n, w in want.items():
        assert rel_err(ours[n], w) <= 1.5 * rel_err(plain[n], w) + 2e-3, n
    _, _, eager_ops = step_grads(model, x, y, context=MODE, compiled=False)
    assert "vitlab::mm_rowmajor" not in eager_ops  # eager keeps autograd's linear (no gain there)


def test_inference_and_fp32_pass_through(amx):
    model = tiny_vit().eval()
    x = torch.randn(2, 3, 16, 16)
    net = torch.compile(model, fullgraph=True)
    with torch.no_grad(), torch.autocast("cpu", dtype=BF16), rowmajor_weight_grads("cpu", "bf16"):
        got = net(x)
    with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
        want = model(x)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_compiled_with_gradient_checkpointing(amx):
    """With block recomputation in the backward pass (non-reentrant checkpoint under torch.compile) the context
    still gives the gradients of the step without checkpointing. torch.compile traces a checkpointed block without
    the function mode, so only the head (outside the checkpoint) takes the row-major GEMM there (docs/speed.md)."""
    model = tiny_vit()
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 5, (4,), generator=g)
    _, plain, _ = step_grads(model, x, y, context=MODE, compiled=True)
    model.set_grad_checkpointing(True)
    _, ckpt, ops = step_grads(model, x, y, context=MODE, compiled=True)
    assert "vitlab::mm_rowmajor" in ops
    for n, w in plain.items():
        torch.testing.assert_close(ckpt[n], w, rtol=2e-2, atol=1e-4, msg=n)
