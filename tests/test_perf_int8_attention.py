"""vitlab.perf.int8_attention: the fused AVX512-VNNI attention kernel, against its arithmetic written out in numpy
and against fp32 attention; its refusals; and static int8 graphs that run it (vitlab.deploy.quant)."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vitlab.perf import cpu
from vitlab.perf.int8_attention import int8_attention, int8_attention_quantized, int8_attention_unavailable

needs_kernel = pytest.mark.skipif(int8_attention_unavailable() is not None,
                                  reason=f"{int8_attention_unavailable()}")


def _steps(amax: np.ndarray) -> np.ndarray:
    return np.where(amax > 0, amax / np.float32(127), np.float32(1)).astype(np.float32)


def _quantise(x: np.ndarray, step: np.ndarray) -> np.ndarray:
    inv = (np.float32(1) / step).astype(np.float32)
    return np.rint(x * inv).astype(np.int64)  # round half to even, as the kernel's cvtps2dq


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> np.ndarray:
    """The kernel's arithmetic in numpy: q, k int8 per row, v per column, int64 sums, softmax in base 2 scaled to
    255 at the row's largest, rounded to integers, divided by the unrounded sum. Only exp2 is exact here (the kernel
    uses a polynomial, relative error < 1e-5), which can move a rounded probability by one step."""
    q, k, v = (t.float().numpy() for t in (q, k, v))  # (B, H, N, D)
    sq, sk = _steps(np.abs(q).max(-1)), _steps(np.abs(k).max(-1))  # (B, H, N)
    sv = _steps(np.abs(v).max(-2))  # (B, H, D)
    q8, k8, v8 = _quantise(q, sq[..., None]), _quantise(k, sk[..., None]), _quantise(v, sv[..., None, :])
    s = q8 @ np.swapaxes(k8, -1, -2)  # (B, H, N, N) exact
    row = (sq * np.float32(scale) * np.float32(math.log2(math.e))).astype(np.float32)
    x = (s.astype(np.float32) * sk[..., None, :]) * row[..., None]  # the kernel's float32 products, in its order
    t = x.astype(np.float64) - (x.max(-1, keepdims=True).astype(np.float64) - math.log2(255))
    p = np.exp2(t)
    p8 = np.rint(p).astype(np.int64)
    return (p8 @ v8) * sv[..., None, :] / p.sum(-1, keepdims=True)  # (B, H, N, D)


def _qkv(b: int, h: int, n: int, d: int, dtype=torch.float32, sharp: float = 1.0, seed: int = 0):
    """q, k, v as the (B, H, N, D) views of a fused qkv projection's (B, N, 3, H, D) output, as ViT makes them."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(b, n, 3, h, d, generator=g) * torch.rand(1, n, 3, h, 1, generator=g).add(0.2)
    qkv[:, :, :2] *= sharp  # larger q, k: more peaked attention, as trained models have
    return qkv.to(dtype).permute(2, 0, 3, 1, 4).unbind(0)


@needs_kernel
@pytest.mark.parametrize("n,d", [(1, 16), (2, 32), (15, 64), (16, 64), (17, 48), (50, 64), (197, 64), (230, 80),
                                 (33, 256)])
def test_kernel_computes_its_int8_arithmetic(n, d):
    q, k, v = _qkv(2, 3, n, d, sharp=1.5, seed=n)
    scale = d ** -0.5
    out = int8_attention(q, k, v, scale)
    ref = reference(q, k, v, scale)
    assert out.shape == q.shape and out.dtype == torch.float32
    diff = np.abs(out.numpy() - ref)
    bound = np.abs(v.numpy()).max() / 255  # one probability step of the row's largest, times the largest |v|
    assert diff.max() <= bound, (diff.max(), bound)
    assert np.median(diff) <= 1e-5 * np.abs(ref).max()  # most outputs: the same int8 products exactly


@needs_kernel
@pytest.mark.parametrize("sharp", [0.5, 1.0, 3.0])
def test_kernel_is_close_to_fp32_attention(sharp):
    q, k, v = _qkv(2, 12, 197, 64, sharp=sharp)
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    out = int8_attention(q, k, v, 0.125).double()
    rel = float((out - exact).norm() / exact.norm())
    assert rel < 0.03, rel  # int8 q, k, v and uint8 probabilities: ~1-2% rms
    bf16 = F.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16()).double()
    assert float((bf16 - exact).norm() / exact.norm()) < rel  # bf16 attention is the closer one, as it should be


