"""ONNX and OpenVINO export: the runtime reproduces PyTorch's logits within 1e-4 at batch sizes the graph was not
traced with; the OpenVINO IR records the precision it was checked at."""

import re
import sys

import numpy as np
import pytest
import torch

import vitlab
from vitlab.deploy.export import export_onnx
from vitlab.utils.io import default_mode

from .conftest import perturb_

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")


def _tiny(**kw):
    cfg = dict(depth=2, img_size=32, patch_size=8, num_classes=10)
    cfg.update(kw)
    return perturb_(vitlab.create_model("ViT-Ti/16", **cfg)).eval()


def _ort_logits(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(["logits"], {"images": x.numpy()})[0]


@pytest.mark.slow
@pytest.mark.parametrize("act, approximate", [("gelu", "none"), ("gelu_tanh", "tanh")])
def test_onnx_matches_torch_with_dynamic_batch(tmp_path, act, approximate):
    model = _tiny(act=act)
    report = export_onnx(model, tmp_path / "vit.onnx", verify_batches=())
    # GELU as ONNX's one Gelu op (opset 20), of the model's kind: the form ONNX Runtime runs fastest (DEFAULT_OPSET)
    graph = onnx.load(tmp_path / "vit.onnx").graph
    gelus = [n for n in graph.node if n.op_type == "Gelu"]
    assert len(gelus) == 2 and not [n for n in graph.node if n.op_type == "Erf"]
    kinds = {next((a.s.decode() for a in n.attribute if a.name == "approximate"), "none") for n in gelus}
    assert kinds == {approximate}
    assert report.input_shape[0] == "batch"
    assert (tmp_path / "vit.onnx").stat().st_mode & 0o777 == default_mode()  # the usual permissions
    for b in (1, 3):  # the exporter traced batch 2: both sizes exercise the symbolic batch
        x = torch.randn(b, 3, 32, 32)
        with torch.no_grad():
            ref = model(x).numpy()
        assert np.abs(ref).max() > 1e-3  # a perturbed head: the logits are not trivially zero
        out = _ort_logits(tmp_path / "vit.onnx", x)
        assert out.shape == (b, 10)
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-4)


@pytest.mark.slow
def test_cli_exports_a_saved_checkpoint_and_refuses_to_overwrite(tmp_path, capsys):
    from vitlab.cli import main

    model = _tiny(pool="gap", class_token=False, in_chans=1, img_size=(32, 24))
    ckpt = vitlab.save_weights(model, tmp_path / "m.safetensors")
    out = tmp_path / "m.onnx"
    assert main(["export", str(ckpt), str(out)]) == 0
    assert "batch 3:" in capsys.readouterr().out
    x = torch.randn(3, 1, 32, 24)
    with torch.no_grad():
        np.testing.assert_allclose(_ort_logits(out, x), model(x).numpy(), rtol=0, atol=1e-4)
    before = out.read_bytes()
    assert main(["export", str(ckpt), str(out)]) == 1  # exists: refused, file untouched
    assert "already exists" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_export_options_and_the_thin_functions_agree(tmp_path):
    """`export(model, path, ...)` with an `ExportOptions` (the CLI's way), its fields as keywords (export_onnx's),
    and the target from the suffix; export_openvino refuses ONNX's opset by name."""
    from vitlab.deploy.export import ExportOptions, export, export_openvino

    model = _tiny()
    a = export(model, tmp_path / "a.onnx", options=ExportOptions(verify_batches=(2,)))
    b = export_onnx(model, tmp_path / "b.onnx", verify_batches=(2,))
    assert a.target == b.target == "onnx" and set(a.max_abs_diff) == set(b.max_abs_diff) == {2}
    with pytest.raises(TypeError, match="opset"):
        export_openvino(model, tmp_path / "c.xml", opset=17)
    with pytest.raises(TypeError, match="no_such_option"):
        export_onnx(model, tmp_path / "d.onnx", no_such_option=1)
    with pytest.raises(ValueError, match="unknown export target"):
        export(model, tmp_path / "e.onnx", to="tflite")


@pytest.mark.slow
def _in_fresh_process(check: str, tmp_path) -> None:
    """Run `check(tmp_path)` of this module in a new interpreter: OpenVINO compiled at its default (bf16 on CPUs with
    native bf16) left this test process to die of SIGSEGV later, in an unrelated test's subprocess.run (torch
    2.14.1, openvino 2026.4.1, Zen 4; not narrowed further), so the plain-OpenVINO checks run apart."""
    import subprocess

    code = f"import sys; from tests import test_export as t; t.{check}(__import__('pathlib').Path(sys.argv[1]))"
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=600,
                       cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    assert r.returncode == 0, r.stderr[-3000:]


