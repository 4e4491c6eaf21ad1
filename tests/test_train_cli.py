"""`vitlab train / eval / predict` end to end on a tiny model (`vitlab demo`: tests/test_demo.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitlab.cli import main
from vitlab.cli.eval import format_result
from vitlab.data.synthetic import SYNTHETIC_CLASSES, load_synthetic

ROOT = Path(__file__).resolve().parents[1]
TINY_SETS = ["model.embed_dim=32", "model.depth=1", "model.num_heads=2", "model.mlp_dim=64", "train.steps=3",
             "train.epochs=null", "train.time_budget_min=null", "train.evaluators.eval.max_samples=500",
             "train.evaluators.eval.every=0", "train.checkpoint_every=0", "train.log_every=1"]
CLASSES = list(SYNTHETIC_CLASSES)  # the runs here train on the in-memory synthetic data (any machine)


def _sets() -> list[str]:
    out = []
    for s in [*TINY_SETS, "data.dataset=synthetic"]:
        out += ["--set", s]
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny run shared by the tests of this file."""
    run = tmp_path_factory.mktemp("cli") / "run"
    rc = main(["train", str(ROOT / "configs/fmnist_scratch.yaml"), "-o", str(run), "--no-progress",
               *_sets()])
    assert rc == 0
    return run


def test_train_cli_writes_a_run_and_refuses_to_overwrite_it(trained, capsys):
    assert (trained / "model.safetensors").is_file() and (trained / "report.md").is_file()
    rows = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3]
    assert {"loss", "lr", "images_per_s", "grad_norm"} <= set(rows[0])
    capsys.readouterr()
    rc = main(["train", str(ROOT / "configs/fmnist_scratch.yaml"), "-o", str(trained), "--no-progress",
               *_sets()])
    assert rc == 1 and "--resume" in capsys.readouterr().err  # exit 1: an error in the input


def test_train_cli_bad_override_is_a_clear_error(tmp_path, capsys):
    rc = main(["train", str(ROOT / "configs/fmnist_scratch.yaml"), "-o", str(tmp_path / "r"), "--set",
               "train.batchsize=3"])
    err = capsys.readouterr().err
    assert rc == 1 and "batchsize" in err and "batch_size" in err
    assert err.startswith("vitlab train: error: ") and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_set_takes_several_overrides_and_repeats():
    """`--set a=1 b=2 --set c=3` gives all three, in order (the docs write several after one --set)."""
    import argparse

    from vitlab.cli.train import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["c.yaml", "--set", "train.steps=3", "optim.lr=1e-3", "--set", "model.depth=1"])
    assert args.config == "c.yaml"
    assert args.overrides == ["train.steps=3", "optim.lr=1e-3", "model.depth=1"]
    assert p.parse_args(["c.yaml"]).overrides == []


def test_set_steps_replaces_a_recipes_epochs_and_back():
    """A run's length is steps OR epochs: `--set train.steps=20` on a recipe counting epochs means 20 steps (the
    quick look the demo's help shows); setting both in one call is still the clear error."""
    from vitlab.train.recipe import load_recipe

    epochs = ROOT / "configs" / "demo_pretrain.yaml"  # counts epochs
    steps = ROOT / "configs" / "demo_transfer.yaml"   # counts steps
    assert load_recipe(epochs).train.epochs and load_recipe(epochs).train.steps is None
    r = load_recipe(epochs, ["train.steps=20"])
    assert (r.train.steps, r.train.epochs) == (20, None)
    r = load_recipe(steps, ["train.epochs=0.5"])
    assert (r.train.steps, r.train.epochs) == (None, 0.5)
    with pytest.raises(ValueError, match="exactly one of steps or epochs"):
        load_recipe(epochs, ["train.steps=20", "train.epochs=2"])


