"""BiT weights: Google's `.npz` layout against Google's own BiT code (a committed fixture, tests/fixtures/bit) and
against timm's reader of the same files; timm's `resnetv2_*_bit` state dicts; and the files that are not BiT."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from timm.models.resnetv2 import _load_weights as timm_load_npz

import vitlab
from vitlab.models.resnet import ResNetConfig, ResNetV2
from vitlab.weights import WeightsError, read_metadata

from .conftest import perturb_
from .test_resnet import timm_bit

FIXTURES = Path(__file__).parent / "fixtures" / "bit"
_spec = importlib.util.spec_from_file_location("make_bit_fixture", FIXTURES / "make_fixture.py")
assert _spec is not None and _spec.loader is not None
make_fixture = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_fixture)


@pytest.fixture
def google_npz(tmp_path) -> Path:
    """The fixture's random weights in Google's released layout (regenerated: NumPy's RandomState is frozen)."""
    path = tmp_path / "BiT-tiny.npz"
    np.savez(path, **make_fixture.google_layout_arrays())
    return path


def test_npz_gives_googles_own_logits(google_npz):
    model, report = vitlab.load_model(google_npz, return_report=True)
    assert report.ok and isinstance(model, ResNetV2)
    assert model.cfg.layers == make_fixture.LAYERS and model.cfg.width == make_fixture.WIDTH
    assert model.cfg.num_classes == make_fixture.CLASSES and model.cfg.eps == "bit"  # Google's 1e-10
    expected = np.load(FIXTURES / "google_bit_tiny.npz")
    for s in make_fixture.SIZES:  # logits of big_transfer's bit_pytorch ResNetV2.load_from on the same archive
        with torch.no_grad():
            logits = model(torch.from_numpy(expected[f"input_{s}"]))
        torch.testing.assert_close(logits, torch.from_numpy(expected[f"logits_{s}"]), atol=1e-4, rtol=0)


def test_npz_reads_as_timms_loader_reads_it(google_npz):
    theirs = timm_bit(make_fixture.LAYERS, stem=make_fixture.WIDTH, num_classes=make_fixture.CLASSES)
    timm_load_npz(theirs, str(google_npz))
    built = vitlab.create_model("BiT-R14x1", layers=make_fixture.LAYERS, width=32, num_classes=make_fixture.CLASSES)
    report = vitlab.load_weights(built, google_npz)
    assert built.cfg.eps == "bit" and any("eps: 'timm' -> 'bit'" in m for m in report.messages)
    x = torch.randn(2, 3, 45, 45)
    with torch.no_grad():
        torch.testing.assert_close(built.eval()(x), theirs(x), atol=1e-4, rtol=0)  # 1e-10 vs timm's 1e-8: below


def test_our_npz_loads_into_timm_with_equal_logits(tmp_path):
    ours = perturb_(vitlab.create_model("BiT-R14x1", layers=(2, 1, 1), width=32, num_classes=4)).eval()
    path = vitlab.save_weights(ours, tmp_path / "ours.npz")
    theirs = timm_bit((2, 1, 1), stem=32, num_classes=4)  # three stages: timm's class takes any number
    timm_load_npz(theirs, str(path))
    x = torch.randn(2, 3, 33, 33)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-4, rtol=0)
    back = vitlab.load_model(path)  # and back: every tensor as written
    for k, v in ours.state_dict().items():
        torch.testing.assert_close(back.state_dict()[k], v, atol=0, rtol=0)


def test_safetensors_keeps_the_config(tmp_path):
    model = perturb_(vitlab.create_model("BiT-R26x1", width=16, img_size=28, in_chans=1, num_classes=10))
    vitlab.save_weights(model, tmp_path / "m.safetensors", metadata={"note": "x"})
    back = vitlab.load_model(tmp_path / "m.safetensors")
    assert back.cfg == model.cfg and read_metadata(tmp_path / "m.safetensors") == {"note": "x"}
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(back(x), model.eval()(x), atol=0, rtol=0)