def test_openvino_ir_records_the_precision_it_was_checked_at(tmp_path):
    """Fault 2 of issue 36: on a CPU with native bf16 plain OpenVINO runs an IR at bf16 (logits ~1e-2 off). The IR
    records fp32 (rt_info runtime_options/INFERENCE_PRECISION_HINT = f32, read back by plain openvino), and the
    export measures what `compile_model(path, "CPU")` with no config gives and says so: within 1e-4 where that is
    f32, else the summary names the config that gives the checked results, and that config does."""
    pytest.importorskip("openvino")
    _in_fresh_process("_check_recorded_precision", tmp_path)


def _check_recorded_precision(tmp_path):
    import openvino as ov

    from vitlab.deploy.export import export_openvino

    model = _tiny()
    report = export_openvino(model, tmp_path / "vit.xml")
    ir = ov.Core().read_model(str(tmp_path / "vit.xml"))
    assert ir.get_rt_info(["runtime_options", "INFERENCE_PRECISION_HINT"]).astype(str) == "f32"
    assert report.runtime_precision == "fp32" and "INFERENCE_PRECISION_HINT = f32" in report.summary()
    compiled = ov.Core().compile_model(str(tmp_path / "vit.xml"), "CPU")  # as a plain OpenVINO user would
    plain = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        ref = model(x).numpy()
    assert report.plain_precision == {"f32": "fp32"}.get(plain, plain)
    if plain == "f32":  # the IR's precision applies (or the CPU has no native bf16)
        assert report.plain_matches
        np.testing.assert_allclose(compiled(x.numpy())[0], ref, rtol=0, atol=1e-4)
    else:  # this OpenVINO's CPU plugin does not apply it: the report says so, and how to compile
        assert not report.plain_matches and report.plain_max_abs_diff > 1e-4
        assert 'compile with {"INFERENCE_PRECISION_HINT": "f32"}' in report.summary()
        hint = ir.get_rt_info(["runtime_options", "INFERENCE_PRECISION_HINT"]).astype(str)
        pinned = ov.Core().compile_model(str(tmp_path / "vit.xml"), "CPU", {"INFERENCE_PRECISION_HINT": hint})
        np.testing.assert_allclose(pinned(x.numpy())[0], ref, rtol=0, atol=1e-4)


@pytest.mark.slow
@pytest.mark.xfail(reason="OpenVINO 2026.4's CPU plugin reads only KV-cache and dynamic-quantisation options from "
                          "an IR's runtime_options (Config::applyRtInfo); passes where the CPU has no native bf16 "
                          "or a later OpenVINO applies INFERENCE_PRECISION_HINT", strict=False)
def test_plain_openvino_runs_the_ir_at_the_recorded_precision(tmp_path):
    pytest.importorskip("openvino")
    _in_fresh_process("_check_plain_precision", tmp_path)


def _check_plain_precision(tmp_path):
    import openvino as ov

    from vitlab.deploy.export import export_openvino

    model = _tiny()
    export_openvino(model, tmp_path / "vit.xml", verify_batches=())
    compiled = ov.Core().compile_model(str(tmp_path / "vit.xml"), "CPU")
    assert compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name() == "f32"
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        np.testing.assert_allclose(compiled(x.numpy())[0], model(x).numpy(), rtol=0, atol=1e-4)


def test_bad_inputs_are_named(tmp_path):
    model = _tiny()
    with pytest.raises(ValueError, match=r"\.onnx"):
        export_onnx(model, tmp_path / "vit.pt")
    with pytest.raises(ValueError, match="fp32"):
        export_onnx(model.to(torch.bfloat16), tmp_path / "vit.onnx")
    (tmp_path / "x.onnx").write_bytes(b"mine")
    with pytest.raises(FileExistsError):
        export_onnx(_tiny(), tmp_path / "x.onnx")
    assert (tmp_path / "x.onnx").read_bytes() == b"mine"


@pytest.mark.slow
def test_an_opset_the_exporter_cannot_write_is_refused_not_replaced(tmp_path):
    """torch.onnx keeps its graph at opset 18 where its version converter cannot reach the opset asked for (e.g. 12):
    the file would silently say 18. Refused by name, nothing written; an opset it can write is what the file says."""
    model = _tiny(depth=1)
    for opset in (12, 0):
        with pytest.raises(ValueError, match=f"opset {opset}" if opset else "positive integer"):
            export_onnx(model, tmp_path / f"o{opset}.onnx", opset=opset, verify_batches=())
        assert not (tmp_path / f"o{opset}.onnx").exists()
    export_onnx(model, tmp_path / "o17.onnx", opset=17, verify_batches=(1,))
    assert [o.version for o in onnx.load(tmp_path / "o17.onnx").opset_import if o.domain in ("", "ai.onnx")] == [17]