def _test_images(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first n test images (N, 28, 28) uint8 and labels, as generated (not through the eval pipeline)."""
    data = load_synthetic("test")
    return data.images[:n, 0], data.labels[:n]


def test_eval_cli_numbers_are_consistent(trained, capsys):
    capsys.readouterr()
    assert main(["eval", str(trained / "model.safetensors"), "--data", "synthetic", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    conf = np.array(r["confusion"])
    assert conf.shape == (10, 10) and conf.sum() == r["num_samples"] == 10000
    assert (conf.sum(1) == 1000).all()  # the test set (as Fashion-MNIST's): 1000 images per class
    assert r["top1"] == pytest.approx(np.trace(conf) / 10000)
    assert r["per_class"]["pattern 1"] == pytest.approx(conf[1, 1] / 1000)
    assert r["top5"] >= r["top1"] and r["classes"] == CLASSES
    text = format_result(r)  # what the command prints without --json
    assert "confusion matrix" in text and f"top-1 {100 * r['top1']:.2f}%" in text


def test_eval_cli_hflip_tta(trained, capsys):
    """--tta hflip evaluates every image and its mirror image; it is reported as such, and bad values are refused."""
    ckpt, data = str(trained / "model.safetensors"), "synthetic"
    capsys.readouterr()
    assert main(["eval", ckpt, "--data", data, "--json", "--tta", "hflip"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["tta"] == "hflip" and np.array(r["confusion"]).sum() == r["num_samples"] == 10000
    assert "test-time augmentation: hflip" in format_result(r)
    with pytest.raises(SystemExit):
        main(["eval", ckpt, "--data", data, "--tta", "rotate"])


def test_eval_cli_center_crop_matches_torchvision_pipeline(trained, capsys):
    """--crop-fraction evaluates centre crops: the same predictions as torchvision's Resize + CenterCrop image by
    image; a bad fraction is a clear error."""
    import torch
    import torchvision.transforms.v2 as T

    from vitlab.weights import load_model

    ckpt, data = str(trained / "model.safetensors"), "synthetic"
    capsys.readouterr()
    assert main(["eval", ckpt, "--data", data, "--json", "--crop-fraction", "0.8"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["eval_resize"] == "center_crop" and r["crop_fraction"] == 0.8
    assert "centre crop 0.8" in format_result(r)
    model = load_model(ckpt).eval()
    size = model.cfg.img_size
    tf = T.Compose([T.Resize(round(size / 0.8)), T.CenterCrop(size), T.ToDtype(torch.float32, scale=True),
                    T.Normalize([0.5], [0.5])])
    images, labels = _test_images(10000)
    x = torch.stack([tf(torch.from_numpy(img.copy())[None]) for img in images])  # (10000, 1, size, size)
    with torch.no_grad():
        pred = torch.cat([model(b).argmax(-1) for b in x.split(1000)]).numpy()
    assert abs(r["top1"] - (pred == labels).mean()) <= 0.002  # torchvision rounds its resize to uint8
    capsys.readouterr()
    assert main(["eval", ckpt, "--data", data, "--crop-fraction", "1.5"]) == 1
    assert "eval_crop_fraction" in capsys.readouterr().err


def test_predict_cli_names_labels(trained, tmp_path, capsys):
    images, _ = _test_images(2)
    paths = []
    for i, img in enumerate(images):
        paths.append(str(tmp_path / f"img{i}.png"))
        Image.fromarray(img).save(paths[-1])
    capsys.readouterr()
    assert main(["predict", str(trained / "model.safetensors"), *paths, "--top-k", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [o["image"] for o in out] == paths
    for o in out:
        assert len(o["top"]) == 3 and all(t["label"] == CLASSES[t["index"]] for t in o["top"])
        probs = [t["prob"] for t in o["top"]]
        assert probs == sorted(probs, reverse=True) and sum(probs) <= 1 + 1e-6
    rc = main(["predict", str(trained / "model.safetensors"), str(tmp_path / "missing.png")])
    assert rc == 1 and "missing.png" in capsys.readouterr().err


def test_eval_and_predict_run_through_speed_modes(trained, tmp_path, capsys):
    """--mode routes through vitlab.optimize: int8 and bf16 keep the fp32 answers on a trained model."""
    ckpt = str(trained / "model.safetensors")
    data = ["--data", "synthetic", "--json"]
    capsys.readouterr()
    assert main(["eval", ckpt, *data]) == 0
    ref = json.loads(capsys.readouterr().out)
    assert main(["eval", ckpt, *data, "--mode", "int8"]) == 0
    q = json.loads(capsys.readouterr().out)
    assert q["mode"] == "int8" and q["num_samples"] == 10000
    assert abs(q["top1"] - ref["top1"]) < 0.02
    images, _ = _test_images(4)
    paths = []
    for i, img in enumerate(images):
        paths.append(str(tmp_path / f"img{i}.png"))
        Image.fromarray(img).save(paths[-1])
    tops = {}
    for mode in ("fp32", "bf16"):
        assert main(["predict", ckpt, *paths, "--top-k", "1", "--json", "--mode", mode]) == 0
        tops[mode] = [o["top"][0] for o in json.loads(capsys.readouterr().out)]
    assert [t["index"] for t in tops["bf16"]] == [t["index"] for t in tops["fp32"]]
    assert [t["prob"] for t in tops["bf16"]] == pytest.approx([t["prob"] for t in tops["fp32"]], abs=0.03)
    with pytest.raises(SystemExit):
        main(["predict", ckpt, *paths, "--mode", "int4"])


def test_cli_output_into_a_closed_pipe_stops_quietly():
    """`vitlab ... | head` where the reader has gone: exit status 141 (SIGPIPE's), no traceback on stderr."""
    import subprocess
    import sys

    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first write
    try:
        proc = subprocess.run([sys.executable, "-m", "vitlab.cli", "models"], stdout=w, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    finally:
        os.close(w)
    assert proc.returncode == 141 and "Traceback" not in proc.stderr, proc.stderr
