"""BiT ResNet-v2 (`vitlab.models.resnet`, the paper's CNN baseline) against timm's ResNetV2: logits at random init,
parameter counts of every named variant, FLOPs against PyTorch's FLOP counter; and the zoo's paths (create_model,
recipe training, save / load, evaluation, few-shot features) with a ResNet in them."""

from functools import partial

import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.layers import GroupNormAct as TimmGroupNormAct
from timm.layers import StdConv2d as TimmStdConv2d
from timm.models.resnetv2 import ResNetV2 as TimmResNetV2
from torch.utils.flop_counter import FlopCounterMode

import vitlab
from vitlab.analysis.fewshot import extract_features
from vitlab.models.flops import count_flops, count_params
from vitlab.models.resnet import VARIANTS, ResNetConfig, ResNetV2, canonical_name, config_from_dict
from vitlab.train import train
from vitlab.train.recipe import Recipe
from vitlab.weights.bit import ours_to_timm

from .conftest import perturb_

ATOL = 1e-4
SMALL = dict(name="BiT-R26x1", img_size=28, in_chans=1, width=16)  # the Fashion-MNIST size the experiments use


def timm_bit(layers, stem: int, groups: int = 32, **kw) -> TimmResNetV2:
    """timm's BiT ResNetV2 (as its resnetv2_*_bit builders make it: "fixed" stem, StdConv2d eps 1e-8) at any size,
    perturbed so no GroupNorm stays at its identity init."""
    chans = tuple(4 * stem * 2**i for i in range(len(layers)))
    model = TimmResNetV2(layers=list(layers), channels=chans, stem_chs=stem, stem_type="fixed",
                         conv_layer=partial(TimmStdConv2d, eps=1e-8),
                         norm_layer=partial(TimmGroupNormAct, num_groups=groups), **kw)
    return perturb_(model).eval()


def test_random_init_bit_r50x1_equals_timm(tmp_path):
    theirs = perturb_(timm.create_model("resnetv2_50x1_bit", pretrained=False, num_classes=7)).eval()
    save_file(theirs.state_dict(), str(tmp_path / "r50.safetensors"))  # timm's names, head.fc a 1x1 conv
    ours, report = vitlab.load_model(tmp_path / "r50.safetensors", return_report=True)
    assert report.ok and report.format == "timm", report
    assert isinstance(ours, ResNetV2) and ours.cfg.name == "BiT-R50x1" and ours.cfg.num_classes == 7
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=ATOL, rtol=0)
        torch.testing.assert_close(ours.embed_features(x), theirs.forward_head(theirs.forward_features(x),
                                                                                pre_logits=True), atol=ATOL, rtol=0)


@pytest.mark.parametrize("hw", [(29, 29), (32, 48)])  # odd sizes: the padding conventions differ there
def test_tiny_resnet_equals_timm_at_any_size(tmp_path, hw):
    theirs = timm_bit((2, 1, 1, 1), stem=32, in_chans=1, num_classes=5)
    torch.save(theirs.state_dict(), tmp_path / "tiny.pth")
    ours = vitlab.load_model(tmp_path / "tiny.pth")
    assert ours.cfg.layers == (2, 1, 1, 1) and ours.cfg.width == 32 and ours.cfg.in_chans == 1
    built = vitlab.create_model("BiT-R14x1", layers=(2, 1, 1, 1), width=32, in_chans=1, num_classes=5)
    vitlab.load_weights(built, tmp_path / "tiny.pth")  # into a model built by name
    x = torch.randn(3, 1, *hw)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=ATOL, rtol=0)
        torch.testing.assert_close(built.eval()(x), theirs(x), atol=ATOL, rtol=0)


def test_groups_setting_equals_timm_with_as_many_groups():
    theirs = timm_bit((1, 1), stem=16, groups=16, num_classes=4)  # 16 channels need 16 groups
    ours = vitlab.create_model("BiT-R14x1", layers=(1, 1), width=16, groups=16, num_classes=4).eval()
    ours.load_state_dict({k: v for k, v in _ours(theirs.state_dict()).items()})
    x = torch.randn(2, 3, 40, 40)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=ATOL, rtol=0)