def test_a_graph_onnx_runtime_cannot_load_is_named_and_not_written(tmp_path, monkeypatch):
    """ONNX Runtime refusing the written graph (an opset newer than the installed one reads, say) is one ValueError
    naming the runtime and the opset, not its multi-line report; the staged file is not placed."""
    from vitlab.deploy import export as export_mod

    def refuse(path, threads=None):
        raise RuntimeError("[ONNXRuntimeError] : 10 : INVALID_GRAPH : Load model failed\nmore detail")

    monkeypatch.setattr(export_mod, "ort_session", refuse)
    with pytest.raises(ValueError, match=r"ONNX Runtime .* cannot load the opset-20 graph written \(\[ONNXRuntime"):
        export_onnx(_tiny(depth=1), tmp_path / "v.onnx")
    assert not (tmp_path / "v.onnx").exists()


# -- int8 and OpenVINO through `vitlab export` -------------------------------------------------------------


def _run_dir(tmp_path):
    """A checkpoint with the recipe.yaml a training run writes beside it (data: the synthetic set, 1 x 28 x 28)."""
    run = tmp_path / "run"
    run.mkdir()
    model = _tiny(in_chans=1, img_size=28, patch_size=7)
    ckpt = vitlab.save_weights(model, run / "model.safetensors")
    (run / "recipe.yaml").write_text("data:\n  dataset: synthetic\n  num_samples: 256\n")
    return model, ckpt


@pytest.mark.slow
@pytest.mark.parametrize("target", ["openvino", "onnx"])
def test_cli_int8_calibrates_on_the_recipe_data_and_verifies(tmp_path, capsys, target):
    pytest.importorskip("openvino" if target == "openvino" else "onnxruntime")
    pytest.importorskip("nncf" if target == "openvino" else "onnx")
    from vitlab.cli import main

    model, ckpt = _run_dir(tmp_path)
    out = tmp_path / ("m.xml" if target == "openvino" else "m.onnx")
    assert main(["export", str(ckpt), str(out), "--to", target, "--int8", "--calib-images", "32",
                 "--verify-images", "64", "--min-agreement", "0"]) == 0
    text = capsys.readouterr().out
    assert "calibrating on 32 images of synthetic/train" in text
    assert re.search(r"on \d+ images of synthetic/test .*: top-1 agreement \d", text) and f"{target} int8" in text
    from vitlab.data import DataConfig, build_eval_data

    x = next(iter(build_eval_data(DataConfig(dataset="synthetic", num_samples=256), "test", img_size=28, in_chans=1,
                                  batch_size=16)))[0]  # images like the calibration ones
    with torch.no_grad():
        ref = model(x).numpy()
    if target == "openvino":
        import openvino as ov

        assert out.with_suffix(".bin").is_file() and "FakeQuantize" in out.read_text()
        got = ov.Core().compile_model(str(out), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})(x.numpy())[0]
    else:
        import onnx

        assert "QuantizeLinear" in {n.op_type for n in onnx.load(str(out)).graph.node}
        got = _ort_logits(out, x)
    assert np.abs(got - ref).max() > 1e-4  # int8: rounded ...
    assert np.corrcoef(got.ravel(), ref.ravel())[0, 1] > 0.9  # ... but the same model (other weights: r ~ 0)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_cli_export_bad_inputs_are_one_line(tmp_path, capsys, monkeypatch):
    from vitlab.cli import export as export_cli
    from vitlab.cli import main
    from vitlab.deploy import export

    assert export_cli.TARGETS == export.TARGETS  # spelled out so that --help imports no torch

    _, ckpt = _run_dir(tmp_path)
    bare = vitlab.save_weights(_tiny(), tmp_path / "bare.safetensors")  # no recipe.yaml beside it
    (tmp_path / "empty").mkdir()

    def fails(argv, code, *needles):
        capsys.readouterr()
        try:
            rc = main(["export", *map(str, argv)])
        except SystemExit as e:  # argparse's own usage errors
            rc = e.code
        assert rc == code
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("vitlab export: error: "), err
        if code == 1:
            assert err.count("\n") == 1, err
        for n in needles:
            assert n in err, err

    fails([ckpt, tmp_path / "a.xml", "--to", "tflite"], 2, "invalid choice")
    fails([ckpt, tmp_path / "a.xml", "--to", "onnx"], 2, ".onnx file")
    fails([ckpt, tmp_path / "a.onnx", "--calib", "fashion_mnist"], 2, "--calib is for --int8")
    fails([bare, tmp_path / "a.onnx", "--int8"], 1, "--int8 needs calibration images", "--calib")
    fails([ckpt, tmp_path / "a.onnx", "--int8", "--calib", tmp_path / "empty"], 1, "holds no image files")
    fails([ckpt, tmp_path / "a.onnx", "--int8", "--calib", "nosuchset"], 1, "unknown dataset")
    monkeypatch.setitem(sys.modules, "openvino", None)  # as if the extra were not installed
    fails([ckpt, tmp_path / "a.xml"], 1, "pip install 'vitlab[openvino]'")
    assert not list(tmp_path.glob("a.*"))
