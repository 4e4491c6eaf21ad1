"""Class names travel with the weights: a run trained on an ImageFolder of ant/ bee/ cat/ records them with its
checkpoint, and `vitlab convert` carries them into every output that has a place for them (transformers' id2label,
a header entry of timm / torchvision .safetensors, our own metadata), so that transformers' pipeline and `vitlab
predict` answer "cat" for a cat image (issue 25)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from safetensors import safe_open

from vitlab.cli import main
from vitlab.inference.predict import predict
from vitlab.train import Recipe, train
from vitlab.weights import read_metadata

CLASSES = {"ant": (220, 30, 30), "bee": (30, 220, 30), "cat": (30, 30, 220)}  # one colour per class: learnable


def _image(path: Path, rgb: tuple[int, int, int], rng: np.random.Generator) -> Path:
    px = np.clip(np.array(rgb) + rng.integers(-20, 20, (16, 16, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(px).save(path)
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """A tiny ViT trained for 12 steps on an ImageFolder tree ant/ bee/ cat/ (it learns the colours), and a cat."""
    tmp = tmp_path_factory.mktemp("names")
    rng = np.random.default_rng(0)
    for name, rgb in CLASSES.items():
        (tmp / "tree" / name).mkdir(parents=True)
        for i in range(4):
            _image(tmp / "tree" / name / f"{i}.png", rgb, rng)
    recipe = Recipe.from_dict({
        # width 64 with one head: a timm file (which does not store heads) reads back with the same heads
        "model": {"name": "ViT-Ti/16", "embed_dim": 64, "depth": 1, "num_heads": 1, "mlp_dim": 64, "img_size": 16,
                  "patch_size": 8, "in_chans": 3},
        "data": {"dataset": "imagefolder", "root": str(tmp / "tree"), "test_root": str(tmp / "tree"),
                 "inception_crop": False, "hflip": False, "num_workers": 0},
        "optim": {"name": "adamw", "lr": 1e-2},
        "schedule": {"name": "cosine", "warmup_steps": 1},
        "train": {"batch_size": 6, "steps": 12, "precision": "fp32", "log_every": 1,
                  "evaluators": {"eval": {"type": "classification", "batch_size": 12}}},
    })
    result = train(recipe, tmp / "run", progress=False, device="cpu")
    assert result["eval"]["top1"] == 1.0  # else "cat" below would test the training, not the names
    return {"tmp": tmp, "model": Path(result["model"]), "cat": _image(tmp / "cat.png", CLASSES["cat"], rng)}


def test_the_run_records_its_class_names_and_predict_uses_them(trained):
    assert read_metadata(trained["model"])["classes"] == ["ant", "bee", "cat"]
    assert predict(trained["model"], [trained["cat"]], top_k=1)[0]["top"][0]["label"] == "cat"


def test_convert_to_hf_writes_the_names_and_the_pipeline_answers_cat(trained, capsys):
    from transformers import ViTForImageClassification, pipeline

    out = trained["tmp"] / "hf"
    assert main(["convert", str(trained["model"]), str(out), "--to", "hf"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "ant", "1": "bee", "2": "cat"}
    assert config["label2id"] == {"ant": 0, "bee": 1, "cat": 2}
    assert ViTForImageClassification.from_pretrained(out).config.id2label == {0: "ant", 1: "bee", 2: "cat"}
    answer = pipeline("image-classification", model=str(out), device="cpu")(str(trained["cat"]))
    assert answer[0]["label"] == "cat", answer
    # and back: transformers' folder -> vitlab predict
    assert predict(out, [trained["cat"]], top_k=1)[0]["top"][0]["label"] == "cat"


@pytest.mark.parametrize("to,key", [("timm", "timm.label_names"), ("torchvision", "torchvision.categories")])
def test_timm_and_torchvision_safetensors_keep_the_names_in_their_header(to, key, trained, capsys):
    out = trained["tmp"] / f"{to}.safetensors"
    assert main(["convert", str(trained["model"]), str(out), "--to", to, "--force"]) == 0
    with safe_open(str(out), framework="pt") as f:
        assert json.loads(f.metadata()[key]) == ["ant", "bee", "cat"]
    assert read_metadata(out)["class_names"] == ["ant", "bee", "cat"]
    if to == "timm":  # torchvision's layout is written, not read back as a model (vitlab reads torchvision .pth)
        assert predict(out, [trained["cat"]], top_k=1)[0]["top"][0]["label"] == "cat"


def test_a_pth_state_dict_says_it_left_the_names_out(trained, capsys):
    capsys.readouterr()
    assert main(["convert", str(trained["model"]), str(trained["tmp"] / "t.pth"), "--to", "timm"]) == 0
    assert "class names (ant, bee, cat) are not in t.pth" in capsys.readouterr().out


def test_our_own_format_keeps_the_names(trained):
    out = trained["tmp"] / "copy.safetensors"
    assert main(["convert", str(trained["model"]), str(out)]) == 0
    assert read_metadata(out)["classes"] == ["ant", "bee", "cat"]
    assert predict(out, [trained["cat"]], top_k=1)[0]["top"][0]["label"] == "cat"
    # a new head of another size drops names that no longer fit
    assert main(["convert", str(trained["model"]), str(trained["tmp"] / "hf5"), "--to", "hf", "--num-classes",
                 "5"]) == 0
    config = json.loads((trained["tmp"] / "hf5" / "config.json").read_text())
    assert list(config["id2label"].values()) == [f"LABEL_{i}" for i in range(5)]
