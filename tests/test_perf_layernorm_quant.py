"""vitlab.perf.layernorm_quant: LayerNorm + per-tensor uint8 quantise in one pass, against torch's own layer_norm and
the PT2E quantise it replaces; its refusals; the graph rewrite that puts it in static int8 graphs (vitlab.deploy.quant);
and vitlab.perf.native, which builds it and registers it as a C++ kernel."""

import pytest
import torch
import torch.nn.functional as F

from vitlab.perf import cpu, native
from vitlab.perf.layernorm_quant import LAYER_NORM_QUANTIZED, layer_norm_quantized, layer_norm_quantized_unavailable

needs_kernel = pytest.mark.skipif(layer_norm_quantized_unavailable() is not None,
                                  reason=f"{layer_norm_quantized_unavailable()}")


def _reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float, scale: float, zp: int) -> torch.Tensor:
    """torch's layer_norm (fp32) and quantize_per_tensor's arithmetic: clamp(round(y * (1 / scale)) + zp, 0, 255)."""
    y = F.layer_norm(x.float(), (x.shape[-1],), w, b, eps)
    return torch.clamp(torch.round(y * (1.0 / scale)) + zp, 0, 255).to(torch.uint8)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 16), (37, 40), (2, 197, 192), (3, 768), (5, 1000), (4, 7)])
def test_codes_are_torchs_layer_norm_quantised(shape, dtype):
    g = torch.Generator().manual_seed(sum(shape))
    d = shape[-1]
    x = (torch.randn(shape, generator=g) * 3 + torch.randn((*shape[:-1], 1), generator=g) * 5).to(dtype)
    w, b = torch.randn(d, generator=g), torch.randn(d, generator=g) * 0.5
    out = layer_norm_quantized(x, w, b, 1e-6, 0.01, 120)
    ref = _reference(x, w, b, 1e-6, 0.01, 120)
    assert out.dtype == torch.uint8 and out.shape == x.shape
    diff = (out.int() - ref.int()).abs()
    assert diff.max() <= 1  # a rounding tie may fall either way (sums in another order)
    assert diff.float().mean() < 1e-3
    assert ((ref == 0) | (ref == 255)).any()  # the clamp was exercised


@needs_kernel
def test_matches_the_graph_it_replaces_and_takes_views():
    """The PT2E graph's own ops, quantize_per_tensor(layer_norm(x)), on a non-contiguous x (copied by the kernel);
    a row with a NaN or an infinity gives 0s, the other rows are untouched; eps is the one given."""
    pytest.importorskip("torchao")
    import torchao.quantization.pt2e  # noqa: F401  registers torch.ops.quantized_decomposed

    qd = torch.ops.quantized_decomposed
    x = torch.randn(64, 96).t()  # (96, 64), rows strided
    w, b = torch.rand(64) + 0.5, torch.randn(64)
    ref = qd.quantize_per_tensor.default(F.layer_norm(x, (64,), w, b, 0.5), 0.05, 128, 0, 255, torch.uint8)
    assert (layer_norm_quantized(x, w, b, 0.5, 0.05, 128).int() - ref.int()).abs().max() <= 1
    bad = x.contiguous()
    bad[3, 5], bad[7, 0] = float("nan"), float("inf")
    out = layer_norm_quantized(bad, w, b, 0.5, 0.05, 128)
    assert out[3].eq(0).all() and out[7].eq(0).all()
    keep = [i for i in range(96) if i not in (3, 7)]
    assert torch.equal(out[keep], layer_norm_quantized(x.contiguous()[keep], w, b, 0.5, 0.05, 128))
    assert layer_norm_quantized(x[:0], w, b, 0.5, 0.05, 128).shape == (0, 64)


def test_bad_inputs_are_named():
    x, w = torch.randn(4, 32), torch.randn(32)
    with pytest.raises(ValueError, match=r"fp32 weight and bias of shape \(32,\)"):
        layer_norm_quantized(x, w[:16], w, 1e-6, 0.1, 0)
    with pytest.raises(ValueError, match=r"fp32 weight and bias"):
        layer_norm_quantized(x, w.double(), w, 1e-6, 0.1, 0)
    with pytest.raises(ValueError, match="fp32 or bf16 x"):
        layer_norm_quantized(x.half(), w, w, 1e-6, 0.1, 0)
    for scale, zp, eps in ((0.0, 0, 1e-6), (float("nan"), 0, 1e-6), (float("inf"), 0, 1e-6), (0.1, 256, 1e-6),
                           (0.1, -1, 1e-6), (0.1, 0, -1.0)):
        with pytest.raises(ValueError, match="positive, finite scale, a zero point in"):
            layer_norm_quantized(x, w, w, eps, scale, zp)


