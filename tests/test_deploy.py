"""vitlab.deploy: OpenVINO and ONNX Runtime modules compute our model's function (fp32: PyTorch's logits at batch
sizes they were not built with), int8 graphs are really quantised and still agree with PyTorch on real images, and
bad inputs are named. The reference throughout is the PyTorch model itself."""

import logging
import os
import sys

import numpy as np
import pytest
import torch

import vitlab
from vitlab.deploy.optimize import OptimizedModel
from vitlab.utils.extras import MissingExtraError

from .conftest import FMNIST_ROOT, perturb_, skip_if_emulated

ov = pytest.importorskip("openvino")
pytest.importorskip("nncf")
pytest.importorskip("onnxruntime")

from vitlab.deploy.runtimes import (  # noqa: E402
    calibration_batches,
    compile_openvino,
    onnx_file,
    openvino_model,
    ort_int8_format,
    ort_session,
    to_onnxruntime,
    to_openvino,
)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    m = vitlab.create_model("ViT-Ti/16", depth=2, img_size=28, patch_size=7, in_chans=1, num_classes=10)
    return perturb_(m, scale=0.05).eval()


@pytest.fixture(scope="module")
def fmnist():
    """(calibration images from the train split, test images): real Fashion-MNIST, as the model takes them."""
    from vitlab.data import DataConfig, build_eval_data

    if not os.path.isdir(FMNIST_ROOT):
        pytest.skip("dataset-fashion-mnist not installed")
    cfg = DataConfig(dataset="fashion_mnist", root=FMNIST_ROOT)
    calib = next(iter(build_eval_data(cfg, "train", img_size=28, in_chans=1, batch_size=64)))[0]
    test = next(iter(build_eval_data(cfg, "test", img_size=28, in_chans=1, batch_size=200)))[0]
    return calib, test


def _logits(model, x):
    with torch.no_grad():
        return model(x)


@pytest.mark.parametrize("build", [to_openvino, to_onnxruntime], ids=["openvino", "onnxruntime"])
def test_fp32_runtimes_compute_our_logits_at_any_batch(tiny, build):
    fast = build(tiny, torch.randn(2, 1, 28, 28))
    assert isinstance(fast, OptimizedModel) and fast.mode in ("openvino", "ort")
    for b in (1, 5):  # built with batch 2: the batch dimension is dynamic
        x = torch.randn(b, 1, 28, 28)
        ref = _logits(tiny, x)
        out = fast(x)
        assert out.dtype == torch.float32 and out.shape == (b, 10)
        assert ref.abs().max() > 0.1
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-4)
    torch.testing.assert_close(fast(x.to(torch.bfloat16)), _logits(tiny, x.to(torch.bfloat16).float()), rtol=0,
                               atol=1e-4)  # the fp32-in contract: any float images are taken as fp32
    with pytest.raises(RuntimeError, match="inference only"):
        fast.train()
    with pytest.raises(ValueError, match=r"\(B, 1, 28, 28\)"):
        fast(torch.randn(2, 3, 28, 28))


@skip_if_emulated
def test_openvino_bf16_is_bf16(tiny):
    graph = openvino_model(tiny, torch.randn(2, 1, 28, 28))
    if "BF16" not in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        with pytest.raises(ValueError, match="bf16"):
            compile_openvino(graph, precision="bf16")
        return
    compiled = compile_openvino(graph, precision="bf16")
    x = torch.randn(8, 1, 28, 28)
    ref = _logits(tiny, x)
    diff = np.abs(compiled(x.numpy())[0] - ref.numpy()).max()
    assert 1e-5 < diff < 0.1 * ref.abs().max().item()  # bf16 rounding: not fp32, not another model


@pytest.mark.parametrize("runtime", ["openvino", "onnxruntime"])
def test_int8_runtimes_quantise_and_agree_on_real_images(tiny, fmnist, runtime, tmp_path):
    calib, test = fmnist
    example = test[:2]
    root = (logging.root.level, len(logging.root.handlers))
    if runtime == "openvino":
        graph = openvino_model(tiny, example, int8=True, calib=calib)
        assert "FakeQuantize" in {op.get_type_name() for op in graph.get_ops()}  # NNCF's int8 marks
        compiled = compile_openvino(graph)
        out = torch.from_numpy(compiled(test.numpy())[0])
    else:
        import onnx

        path = onnx_file(tiny, example, tmp_path, int8=True, calib=calib)
        kinds = {n.op_type for n in onnx.load(str(path)).graph.node}
        assert {"QuantizeLinear", "DequantizeLinear"} <= kinds  # static QDQ: activations quantised too
        out = torch.from_numpy(ort_session(path).run(["logits"], {"images": test.numpy()})[0])
    ref = _logits(tiny, test)
    agreement = (ref.argmax(1) == out.argmax(1)).float().mean().item()
    diff = (out - ref).abs().max().item()
    assert agreement >= 0.85, agreement  # another model would agree on ~1 in 10
    assert diff > 1e-3  # int8 rounding shows: the graph is not fp32 in disguise
    assert (logging.root.level, len(logging.root.handlers)) == root  # the quantisers' logging set-up: undone


