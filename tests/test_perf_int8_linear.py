"""vitlab.perf.int8_linear: the static int8 linear layer (uint8 codes x packed int8 weight, with its epilogues),
against a float64 reference of the arithmetic it promises, against oneDNN's own `qlinear_pointwise` (the kernel it
replaces in static int8 graphs) and torch's erf GELU; its refusals; and the graph rewrite that puts it in place
(vitlab.deploy.quant.int8_linears_in)."""

from functools import partial

import pytest
import torch
import torch.nn.functional as F

from vitlab.perf import cpu
from vitlab.perf.int8_linear import INT8_LINEAR, int8_linear, int8_linear_unavailable, pack

needs_kernel = pytest.mark.skipif(int8_linear_unavailable() is not None, reason=f"{int8_linear_unavailable()}")


def _layer(m: int, k: int, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=g)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    w_scale = torch.rand(n, generator=g) * 0.004 + 2e-4
    bias = torch.randn(n, generator=g)
    return x, w, w_scale, bias


def _real(x, w, w_scale, x_scale, x_zp, bias) -> torch.Tensor:
    """The layer in float64: (x - zp_x) w^T * s_x s_w + bias."""
    return ((x.double() - x_zp) @ w.double().t()) * (w_scale.double() * x_scale) + bias.double()


def _codes(y: torch.Tensor, scale: float, zp: int) -> torch.Tensor:
    """quantize_per_tensor's arithmetic on fp32: clamp(round_half_even(y * (1 / scale)) + zp, 0, 255)."""
    return torch.clamp(torch.round(y.float() * (1.0 / scale)) + zp, 0, 255).to(torch.uint8)