def _ours(timm_state: dict) -> dict:
    return {k.replace("head.fc.", "head."): v.flatten(1) if k == "head.fc.weight" else v
            for k, v in timm_state.items()}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_variant_has_timms_parameter_count(name):
    cfg = ResNetConfig.from_name(name)
    with torch.device("meta"):
        ours = vitlab.create_model(name)
        depth, factor = name.removeprefix("BiT-R").split("x")
        if depth in ("14", "26"):  # no timm name: its class at the same layout
            theirs = TimmResNetV2(layers=list(cfg.layers), stem_type="fixed")
        else:
            theirs = timm.create_model(f"resnetv2_{depth}x{factor}_bit", pretrained=False)
    assert count_params(cfg) == sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in
                                                                                 theirs.parameters())
    assert sorted(ours_to_timm(ours.state_dict())) == sorted(theirs.state_dict())  # timm's names, head aside


def test_paper_sizes():
    # BiT (Kolesnikov et al. 2020) Table: ResNet-50x1 25.5M ... ResNet-152x4 936M parameters (1000 classes)
    assert round(count_params(ResNetConfig.from_name("BiT-R50x1")) / 1e6, 1) == 25.5
    assert round(count_params(ResNetConfig.from_name("BiT-R152x4")) / 1e6) == 937


@pytest.mark.parametrize("cfg,hw", [
    (ResNetConfig(layers=(2, 2, 2, 2), width=16, in_chans=1, num_classes=10, img_size=28), (28, 28)),
    (ResNetConfig(layers=(1, 2), width=32, num_classes=3, img_size=(37, 50)), (37, 50)),
])
def test_flops_match_pytorchs_counter(cfg, hw):
    model = ResNetV2(cfg).eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randn(1, cfg.in_chans, *hw))
    assert count_flops(cfg) == counter.get_total_flops()  # convolutions and the head (norms are not counted)
    assert count_params(cfg) == sum(p.numel() for p in model.parameters())


def test_names_and_config_errors():
    for spelling in ("BiT-R50x1", "bit-r50x1", "BiT-M-R50x1", "bit-s-r50x1", "resnetv2_50x1_bit.goog_in21k"):
        assert canonical_name(spelling) == "BiT-R50x1"
    assert canonical_name("ViT-B/16") is None
    with pytest.raises(ValueError, match="known BiT models: BiT-R50x1"):
        vitlab.create_model("BiT-R34x1")
    with pytest.raises(ValueError, match="BiT-R26x1"):  # an unknown name lists the ResNets with the ViTs
        vitlab.create_model("ViT-Q/16")
    with pytest.raises(ValueError, match="unknown ResNetConfig field"):
        vitlab.create_model("BiT-R26x1", patch_size=4)
    with pytest.raises(ValueError, match="80 channels do not split into 32 GroupNorm groups"):
        ResNetConfig(width=20)
    with pytest.raises(ValueError, match=r"ResNetConfig\.layers"):
        ResNetConfig(layers=())
    with pytest.raises(ValueError, match=r"ResNetConfig\.eps"):
        ResNetConfig(eps="vit_jax")
    cfg = ResNetConfig.from_name("BiT-R26x1", width=16, img_size=[28, 28])
    assert config_from_dict(cfg.to_dict()) == cfg and cfg.to_dict()["arch"] == "resnetv2"
    model = vitlab.create_model(**{**SMALL, "num_classes": 10})
    with pytest.raises(ValueError, match="expects 1 input channels, got 3"):
        model(torch.zeros(1, 3, 28, 28))
    with pytest.raises(TypeError, match="uint8"):
        model(torch.zeros(1, 1, 28, 28, dtype=torch.uint8))


def test_every_parameter_learns_and_units_differ():
    model = vitlab.create_model(**{**SMALL, "num_classes": 10})
    model.head.weight.data.normal_()  # the zero head would stop every gradient below it
    model(torch.randn(4, 1, 28, 28)).square().mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    a, b = model.stages[0].blocks  # type: ignore[misc]
    assert a.conv2.weight.data_ptr() != b.conv2.weight.data_ptr() and not torch.equal(a.conv2.weight, b.conv2.weight)


def test_pooled_features_serve_the_fewshot_probe():
    model = vitlab.create_model(**{**SMALL, "num_classes": 10}).eval()
    x, y = torch.randn(6, 1, 28, 28), torch.arange(6)
    feats, labels = extract_features(model, [(x[:4], y[:4]), (x[4:], y[4:])])
    assert feats.shape == (6, model.num_features) == (6, 512) and labels.tolist() == list(range(6))
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(feats), model.embed_features(x))
        torch.testing.assert_close(model.head(model.embed_features(x)), model(x))