def test_bad_inputs_are_named(tiny, monkeypatch):
    x = torch.randn(2, 1, 28, 28)
    root = (logging.root.level, list(logging.root.handlers))
    with pytest.raises(ValueError, match="calibration images"):
        to_openvino(tiny, x, int8=True)
    with pytest.raises(ValueError, match=r"channel.*\(3, 28, 28\).*\(1, 28, 28\)"):
        to_openvino(tiny, x, int8=True, calib=torch.randn(4, 3, 28, 28))
    with pytest.raises(ValueError, match=r"shape \(1, 32, 32\)"):
        to_onnxruntime(tiny, x, int8=True, calib=torch.randn(4, 1, 32, 32))
    with pytest.raises(ValueError, match="float images"):
        calibration_batches(torch.zeros(4, 1, 28, 28, dtype=torch.uint8), (1, 28, 28))
    with pytest.raises(ValueError, match="no images"):
        calibration_batches([], (1, 28, 28))
    with pytest.raises(ValueError, match="in_chans=1"):
        to_openvino(tiny, torch.randn(2, 3, 28, 28))
    with pytest.raises(ValueError, match="unknown OpenVINO precision"):
        to_openvino(tiny, x, precision="fp8")
    with pytest.raises(ValueError, match="fp32 model"):
        to_onnxruntime(vitlab.create_model("ViT-Ti/16", depth=1, img_size=28, patch_size=7, in_chans=1,
                                           num_classes=10).to(torch.bfloat16), x)

    class Untraceable(torch.nn.Module):  # returns a Python number: nothing a graph can express
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, x):
            return float((x * self.w).sum())

    with pytest.raises(ValueError, match="OpenVINO cannot convert this model: "):
        to_openvino(Untraceable(), x)
    with pytest.raises(ValueError, match="takes a vitlab model"):
        to_onnxruntime(Untraceable(), x)
    # the converters' failed attempts reconfigure the root logger (level ERROR): undone, so the caller's warnings
    # (vitlab's own among them) still reach the caller's handlers
    assert (logging.root.level, list(logging.root.handlers)) == root
    monkeypatch.setitem(sys.modules, "openvino", None)  # as if not installed
    with pytest.raises(MissingExtraError, match=r"pip install 'vitlab\[openvino\]'"):
        to_openvino(tiny, x)


def test_calibration_takes_batches_and_pairs_up_to_the_limit():
    data = [(torch.randn(3, 1, 8, 8), torch.zeros(3)), torch.randn(4, 1, 8, 8)]  # (images, labels) and bare
    out = calibration_batches(data, (1, 8, 8), limit=5)
    assert len(out) == 5 and all(a.shape == (1, 1, 8, 8) and a.dtype == np.float32 for a in out)
    np.testing.assert_array_equal(out[3][0], data[1][0].numpy())


# -- ONNX Runtime int8 on CPUs without VNNI (issue 25) ------------------------------------------------------------


@pytest.mark.parametrize("flags,machine,seven_bits,why", [
    ({"sse4_1", "avx2", "fma"}, "x86_64", True, "no VNNI"),  # the 2-core AVX2-only EPYC of issue 25
    ({"avx2", "avx512f", "avx512bw"}, "x86_64", True, "no VNNI"),  # AVX-512 without VNNI (Skylake-SP)
    (set(), "AMD64", True, "no VNNI"),  # x86 whose flags cannot be read: the safe side
    ({"avx2", "avx512f", "avx512_vnni"}, "x86_64", False, "has avx512_vnni"),
    ({"avx2", "avx_vnni"}, "x86_64", False, "has avx_vnni"),  # AVX-VNNI without AVX-512 (Alder Lake)
    ({"avx512_vnni", "amx_int8"}, "x86_64", False, "has avx512_vnni, amx_int8"),
    (set(), "aarch64", False, "not x86"),
])
def test_ort_int8_weights_take_7_bits_on_x86_without_vnni(flags, machine, seven_bits, why, tmp_path):
    fmt = ort_int8_format(flags, machine)
    assert (fmt.activations, fmt.weights, fmt.reduce_range) == ("QUInt8", "QInt8", seven_bits)
    assert why in fmt.reason and ("S8 weights in 7 bits (reduce_range)" in str(fmt)) == seven_bits
    from vitlab.perf.precision import cpu_flags

    info = tmp_path / "cpuinfo"  # the helper reads Linux's flags line (one per core; the first one counts)
    info.write_text("".join(f"processor\t: {i}\nflags\t\t: fpu {' '.join(sorted(flags))}\n\n" for i in range(2)))
    assert ort_int8_format(cpu_flags(str(info)), machine) == fmt
    assert cpu_flags(str(tmp_path / "missing")) == frozenset()


