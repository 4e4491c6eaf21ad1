"""Recipes from a DINOv2 / SigLIP backbone on an ImageFolder, end to end: tiny random-init timm models of each family,
saved as timm's Hub folder (what users download), linear-probed (DINOv2's features: class token + mean patch token,
checked against timm's own forward) and fine-tuned (the checkpoint's architecture, a zero-initialised head)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

import vitlab
from vitlab.analysis.fewshot import extract_features
from vitlab.data import build_eval_data
from vitlab.train import Recipe, recipes, train
from vitlab.train.build import build_model, data_config_with_init
from vitlab.train.recipe import load_recipe

from .conftest import perturb_

timm = pytest.importorskip("timm")
ARGS = dict(img_size=28, patch_size=7, embed_dim=64, depth=2, num_heads=2, num_classes=0)
FAMILIES = {"dinov2_reg": "vit_small_patch14_reg4_dinov2", "siglip": "vit_base_patch16_siglip_224"}
CLASSES = ("red", "green", "blue")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An ImageFolder tree (train/ and test/, three colour classes, noisy 28 px RGB images)."""
    root = tmp_path_factory.mktemp("folder")
    rng = np.random.default_rng(0)
    for split, n in (("train", 8), ("test", 4)):
        for c, name in enumerate(CLASSES):
            (root / split / name).mkdir(parents=True)
            for i in range(n):
                img = rng.integers(0, 90, (28, 28, 3))
                img[..., c] += 150
                Image.fromarray(img.astype(np.uint8)).save(root / split / name / f"{i}.png")
    return root


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def backbone(request, tmp_path_factory):
    """(timm model, its Hub folder): a random-init family model, every weight perturbed, as `save_for_hf` writes it."""
    from timm.models._hub import save_for_hf

    torch.manual_seed(0)
    model = perturb_(timm.create_model(FAMILIES[request.param], pretrained=False, **ARGS), scale=0.05).eval()
    path = tmp_path_factory.mktemp(request.param) / "hub"
    save_for_hf(model, path, model_args=ARGS, safe_serialization=True)
    return model, path


def _recipe(name: str, folder, backbone_path, **over) -> Recipe:
    return load_recipe(recipes.path(name), [f"data.root={folder}", f"init.checkpoint={backbone_path}",
                                            *(f"{k}={v}" for k, v in over.items())])


def test_linear_probe_on_dinov2_features(tmp_path, folder, backbone):
    theirs, path = backbone
    recipe = _recipe("dinov2_linear_probe_folder", folder, path, **{"train.steps": 30, "train.log_every": 10,
                                                                      "model.img_size": 28})
    result = train(recipe, tmp_path / "probe", progress=False)
    assert result.status == "completed" and result.eval.num_samples == 12
    # the features: DINOv2's class token + mean patch token (registers left out), or SigLIP's MAP-pooled ones, as
    # timm computes them from its own model on the same preprocessed images
    model = build_model(recipe, num_classes=3).eval()
    data = build_eval_data(data_config_with_init(recipe), "test", img_size=28, in_chans=3, batch_size=12)
    feats, labels = extract_features(model, data, features="probe")
    x = next(iter(data))[0]
    with torch.no_grad():
        tokens = theirs.forward_features(x)
        if theirs.cls_token is not None:
            expected = torch.cat([tokens[:, 0], tokens[:, theirs.num_prefix_tokens :].mean(1)], dim=1)
        else:
            expected = theirs.forward_head(tokens, pre_logits=True)
    torch.testing.assert_close(torch.from_numpy(feats), expected, atol=1e-5, rtol=1e-5)
    # the saved classifier on those features gives the reported accuracy
    head = load_file(result.model)
    assert head["weight"].shape == (3, expected.shape[1])
    top1 = ((expected @ head["weight"].T + head["bias"]).argmax(1).numpy() == labels).mean()
    assert result.eval.top1 == pytest.approx(top1)
    rows = [json.loads(line) for line in (tmp_path / "probe" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [10, 20, 30]
    assert 0.0 <= rows[-1]["ridge_top1"] <= 1.0 and rows[-1]["split"] == "eval_test"
    assert (tmp_path / "probe" / "report.md").is_file()


def test_finetune_builds_the_checkpoints_architecture_with_a_zero_head(tmp_path, folder, backbone):
    theirs, path = backbone
    recipe = _recipe("dinov2_finetune_folder", folder, path, **{
        "train.steps": 3, "train.batch_size": 6, "train.accum_steps": 1, "train.evaluators.eval.every": 0,
        "train.checkpoint_every": 0, "schedule.warmup_steps": 1, "model.img_size": 28, "data.val_fraction": 0.0,
        "train.evaluators.eval.split": "test", "train.precision": "fp32"})
    model = build_model(recipe, num_classes=3).eval()
    assert model.cfg.family_options() == vitlab.load_model(path).cfg.family_options() != {}
    assert model.head.weight.shape == (3, 64) and not model.head.weight.any() and not model.head.bias.any()
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(x), theirs.forward_features(x), atol=1e-5, rtol=1e-5)
    result = train(recipe, tmp_path / "ft", progress=False)
    assert result.status == "completed" and result.step == 3
    tuned = vitlab.load_model(result.model)
    assert tuned.cfg.num_classes == 3 and tuned.cfg.family_options() == model.cfg.family_options()
    assert tuned.head.weight.any()  # the head learnt


def test_model_from_init_needs_a_checkpoint():
    with pytest.raises(ValueError, match=r"set init\.checkpoint"):
        Recipe.from_dict({"model": {"name": "init.checkpoint"}, "train": {"steps": 1}})
    with pytest.raises(ValueError, match=r"linear_probe .* set init\.checkpoint"):
        Recipe.from_dict({"train": {"steps": 1, "linear_probe": True}})