@needs_kernel
def test_kernel_bf16_strided_and_layout():
    q, k, v = _qkv(3, 4, 197, 64, dtype=torch.bfloat16)
    assert q.stride(-2) == 3 * 4 * 64  # views into the qkv rows, not copies
    out = int8_attention(q, k, v, 0.125)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    assert out.transpose(1, 2).is_contiguous()  # (B, N, H, D) memory: the reshape to (B, N, H*D) is free
    assert torch.equal(out, int8_attention(q.contiguous(), k.contiguous(), v.contiguous(), 0.125))
    ref = torch.from_numpy(reference(q, k, v, 0.125)).float()
    assert float((out.float() - ref).abs().max()) <= float(v.float().abs().max()) / 255 + 0.01 * float(ref.abs().max())
    lastdim = q.transpose(-1, -2).contiguous().transpose(-1, -2)  # last dimension not contiguous: copied first
    assert torch.equal(int8_attention(lastdim, k, v, 0.125), out)


@needs_kernel
def test_kernel_special_values():
    q, k, v = _qkv(1, 2, 40, 32)
    q0 = torch.zeros_like(q)  # zero queries: uniform attention, the mean of v (within v's int8 steps)
    out = int8_attention(q0, k, v, 0.2)
    assert torch.allclose(out, v.mean(-2, keepdim=True).expand_as(out), atol=float(v.abs().max()) / 127)
    assert torch.equal(int8_attention(q, k, torch.zeros_like(v), 0.2), torch.zeros_like(q))
    qn = q.clone()
    qn[0, 1, 7, 3] = float("nan")  # a query row with NaN: that row's outputs, no other
    out = int8_attention(qn, k, v, 0.2)
    assert out[0, 1, 7].isnan().all() and out[0, 1, torch.arange(40) != 7].isfinite().all()
    assert out[0, 0].isfinite().all()
    kn = k.clone()
    kn[0, 0, 5, 0] = float("inf")  # a key with inf: every query of that head sees it
    out = int8_attention(q, kn, v, 0.2)
    assert not out[0, 0].isfinite().any() and out[0, 1].isfinite().all()
    vn = v.clone()
    vn[0, 1, 9, 4] = float("nan")  # a value with NaN: that channel of every output of the head
    out = int8_attention(q, k, vn, 0.2)
    assert out[0, 1, :, 4].isnan().all() and out[0, 1, :, torch.arange(32) != 4].isfinite().all()
    assert int8_attention(q[:0], k[:0], v[:0], 0.2).shape == (0, 2, 40, 32)  # an empty batch


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantized_output_is_quantize_per_tensor_of_the_fp32_result(dtype):
    """The uint8 codes the output projection reads: torch's own quantize_per_tensor of the kernel's fp32 result
    (the same products: bf16 inputs are widened exactly), round half to even, clamped to [0, 255], in the
    (B, N, heads, head_dim) memory of the float output."""
    q, k, v = _qkv(2, 3, 50, 64, dtype=dtype, sharp=1.5)
    ref = int8_attention(q.float(), k.float(), v.float(), 0.125)  # fp32: what the codes quantise
    for step, zp in ((0.004, 128), (0.02, 3), (0.001, 250)):  # some of these clamp at 0 or 255
        codes = int8_attention_quantized(q, k, v, 0.125, step, zp)
        assert codes.dtype == torch.uint8 and codes.shape == q.shape
        assert codes.permute(0, 2, 1, 3).is_contiguous()  # (B, N, H, D) memory
        expect = torch.clamp(torch.round(ref / step) + zp, 0, 255).to(torch.uint8)
        diff = (codes.int() - expect.int()).abs()
        assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-3  # off by one only where x / step rounds at a half
    assert (int8_attention_quantized(q, k, v, 0.125, 0.001, 250) == 255).any()  # the clamp was exercised
    vn = v.clone()
    vn[0, 1, 9, 4] = float("nan")  # NaN reaches no integer: that channel's codes are 0
    codes = int8_attention_quantized(q, k, vn, 0.125, 0.01, 100)
    assert (codes[0, 1, :, 4] == 0).all() and (codes[0, 1, :, 5] > 0).any()


