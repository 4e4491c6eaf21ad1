"""`vitlab analyze` and `vitlab fewshot` end to end on tiny random models."""

import json
import re

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.cli import main

from .conftest import perturb_


@pytest.fixture
def tiny_checkpoint(tmp_path):
    model = perturb_(vitlab.create_model("ViT-Ti/16", depth=2, img_size=28, patch_size=4, in_chans=1,
                                         num_classes=10, embed_dim=32, num_heads=2, mlp_dim=64), scale=0.3)
    path = tmp_path / "tiny.safetensors"
    vitlab.save_weights(model, path)
    return path


def test_analyze_writes_png_json_html_from_image_files(tiny_checkpoint, tmp_path, capsys):
    rng = np.random.default_rng(0)
    paths = []
    for i in range(3):
        p = tmp_path / f"img{i}.png"
        Image.fromarray(rng.integers(0, 255, (40, 30, 3), dtype=np.uint8)).save(p)  # RGB, other size: resized
        paths.append(str(p))
    out = tmp_path / "report"
    assert main(["analyze", str(tiny_checkpoint), "--images", *paths, "-o", str(out), "--layer-maps", "1", "-1",
                 "--batch-size", "2"]) == 0
    names = {p.name for p in out.iterdir()}
    for stem in ("filters", "posembed_similarity", "attention_distance", "attention_rollout", "attention_layer1",
                 "attention_layer2"):
        assert {f"{stem}.png", f"{stem}.json"} <= names
    assert "report.html" in names
    dist = json.loads((out / "attention_distance.json").read_text())
    assert np.asarray(dist["mean_distance"]).shape == (2, 2) and dist["num_images"] == 3
    assert "wrote" in capsys.readouterr().out
    # a second run refuses to replace the report, and says how to
    assert main(["analyze", str(tiny_checkpoint), "--images", *paths, "-o", str(out)]) == 1
    assert "--force" in capsys.readouterr().err


def test_analyze_reads_a_dataset(tiny_checkpoint, tmp_path):
    out = tmp_path / "r"
    assert main(["analyze", str(tiny_checkpoint), "--data", "synthetic", "--num-images", "5", "-o", str(out)]) == 0
    roll = json.loads((out / "attention_rollout.json").read_text())
    assert np.asarray(roll["maps"]).shape == (5, 7, 7)


def test_analyze_errors_name_the_problem(tiny_checkpoint, tmp_path, capsys):
    """One line `vitlab analyze: error: ...` on stderr, no traceback; exit 1 for the input, 2 for a bad option."""
    capsys.readouterr()
    assert main(["analyze", str(tmp_path / "nope.safetensors"), "--images", "x.png", "-o", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("vitlab analyze: error: ") and "does not exist" in err and "Traceback" not in err
    assert main(["analyze", str(tiny_checkpoint), "--images", str(tmp_path / "missing.png"), "-o",
                 str(tmp_path / "o")]) == 1
    assert re.search(r"image .*missing\.png does not exist", capsys.readouterr().err)
    assert main(["analyze", str(tiny_checkpoint), "--images", "x.png", "-o", str(tmp_path / "o"), "--layer-maps",
                 "3"]) == 2
    assert "not a layer of this 2-layer model" in capsys.readouterr().err


def test_fewshot_cli_on_fashion_mnist(tiny_checkpoint, tmp_path, fmnist_root, capsys):
    torch.set_num_threads(2)
    out = tmp_path / "fewshot.json"
    assert main(["fewshot", str(tiny_checkpoint), "--data", "fashion_mnist", "--shots", "1", "10",
                 "--seeds", "3", "--train-limit", "600", "--test-limit", "300", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["num_train"] == 600 and res["num_test"] == 300 and res["num_features"] == 32
    assert [r["shots"] for r in res["results"]] == [1, 10]
    for r in res["results"]:
        acc = np.asarray(r["accuracies"])
        assert acc.shape == (3,) and r["mean"] == pytest.approx(acc.mean()) and r["std"] == pytest.approx(acc.std())
    # even a random tiny model's 32 features beat chance (10%; 3 sigma on 300 images is 15%) with 10 shots
    assert res["results"][1]["mean"] > 0.15
    assert "shots" in capsys.readouterr().out
    before = out.read_bytes()
    assert main(["fewshot", str(tiny_checkpoint), "--data", "fashion_mnist", "--json", str(out)]) == 1
    assert "already exists" in capsys.readouterr().err and out.read_bytes() == before  # never replaces the user's file