@pytest.mark.slow  # two short trainings and an evaluation: 16-50 s on the shared 2 cores
def test_recipe_trains_saves_loads_and_evaluates(tmp_path, synthetic_data, monkeypatch, request):
    from vitlab.data import synthetic
    from vitlab.inference.evaluate import evaluate_checkpoint

    monkeypatch.setitem(synthetic.SYNTHETIC_SIZES, "test", 48)  # the final evaluations read the whole split
    synthetic.load_synthetic.cache_clear()  # an earlier test may have cached the 10,000-image split
    request.addfinalizer(synthetic.load_synthetic.cache_clear)
    r = Recipe.from_dict({"model": {**SMALL, "num_classes": 10}, "data": synthetic_data,
                          "train": {"batch_size": 8, "steps": 2, "precision": "fp32",
                                    "evaluators": {"eval": {"type": "classification", "max_samples": 16}}}})
    assert isinstance(r.model.model_config(), ResNetConfig)
    result = train(r, tmp_path / "run", progress=False)
    assert result.status.startswith("completed") and result.mfu is not None and result.mfu > 0
    path = tmp_path / "run" / "model.safetensors"
    model = vitlab.load_model(path)
    assert isinstance(model, ResNetV2)
    assert model.cfg == ResNetConfig.from_name("BiT-R26x1", width=16, img_size=28, in_chans=1, num_classes=10)
    assert model.preprocess is not None and model.preprocess.img_size == 28
    ev = evaluate_checkpoint(path, "synthetic", split="test", batch_size=16, progress=False, precision="fp32")
    assert ev.num_samples == 48 and 0 <= ev.top1 <= 1
    # fine-tune from it: a new zero head for another class count
    ft = Recipe.from_dict({"model": {**SMALL, "num_classes": 10}, "data": synthetic_data,
                           "init": {"checkpoint": str(path), "drop_head": True},
                           "train": {"batch_size": 8, "steps": 1, "precision": "fp32",
                                     "evaluators": {"eval": {"type": "classification", "max_samples": 8}}}})
    assert train(ft, tmp_path / "ft", progress=False).status.startswith("completed")


def test_another_class_count_gets_a_zero_head(tmp_path):
    model = perturb_(vitlab.create_model("BiT-R14x1", width=32, num_classes=5))
    vitlab.save_weights(model, tmp_path / "m.safetensors")
    other, report = vitlab.load_model(tmp_path / "m.safetensors", num_classes=3, return_report=True)
    assert "head.weight" in report.replaced and not other.head.weight.any()
    torch.testing.assert_close(other.stages[0].blocks[0].conv2.weight, model.stages[0].blocks[0].conv2.weight)


def test_saved_folder_loads_back_with_the_same_logits(tmp_path):
    """save_pretrained of a BiT ResNet (not the defaults: Google's epsilons, 8 groups, 48 px, a preprocessing) loads
    back with vitlab.load_model and vitlab.weights.from_pretrained: the same config, preprocessing and logits."""
    from vitlab.weights.preprocess_files import torchvision_classification

    model = perturb_(vitlab.create_model("BiT-R50x1", layers=(1, 2), width=16, groups=8, eps="bit", img_size=48,
                                         num_classes=5)).eval()
    model.preprocess = torchvision_classification(48, 56)
    folder = vitlab.weights.save_pretrained(model, tmp_path / "bit", metadata={"class_names": list("abcde")})
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert "BiT ResNet-v2" in (folder / "README.md").read_text()
    x = torch.randn(2, 3, 48, 48)
    for back in (vitlab.load_model(folder), vitlab.weights.from_pretrained(folder)):
        assert isinstance(back, ResNetV2) and back.cfg == model.cfg and back.preprocess == model.preprocess
        torch.testing.assert_close(back(x), model(x), atol=0, rtol=0)
    assert vitlab.load_model(folder, num_classes=3).head.weight.abs().sum() == 0  # a new zero head


def test_docs_and_docstring_examples_run():
    import doctest
    import re
    from pathlib import Path

    import vitlab.models.resnet

    assert doctest.testmod(vitlab.models.resnet, extraglobs={"torch": torch}).failed == 0
    page = (Path(__file__).parents[1] / "docs" / "models.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, re.S)
    assert code is not None
    env: dict = {}
    exec(code.group(1).replace('create_model("BiT-R50x1")', 'create_model("BiT-R50x1", num_classes=3)'), env)
    assert env["logits"].shape == (8, 10) and env["feats"].shape == (8, 512)