def test_quantized_output_refuses_a_bad_output_quantisation():
    q = torch.randn(1, 2, 8, 64)
    for step, zp in ((0.0, 128), (-0.1, 128), (float("inf"), 128), (float("nan"), 0), (0.1, 256), (0.1, -1)):
        with pytest.raises(ValueError, match="positive, finite scale and a zero point in"):
            int8_attention_quantized(q, q, q, 0.1, step, zp)


def test_bad_inputs_are_named():
    q = torch.randn(1, 2, 8, 64)
    with pytest.raises(ValueError, match="multiple of 16"):
        int8_attention(q[..., :24], q[..., :24], q[..., :24], 0.1)
    with pytest.raises(ValueError, match="one shape"):
        int8_attention(q, q[:, :, :4], q, 0.1)
    with pytest.raises(ValueError, match="fp32 or bf16"):
        int8_attention(q.half(), q.half(), q.half(), 0.1)
    with pytest.raises(ValueError, match=r"\(B, heads, N, head_dim\)"):
        int8_attention(q[0], q[0], q[0], 0.1)


def test_refused_without_avx512_vnni(monkeypatch):
    for var in cpu.EMULATION_VARS:
        monkeypatch.delenv(var, raising=False)
    full = frozenset({"avx2", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni"})
    monkeypatch.setattr(cpu, "cpu_flags", lambda cpuinfo="": full)
    assert int8_attention_unavailable() is None
    monkeypatch.setattr(cpu, "cpu_flags", lambda cpuinfo="": full - {"avx512_vnni"})  # Skylake-SP
    assert "lacks avx512_vnni" in int8_attention_unavailable()
    q = torch.randn(1, 1, 4, 16)
    with pytest.raises(RuntimeError, match="lacks avx512_vnni"):
        int8_attention(q, q, q, 0.25)
    monkeypatch.setattr(cpu, "cpu_flags", lambda cpuinfo="": full)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")  # kernels held to a CPU without VNNI
    assert "ONEDNN_MAX_CPU_ISA=AVX512_CORE" in int8_attention_unavailable()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2_VNNI")  # VNNI in 256 bits only (Alder Lake): not this kernel's
    assert "ONEDNN_MAX_CPU_ISA=AVX2_VNNI" in int8_attention_unavailable()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_VNNI")  # the fp32 class (Cascade Lake): VNNI is there
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx512")
    assert int8_attention_unavailable() is None
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert "ATEN_CPU_CAPABILITY=avx2" in int8_attention_unavailable()


@needs_kernel
def test_kernel_probabilities_round_as_exp_does():
    """v = the identity reads the uint8 probabilities out: out[i, j] = p8[i, j] / sum_j p. Against exact exp2,
    rounding may differ only where 255 * 2^(x - max) falls within the kernel's exp error (< 1e-5 relative) of a
    half-integer: a few in a thousand."""
    q, k, _ = _qkv(2, 4, 64, 64, sharp=1.5, seed=3)
    v = torch.eye(64).expand(2, 4, 64, 64)
    out, ref = int8_attention(q, k, v, 0.125).numpy(), reference(q, k, v, 0.125)
    step = ref.max(-1, keepdims=True) / 255  # one probability step in each row (its largest is 255)
    off = np.abs(out - ref) / step
    assert off.max() < 1.01  # never more than one step
    assert (off > 0.5).mean() < 0.005, (off > 0.5).mean()


@needs_kernel
def test_ops_check_the_cpu_not_the_emulation_settings(monkeypatch):
    """Kernel-emulation variables steer planning (`int8_attention_unavailable`, what quantize_static reads), not the
    ops: a direct call runs this CPU's instructions, which it has, and gives the same answer."""
    q, k, v = _qkv(1, 2, 20, 32)
    ref = int8_attention(q, k, v, 0.2)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in int8_attention_unavailable()
    assert torch.equal(int8_attention(q, k, v, 0.2), ref)