@pytest.mark.parametrize("damage,match", [
    (lambda a: a.pop("resnet/block1/unit02/b/standardized_conv2d/kernel"), "unit02/b/standardized_conv2d.* missing"),
    (lambda a: a.pop("resnet/block2/unit01/a/proj/standardized_conv2d/kernel"), "a/proj/.* missing"),
    (lambda a: a.update({"resnet/extra/kernel": np.zeros(3, np.float32)}), "outside Google's BiT layout"),
    (lambda a: a.update({"resnet/group_norm/gamma": np.zeros((2, 3), np.float32)}), "a GroupNorm parameter is"),
    (lambda a: a.update({"resnet/block9/unit01/a/group_norm/gamma": np.zeros(3, np.float32)}), "not numbered"),
])
def test_damaged_npz_is_refused_by_name(tmp_path, damage, match):
    arrays = make_fixture.google_layout_arrays()
    damage(arrays)
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(WeightsError, match=match):
        vitlab.load_model(tmp_path / "bad.npz")


@pytest.mark.parametrize("state,match", [
    ({"stem.conv.weight": torch.zeros(8, 3, 7, 7), "stages.0.blocks.0.norm1.running_mean": torch.zeros(8)},
     "BatchNorm"),
    ({"stem.conv.weight": torch.zeros(8, 3, 7, 7), "stem.norm.weight": torch.zeros(8),
      "stages.0.blocks.0.conv1.weight": torch.zeros(8, 8, 1, 1)}, "post-activation stem"),
])
def test_other_resnets_are_refused_by_name(tmp_path, state, match):
    save_file(state, str(tmp_path / "r.safetensors"))
    with pytest.raises(WeightsError, match=match):
        vitlab.load_model(tmp_path / "r.safetensors")


def test_a_vit_file_does_not_fit_a_resnet(tmp_path):
    vit = vitlab.create_model("ViT-Ti/16", depth=1, img_size=32, num_classes=3)
    vitlab.save_weights(vit, tmp_path / "vit.safetensors")
    with pytest.raises(WeightsError, match="holds a ViT's weights but the model is a BiT ResNet"):
        vitlab.load_weights(vitlab.create_model("BiT-R14x1", width=32, num_classes=3), tmp_path / "vit.safetensors")
    vitlab.save_weights(vitlab.create_model("BiT-R14x1", width=32, num_classes=3), tmp_path / "bit.safetensors")
    with pytest.raises(WeightsError, match="holds a BiT ResNet's weights but the model is a ViT"):
        vitlab.load_weights(vit, tmp_path / "bit.safetensors")


def test_registry_lists_googles_and_timms_bit_files():
    from vitlab.weights import registry

    bit = [e for e in registry.list_entries() if e.variant.startswith("BiT-")]
    google = [e for e in bit if e.format == "npz"]
    assert len(google) == 15 and len(bit) == 27  # BiT-S / BiT-M x 5 architectures, 5 ILSVRC-2012 fine-tunes; timm 12
    for e in google:
        pre = e.to_preprocess()  # big_transfer bit_pytorch/train.py: Resize((crop, crop)), Normalize(0.5, 0.5)
        assert (pre.mean, pre.std, pre.resize, pre.crop_fraction) == ((0.5,) * 3, (0.5,) * 3, "resize", 1.0)
        assert e.url == f"https://storage.googleapis.com/bit_models/{e.aliases[0]}.npz"
        cfg = e.model_config()
        assert isinstance(cfg, ResNetConfig) and cfg.name == e.variant == f"BiT-{e.aliases[0].split('-')[2]}"
        assert e.num_classes == {"S": 1000, "M": 21843}[e.aliases[0][4]] or e.name.endswith("-ILSVRC2012.npz")
    assert registry.get("BiT-M-R152x4-ILSVRC2012").img_size == 480  # bit_hyperrule: (512, 480) for ImageNet


def test_a_registry_name_loads_from_the_cache(tmp_path, monkeypatch):
    """`load_model("BiT-M-R50x1")` with the file already in the cache (no network): the entry's preprocessing and
    class count apply, the archive's layout fixes the rest (here the fixture's small archive stands in)."""
    from vitlab.weights.download import url_cache_path

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    path = url_cache_path("https://storage.googleapis.com/bit_models/BiT-M-R50x1.npz")
    path.parent.mkdir(parents=True)
    np.savez(path, **make_fixture.google_layout_arrays())
    model, report = vitlab.load_model("BiT-M-R50x1", return_report=True)
    assert isinstance(model, ResNetV2) and model.cfg.eps == "bit" and model.cfg.num_classes == 21843
    assert "head.weight" in report.replaced  # 5 classes in the stand-in, 21843 in the entry: a new zero head
    assert model.preprocess is not None and model.preprocess.hw == (224, 224) and model.preprocess.mean == (0.5,) * 3