def _weights_int8_range(path) -> tuple[int, int]:
    """The (min, max) of the quantised weight matrices (int8 initialisers of 2+ dims) of a QDQ graph."""
    import onnx
    from onnx import numpy_helper

    ws = [numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer
          if t.data_type == onnx.TensorProto.INT8 and len(t.dims) >= 2]
    assert ws, "no int8 weights: not quantised"
    return min(int(w.min()) for w in ws), max(int(w.max()) for w in ws)


def test_ort_int8_without_vnni_is_still_our_model(tmp_path, caplog):
    """The no-VNNI format forced on this host (which has VNNI): 7-bit weights, and the logits still correlate with
    fp32 as `vitlab bench` requires (r > 0.9; the 8-bit format saturated to r = 0.869 on an AVX2-only EPYC). An AVX2
    host computes the same numbers from this graph: its int16 pair sums, 2 x 255 x 64, cannot saturate."""
    from vitlab.data import DataConfig, build_eval_data

    torch.manual_seed(0)  # the model and data of tests/test_bench_runtimes.py's bench run
    model = vitlab.create_model("ViT-Ti/16", depth=1, img_size=28, patch_size=7, in_chans=1, num_classes=10).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    cfg = DataConfig(dataset="synthetic")
    calib = next(iter(build_eval_data(cfg, "train", img_size=28, in_chans=1, batch_size=16)))[0]
    test = next(iter(build_eval_data(cfg, "test", img_size=28, in_chans=1, batch_size=16)))[0]
    ref = _logits(model, test)

    def correlation(out):
        return torch.corrcoef(torch.stack([out.flatten(), ref.flatten()]))[0, 1].item()

    forced, host = ort_int8_format(set(), "x86_64"), ort_int8_format()
    for name, fmt in (("forced", forced), ("host", host)):
        path = onnx_file(model, test[:2], tmp_path / name, int8=True, calib=calib, int8_format=fmt)
        lo, hi = _weights_int8_range(path)
        if fmt.reduce_range:
            assert max(-lo, hi) <= 64, (lo, hi)  # 7 bits: ORT's symmetric weight range is [-64, 64]
        else:
            assert hi - lo > 127, (lo, hi)  # all 8 bits used: the forced graph differs from the host's
        out = torch.from_numpy(ort_session(path).run(["logits"], {"images": test.numpy()})[0])
        assert correlation(out) > 0.9, (name, correlation(out))
        assert (out - ref).abs().max().item() > 1e-3  # int8 rounding shows: not the fp32 graph
    with caplog.at_level(logging.INFO, logger="vitlab.deploy"):
        fast = to_onnxruntime(model, test[:2], int8=True, calib=calib, int8_format=forced)
    assert fast.module.int8_format == forced and "reduce_range" in repr(fast)  # the choice is visible ...
    assert f"ONNX Runtime int8 (static): {forced}" in caplog.text  # ... and logged, with its reason
    assert correlation(_logits(fast, test)) > 0.9


def test_openvino_int8_quantises_a_vit_as_a_transformer(tiny, monkeypatch):
    """NNCF is told the model is a transformer (`model_type=TRANSFORMER`: 99.4% against 98.9% top-1 agreement with
    fp32 on Zen 4, same speed); a model that is not a ViT keeps NNCF's defaults."""
    import nncf

    seen = []
    monkeypatch.setattr(nncf, "quantize", lambda model, data, **kw: seen.append(kw) or model)
    calib = torch.randn(4, 1, 28, 28)
    openvino_model(tiny, calib[:1], int8=True, calib=calib)
    assert seen[-1]["model_type"] == nncf.ModelType.TRANSFORMER
    conv = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(2))
    conv(calib[:1])
    openvino_model(conv.eval(), calib[:1], int8=True, calib=calib)
    assert "model_type" not in seen[-1]
