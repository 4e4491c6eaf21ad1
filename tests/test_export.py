"""ONNX export: onnxruntime reproduces PyTorch's logits within 1e-4 at batch sizes the graph was not traced with."""

import numpy as np
import pytest
import torch

import vitlab
from vitlab.export import export_onnx
from vitlab.io import default_mode

from .conftest import perturb_

ort = pytest.importorskip("onnxruntime")


def _tiny(**kw):
    cfg = dict(depth=2, img_size=32, patch_size=8, num_classes=10)
    cfg.update(kw)
    return perturb_(vitlab.create_model("ViT-Ti/16", **cfg)).eval()


def _ort_logits(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(["logits"], {"images": x.numpy()})[0]


@pytest.mark.slow
def test_onnx_matches_torch_with_dynamic_batch(tmp_path):
    model = _tiny()
    report = export_onnx(model, tmp_path / "vit.onnx", verify_batches=())
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
