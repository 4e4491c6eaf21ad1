"""vitlab.perf.norm_quant: LayerNorm + uint8 quantisation in one pass, against torch's LayerNorm followed by the
quantize_per_tensor op torchao's PT2E graphs use (and Inductor's fused loop computes)."""

import pytest
import torch
import torch.nn.functional as F

from vitlab.perf.norm_quant import layer_norm_quantize, layer_norm_quantize_build_error

pytest.importorskip("torchao")
import torchao.quantization.pt2e  # noqa: F401  registers torch.ops.quantized_decomposed

pytestmark = pytest.mark.skipif(layer_norm_quantize_build_error() is not None,
                                reason=f"{layer_norm_quantize_build_error()}")


def _reference(x, w, b, eps, scale, zp, qmin=0, qmax=255):
    y = F.layer_norm(x.float(), (x.shape[-1],), w, b, eps)
    return torch.ops.quantized_decomposed.quantize_per_tensor.default(y, scale, zp, qmin, qmax, torch.uint8)


@pytest.mark.parametrize("shape", [(8, 197, 768), (3, 50, 192), (5, 17), (4, 1), (2, 3, 1000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_codes_are_torchs_layer_norm_then_quantize(shape, dtype):
    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=g) * 3 + torch.randn(shape[-1], generator=g)).to(dtype)  # offset channels
    w, b = torch.randn(shape[-1], generator=g), torch.randn(shape[-1], generator=g)
    for scale, zp in ((0.03, 128), (0.01, 60)):  # the second clamps many values at 0 and 255
        out = layer_norm_quantize(x, [shape[-1]], w, b, 1e-6, scale, zp, 0, 255)
        ref = _reference(x, w, b, 1e-6, scale, zp)
        assert out.dtype == torch.uint8 and out.shape == x.shape and out.is_contiguous()
        diff = (out.int() - ref.int()).abs()
        # one code apart at most, and only where y / scale lands within float rounding of a half
        assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-3, (diff.max(), (diff > 0).sum())
    assert (layer_norm_quantize(x, [shape[-1]], w, b, 1e-6, 0.01, 60, 0, 255) == 255).any() or shape[-1] == 1


def test_no_affine_strided_input_and_a_narrow_range():
    x = torch.randn(6, 40, 64)[:, ::2]  # rows not contiguous: copied first
    out = layer_norm_quantize(x, [64], None, None, 1e-5, 0.02, 100, 10, 200)
    ref = _reference(x, None, None, 1e-5, 0.02, 100, 10, 200)
    assert (out.int() - ref.int()).abs().max() <= 1
    assert out.min() >= 10 and out.max() <= 200
    assert layer_norm_quantize(x[:0], [64], None, None, 1e-5, 0.02, 100, 0, 255).shape == (0, 20, 64)


def test_a_row_with_nan_quantises_to_the_range_minimum_and_leaves_the_others():
    x = torch.randn(4, 32)
    x[2, 5] = float("nan")
    out = layer_norm_quantize(x, [32], None, None, 1e-6, 0.05, 128, 3, 255)
    assert (out[2] == 3).all()
    assert torch.equal(out[[0, 1, 3]], layer_norm_quantize(x[[0, 1, 3]], [32], None, None, 1e-6, 0.05, 128, 3, 255))


def test_bad_inputs_are_named():
    x = torch.randn(2, 8, 16)
    with pytest.raises(ValueError, match="last dimension alone"):
        layer_norm_quantize(x, [8, 16], None, None, 1e-5, 0.1, 0, 0, 255)
    with pytest.raises(ValueError, match="last dimension alone"):
        layer_norm_quantize(x, [8], None, None, 1e-5, 0.1, 0, 0, 255)
    with pytest.raises(ValueError, match=r"weight of shape \(16,\)"):
        layer_norm_quantize(x, [16], torch.ones(8), None, 1e-5, 0.1, 0, 0, 255)
    with pytest.raises(ValueError, match="fp32 or bf16"):
        layer_norm_quantize(x.half(), [16], None, None, 1e-5, 0.1, 0, 0, 255)
    with pytest.raises(ValueError, match=r"not within \[0, 255\]"):
        layer_norm_quantize(x, [16], None, None, 1e-5, 0.1, 0, -128, 127)
    for scale in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="positive, finite scale"):
            layer_norm_quantize(x, [16], None, None, 1e-5, scale, 0, 0, 255)