def test_refused_without_avx512(monkeypatch):
    monkeypatch.setattr(cpu, "cpu_flags", lambda cpuinfo="": frozenset({"avx2", "fma"}))
    assert "needs AVX-512; this CPU lacks avx512f" in layer_norm_quantized_unavailable()
    x, w = torch.randn(4, 32), torch.randn(32)
    with pytest.raises(RuntimeError, match="needs AVX-512; this CPU lacks"):
        layer_norm_quantized(x, w, w, 1e-6, 0.1, 0)


@needs_kernel
def test_the_op_runs_a_cpp_kernel_once_loaded():
    """Calling the op loads its library (the Python fallback), after which the CPU kernel is the C++ one: a compiled
    graph's C++ wrapper reaches it without Python. The C++ kernel checks its inputs too."""
    x, w = torch.randn(4, 32), torch.randn(32)
    LAYER_NORM_QUANTIZED(x, w, w, 1e-6, 0.1, 3)
    assert torch._C._dispatch_has_kernel_for_dispatch_key("vitlab::layer_norm_quantized", "CPU")
    with pytest.raises(RuntimeError, match="fp32 weight and bias of x's last dimension"):
        LAYER_NORM_QUANTIZED(x, w[:8], w, 1e-6, 0.1, 3)
    with pytest.raises(RuntimeError, match="positive, finite scale"):
        LAYER_NORM_QUANTIZED(x, w, w, 1e-6, -0.1, 3)


def test_a_library_that_does_not_build_is_one_line(monkeypatch, tmp_path):
    """A C++ file that does not compile: one RuntimeError naming it, not the compiler's pages."""
    import importlib.resources

    bad = tmp_path / "broken.cpp"
    bad.write_text("this is not C++ at all;\n")
    shared = importlib.resources.files("vitlab.perf").joinpath("native.h")  # what load puts first: it builds
    (tmp_path / "native.h").write_text(shared.read_text(encoding="utf-8"))
    monkeypatch.setattr(importlib.resources, "files", lambda pkg: tmp_path)
    native.load.cache_clear()
    try:
        with pytest.raises(RuntimeError, match=r"could not build vitlab's broken.cpp kernels") as e:
            native.load("broken.cpp")
        assert "\n" not in str(e.value)
    finally:
        native.load.cache_clear()


def test_the_fallback_refuses_other_devices():
    x = torch.randn(4, 32, device="meta")
    run = native.cpu_fallback("layernorm_quant.cpp", LAYER_NORM_QUANTIZED)
    with pytest.raises(ValueError, match="runs on the CPU; got tensors on meta"):
        run(x, x[0], x[0], 1e-6, 0.1, 0)


def test_rewrite_fuses_only_a_private_layer_norm_to_a_static_uint8_quantise():
    """The fold needs the LayerNorm's only reader to be a static uint8 [0, 255] quantise, over the last dimension
    with fp32 weight and bias; the fused graph gives the codes the unfused one gives (where the kernel runs)."""
    pytest.importorskip("torchao")
    import torchao.quantization.pt2e  # noqa: F401  registers torch.ops.quantized_decomposed

    from vitlab.deploy.quant import layer_norm_quantized_in

    qd, aten = torch.ops.quantized_decomposed, torch.ops.aten

    class Net(torch.nn.Module):
        def __init__(self, kind):
            super().__init__()
            self.kind, self.ln = kind, torch.nn.LayerNorm(48, eps=1e-6)
            with torch.no_grad():
                self.ln.weight.uniform_(0.5, 1.5)
                self.ln.bias.normal_()

        def forward(self, x):
            y = aten.layer_norm.default(x, [48], self.ln.weight, self.ln.bias, 1e-6)
            if self.kind == "signed":  # int8 codes: not what the kernel writes
                return qd.quantize_per_tensor.default(y, 0.02, 0, -128, 127, torch.int8)
            q = qd.quantize_per_tensor.default(y, 0.02, 128, 0, 255, torch.uint8)
            return (q, y) if self.kind == "also_read" else q  # the float output read too: nothing to fuse

    x = torch.randn(2, 5, 48)
    for kind, expected in (("fused", 1), ("also_read", 0), ("signed", 0)):
        net = Net(kind)
        gm = torch.export.export(net, (x,)).module()
        ref = gm(x)
        assert layer_norm_quantized_in(gm) == expected, kind
        targets = {n.target for n in gm.graph.nodes}
        assert (LAYER_NORM_QUANTIZED in targets) == bool(expected)
        assert (aten.layer_norm.default in targets) == (not expected)
        if expected and layer_norm_quantized_unavailable() is None:
            out = gm(x)
            assert out.dtype == torch.uint8 and (out.int() - ref.int()).abs().max() <= 1