@needs_kernel
@pytest.mark.parametrize("m,k,n", [(1, 4, 64), (5, 64, 128), (7, 768, 64), (197, 768, 2304), (61, 3072, 192)])
def test_outputs_are_the_layers_arithmetic(m, k, n):
    """fp32 to float rounding, bf16 to its last bit, uint8 codes but for a rounding tie, + residual; row counts that
    are not a multiple of the 6-row tile and K of one step of 4 included."""
    x, w, w_scale, bias = _layer(m, k, n, seed=m + k + n)
    packed = pack(w, w_scale, 0.02, 131, bias)
    real = _real(x, w, w_scale, 0.02, 131, bias)
    out = int8_linear(x, packed)
    assert out.dtype == torch.float32 and out.shape == (m, n)
    assert ((out.double() - real).abs() / real.abs().max()).max() < 1e-6
    half = int8_linear(x, packed, out_dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16
    assert ((half.double() - real.to(torch.bfloat16).double()).abs() <= real.abs() * 2**-7).all()  # a tie: 1 ulp
    step = float(real.abs().max()) / 150  # codes 100 +- 150: both ends clamped
    codes = int8_linear(x, packed, out_dtype=torch.uint8, out_scale=step, out_zero_point=100)
    diff = (codes.int() - _codes(real, step, 100).int()).abs()
    assert diff.max() <= 1 and diff.float().mean() < 1e-3
    assert ((codes == 0) | (codes == 255)).any()  # the clamp was exercised
    resid = torch.randn(m, n)
    summed = int8_linear(x, packed, resid)
    assert ((summed.double() - real - resid.double()).abs() / real.abs().max()).max() < 1e-6
    lead = int8_linear(x.view(1, m, k), packed)  # leading dimensions kept
    assert lead.shape == (1, m, n) and torch.equal(lead[0], out)


@needs_kernel
def test_gelu_is_torchs_erf_gelu():
    """The erf GELU of the epilogue against torch's in float64 over the range a ViT's fc1 produces (and the tails):
    |error| < 2e-6 (fp32), and uint8 codes of it as the graph quantises them, but for a tie."""
    x, w, w_scale, bias = _layer(96, 256, 512, seed=3)
    packed = pack(w, w_scale * 0.5, 0.02, 128, bias * 4)
    real = _real(x, w, w_scale * 0.5, 0.02, 128, bias * 4)
    assert real.min() < -6 and real.max() > 6  # both tails
    ref = F.gelu(real)
    out = int8_linear(x, packed, gelu=True)
    assert (out.double() - ref).abs().max() < 2e-6
    codes = int8_linear(x, packed, gelu=True, out_dtype=torch.uint8, out_scale=0.03, out_zero_point=10)
    diff = (codes.int() - _codes(ref, 0.03, 10).int()).abs()
    assert diff.max() <= 1 and diff.float().mean() < 1e-3
    nan = torch.full((6, 512), float("nan"))
    assert int8_linear(x[:6], packed, nan).isnan().all()  # NaN in, NaN out (fp32 and bf16); codes 0
    assert int8_linear(x[:6], packed, nan, out_dtype=torch.bfloat16).isnan().all()
    assert (int8_linear(x[:6], packed, nan, out_dtype=torch.uint8, out_scale=0.03, out_zero_point=10) == 0).all()


@needs_kernel
@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")  # deprecated, still torch's reference
def test_codes_of_ties_infinities_and_values_past_int32():
    """uint8 codes as quantize_per_tensor makes them at the edges: ties to even, +inf and values past 2^31 steps to
    255, -inf and NaN to 0. A zero weight and bias make y the residual itself, exactly."""
    special = [float("inf"), float("-inf"), float("nan"), 1e30, -1e30, 3e9, -3e9, 2**31 * 0.5, -(2**31) * 0.5]
    ties = [(k + 0.5) * 0.5 for k in range(-110, 110, 3)]  # y / 0.5 = k + 0.5: halfway between two codes
    y = torch.tensor(special + ties + [0.1 * k for k in range(-60, 60)], dtype=torch.float32)
    y = torch.cat([y, torch.zeros(64 * 6 - len(y))]).view(6, 64)
    packed = pack(torch.zeros(64, 16, dtype=torch.int8), torch.ones(64), 0.1, 3, torch.zeros(64))
    x = torch.randint(0, 256, (6, 16), dtype=torch.uint8)
    codes = int8_linear(x, packed, y, out_dtype=torch.uint8, out_scale=0.5, out_zero_point=100)
    finite = y.isfinite() & (y.abs() < 1e4)
    assert torch.equal(codes[finite], _codes(y[finite], 0.5, 100))
    assert torch.equal(codes[finite], torch.quantize_per_tensor(y[finite], 0.5, 100, torch.quint8).int_repr())
    big = ~finite
    want = torch.where(y[big] > 0, 255, 0).to(torch.uint8)  # NaN compares False: 0
    assert torch.equal(codes[big], want)


@needs_kernel
@pytest.mark.parametrize("threads", [1, 3, 5])
def test_outputs_do_not_depend_on_how_the_work_is_shared(threads):
    """Each output tile is one work item's, whichever thread takes it (its own share, or another's left over):
    bitwise the same on 1, 3 or 5 threads as on 2, in every epilogue; shapes with few panels (rows cut in chunks)
    and many."""
    before = torch.get_num_threads()
    for m, k, n in ((197, 768, 2304), (197, 3072, 128), (13, 64, 64)):
        x, w, w_scale, bias = _layer(m, k, n, seed=n)
        packed = pack(w, w_scale, 0.02, 120, bias)
        resid = torch.randn(m, n)
        calls = (partial(int8_linear, x, packed), partial(int8_linear, x, packed, resid),
                 partial(int8_linear, x, packed, out_dtype=torch.bfloat16),
                 partial(int8_linear, x, packed, gelu=True, out_dtype=torch.uint8, out_scale=0.05, out_zero_point=7))
        try:
            torch.set_num_threads(2)
            ref = [f() for f in calls]
            torch.set_num_threads(threads)
            for _ in range(3):
                for f, r in zip(calls, ref, strict=True):
                    assert torch.equal(f(), r)
        finally:
            torch.set_num_threads(before)


@needs_kernel
def test_agrees_with_onednns_qlinear():
    """The kernel it replaces, on the same codes, weight and scales: each epilogue as the static int8 graph runs it
    (bf16 out for qkv, GELU to codes for fc1, + the residual for proj and fc2)."""
    m, k, n = 197, 768, 256
    x, w, w_scale, bias = _layer(m, k, n, seed=11)
    packed = pack(w, w_scale, 0.02, 128, bias)
    qw = torch.ops.onednn.qlinear_prepack(w, [m, k])
    zeros = torch.zeros(n, dtype=torch.int64)
    ql = partial(torch.ops.onednn.qlinear_pointwise.default, x, 0.02, 128, qw, w_scale, zeros, bias)
    theirs = ql(1.0, 0, torch.float32, "none", [], "")
    assert ((int8_linear(x, packed) - theirs).abs().max() / theirs.abs().max()) < 1e-6
    theirs = ql(0.05, 128, None, "gelu", [], "none")
    ours = int8_linear(x, packed, gelu=True, out_dtype=torch.uint8, out_scale=0.05, out_zero_point=128)
    assert (ours.int() - theirs.int()).abs().max() <= 1 and (ours != theirs).float().mean() < 1e-3
    resid = torch.randn(m, n)
    theirs = torch.ops.onednn.qlinear_pointwise.binary(x, 0.02, 128, qw, w_scale, zeros, resid.clone(), bias, 1.0, 0,
                                                       torch.float32, 1.0, 0, "sum", 1.0, "none", [], "")
    assert ((int8_linear(x, packed, resid) - theirs).abs().max() / theirs.abs().max()) < 1e-6


def test_bad_inputs_are_named():
    x, w, w_scale, bias = _layer(4, 64, 128)
    with pytest.raises(ValueError, match=r"out features a multiple of 64 and in features of 4; got \(100, 64\)"):
        pack(w[:100], w_scale[:100], 0.02, 128)
    with pytest.raises(ValueError, match=r"int8 \(out, in\) weight; got torch\.float32"):
        pack(w.float(), w_scale, 0.02, 128)
    with pytest.raises(ValueError, match="128 positive, finite weight scales"):
        pack(w, -w_scale, 0.02, 128)
    with pytest.raises(ValueError, match="positive, finite x_scale and a zero point"):
        pack(w, w_scale, 0.02, 300)
    with pytest.raises(ValueError, match=r"floating-point bias of shape \(128,\)"):
        pack(w, w_scale, 0.02, 128, bias[:5])
    packed = pack(w, w_scale, 0.02, 128, bias)
    with pytest.raises(ValueError, match="takes uint8 codes x"):
        int8_linear(x.float(), packed)
    with pytest.raises(ValueError, match="x's last dimension 32 is not the weight's 64"):
        int8_linear(x[:, :32], packed)
    with pytest.raises(ValueError, match=r"writes fp32, bf16 or uint8 codes; got out_dtype torch\.float16"):
        int8_linear(x, packed, out_dtype=torch.float16)
    with pytest.raises(ValueError, match="positive, finite out_scale"):
        int8_linear(x, packed, out_dtype=torch.uint8, out_scale=float("nan"))
    with pytest.raises(ValueError, match=r"residual must be fp32 of the output's shape \(4, 128\)"):
        int8_linear(x, packed, torch.randn(4, 64))
    with pytest.raises(ValueError, match="takes the constants `pack` makes"):
        int8_linear(x, packed._replace(zc=packed.zc.long()))


def test_refused_without_vnni(monkeypatch):
    monkeypatch.setattr(cpu, "cpu_flags", lambda cpuinfo="": frozenset({"avx2", "fma", "avx512f", "avx512bw"}))
    assert "needs AVX512-VNNI; this CPU lacks avx512dq, avx512vl, avx512_vnni" in int8_linear_unavailable()
    x, w, w_scale, _ = _layer(4, 64, 64)
    with pytest.raises(RuntimeError, match="needs AVX512-VNNI"):
        int8_linear(x, pack(w, w_scale, 0.02, 128))


@needs_kernel
def test_the_op_runs_a_cpp_kernel_that_checks_its_inputs():
    x, w, w_scale, bias = _layer(4, 64, 64)
    p = pack(w, w_scale, 0.02, 128, bias)
    INT8_LINEAR(x, *p, None, False, torch.float32, 1.0, 0)
    assert torch._C._dispatch_has_kernel_for_dispatch_key("vitlab::int8_linear", "CPU")
    with pytest.raises(RuntimeError, match="is not the weight's K"):
        INT8_LINEAR(x[:, :32], *p, None, False, torch.float32, 1.0, 0)
    with pytest.raises(RuntimeError, match="int32 zc and fp32 scale and bias"):
        INT8_LINEAR(x, p.weight, p.zc, p.scale[:8], p.bias, None, False, torch.float32, 1.0, 0)
    with pytest.raises(RuntimeError, match="writes fp32, bf16 or uint8 codes"):
        INT8_LINEAR(x, *p, None, False, torch.float16, 1.0, 0)


@needs_kernel
def test_rewrite_puts_the_kernel_in_with_each_epilogue_and_leaves_the_rest():
    """quant.int8_linears_in on a PT2E-shaped graph: a linear into GELU into a static uint8 quantise (fc1), one into a
    residual add (fc2), a plain one (its output in the dtype asked), and one it does not take (out features not a
    multiple of 64: left to oneDNN). The rewritten graph computes what the original did, and no longer holds the int8
    originals of the weights it packed."""
    pytest.importorskip("torchao")
    import torchao.quantization.pt2e  # noqa: F401  registers torch.ops.quantized_decomposed

    from vitlab.deploy.quant import int8_linears_in

    qd, aten = torch.ops.quantized_decomposed, torch.ops.aten
    g = torch.Generator().manual_seed(5)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for name, (n, k) in {"w1": (128, 64), "w2": (64, 128), "w3": (100, 64)}.items():
                self.register_buffer(name, torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g))
                self.register_buffer(name + "_s", torch.rand(n, generator=g) * 0.01 + 1e-3)
                self.register_buffer(name + "_z", torch.zeros(n, dtype=torch.int64))
                self.register_buffer(name + "_b", torch.randn(n, generator=g))

        def w(self, name):
            return qd.dequantize_per_channel.default(getattr(self, name), getattr(self, name + "_s"),
                                                     getattr(self, name + "_z"), 0, -128, 127, torch.int8)

        def forward(self, x):  # x: (B, 64) fp32
            xq = qd.quantize_per_tensor.default(x, 0.03, 120, 0, 255, torch.uint8)
            x1 = qd.dequantize_per_tensor.default(xq, 0.03, 120, 0, 255, torch.uint8)
            h = aten.dropout.default(aten.gelu.default(aten.linear.default(x1, self.w("w1"), self.w1_b)), 0.0, False)
            hq = qd.quantize_per_tensor.default(h, 0.02, 10, 0, 255, torch.uint8)
            h1 = qd.dequantize_per_tensor.default(hq, 0.02, 10, 0, 255, torch.uint8)
            r = aten.add.Tensor(x, aten.linear.default(h1, self.w("w2"), self.w2_b))  # the residual stream
            plain = aten.linear.default(x1, self.w("w1"), self.w1_b)
            other = aten.linear.default(x1, self.w("w3"), self.w3_b)
            return r, plain, other

    net = Net()
    x = torch.randn(9, 64)
    gm = torch.export.export(net, (x,)).module()  # as quantize_static's graph is made
    with torch.no_grad():
        before = gm(x)
    assert int8_linears_in(gm, torch.bfloat16) == 3
    targets = [n.target for n in gm.graph.nodes]
    assert targets.count(torch.ops.vitlab.int8_linear.default) == 3
    assert targets.count(aten.linear.default) == 1  # the 100-feature one
    assert aten.gelu.default not in targets and aten.add.Tensor not in targets
    assert not hasattr(gm, "w2")  # packed, the original dropped (w1 is packed twice; w3 is still read)
    with torch.no_grad():
        after = gm(x)
    assert (after[0] - before[0]).abs().max() < 1e-3 * before[0].abs().max()  # residual: fp32
    assert after[1].dtype == torch.bfloat16  # the plain linear in the dtype asked
    assert (after[1].float() - before[1]).abs().max() <= 2**-7 * before[1].abs().max()
    assert torch.equal(after[2], before[2])
