"""Speed modes: each runs, leaves the original alone, and agrees with the fp32 model within a stated tolerance."""

import pytest
import torch

import vitlab
from vitlab.deploy.optimize import CALIBRATED_MODES, MODES, RUNTIME_MODES, optimize

from .conftest import perturb_, skip_if_emulated

# Relative L2 error of the logits allowed per mode: bf16 keeps 8 mantissa bits (2^-8 ~ 4e-3 per rounding),
# fp16 11 bits; int8 rounds weights (per channel) and activations (per tensor) to 1/127 of their range, which
# on random weights, with no outlier handling, costs several per cent (real-data agreement: docs/speed.md).
REL_TOL = {"fp32": 0.0, "bf16": 3e-2, "fp16": 5e-3, "int8": 1e-1, "compile": 1e-5, "compile-bf16": 3e-2}


def _tiny():
    model = vitlab.create_model("ViT-Ti/16", depth=2, img_size=32, patch_size=8, num_classes=10)
    return perturb_(model, scale=0.05).eval()


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("mode", ["fp32", "bf16", "fp16", "int8"])
def test_eager_modes_agree_with_fp32(mode):
    model = _tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(16, 3, 32, 32)
    with torch.no_grad():
        ref = model(x)
    fast = optimize(model, mode)
    out = fast(x)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    err = _rel_err(out, ref)
    assert err <= REL_TOL[mode], f"{mode}: relative error {err:.2e}"
    if mode != "fp32":
        assert err > 0  # really computed another way
    assert (out.argmax(1) == ref.argmax(1)).float().mean() >= 0.8
    for k, v in model.state_dict().items():  # the original model is untouched
        assert v.dtype == torch.float32 and torch.equal(v, before[k])
    # the copy's last block runs for the class token alone (fp32 stays the reference), the original's for all
    assert fast.module.prune_last_block == (mode != "fp32") and not model.prune_last_block


def test_int8_really_quantises_the_linears():
    fast = optimize(_tiny(), "int8")
    from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

    qlinears = [m for m in fast.module.modules() if isinstance(m, DynamicQuantizedLinear)]
    assert not [m for m in fast.module.modules() if type(m) is torch.nn.Linear]  # none left in fp32
    assert len(qlinears) == 2 * 4 + 1  # qkv, proj, fc1, fc2 per block, and the head
    assert qlinears[0].weight().dtype == torch.qint8


def test_errors_are_named():
    with pytest.raises(ValueError, match="unknown speed mode 'fast'"):
        optimize(_tiny(), "fast")
    with pytest.raises(RuntimeError, match="inference only"):
        optimize(_tiny(), "bf16").train()
    # the calibrated and runtime modes are checked in test_quant.py and the deploy tests
    assert set(REL_TOL) == set(MODES) - set(CALIBRATED_MODES) - set(RUNTIME_MODES)


@pytest.mark.slow
@skip_if_emulated
@pytest.mark.parametrize("mode", ["compile", "compile-bf16"])
def test_compiled_mode_agrees_with_fp32(mode):
    model = _tiny()
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        ref = model(x)
    fast = optimize(model, mode, dynamic=False)
    out = fast(x)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert _rel_err(out, ref) <= REL_TOL[mode], f"{mode}: relative error {_rel_err(out, ref):.2e}"
    if mode == "compile-bf16":  # really ran in bf16: weights converted, and not bit-equal to fp32
        assert fast.dtype == torch.bfloat16 and next(fast.module.parameters()).dtype == torch.bfloat16
        assert _rel_err(out, ref) > 0
        assert (out.argmax(1) == ref.argmax(1)).float().mean() >= 0.75
