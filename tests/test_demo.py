"""`vitlab demo` (`vitlab.paper.demo`): the whole demo on a tiny model, through `vitlab reproduce`'s sub-runs,
transfer task and report page; the old import path names the new one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vitlab.cli import main
from vitlab.data.synthetic import SYNTHETIC_CLASSES, load_synthetic

ROOT = Path(__file__).resolve().parents[1]
# every run 2 steps on 600 synthetic images, a point of the eval curve per step on the first 30 test images
TINY = ["train.steps=2", "train.epochs=null", "train.time_budget_min=null", "train.evaluators.eval.every=1",
        "train.evaluators.eval.max_samples=30", "model.depth=1", "data.dataset=synthetic", "data.num_samples=600",
        "train.batch_size=32"]


@pytest.mark.slow
def test_demo_runs_end_to_end_tiny(tmp_path, capsys):
    """The whole demo at 2 steps per run on synthetic data: pre-train at the recipe's low resolution, fine-tune at
    its high one, four transfer runs, the analysis, one self-contained page; with --seeds 2 the two headline
    comparisons again with each recipe's seed + 1, and their seed spread on the page."""
    import yaml

    from vitlab.models.config import pixels_per_token
    from vitlab.paper.demo import full_evaluation
    from vitlab.train import load_recipe
    from vitlab.weights import load_model

    out = tmp_path / "demo"
    sets = [a for s in TINY for a in ("--set", s)]
    assert main(["demo", "-o", str(out), "--no-progress", "--seeds", "2", *sets]) == 0
    printed = capsys.readouterr().out
    assert f"report: {out / 'report.html'}" in printed
    summary = json.loads((out / "demo.json").read_text())
    pre, ft, same = summary["pretrain"], summary["finetune"], summary["same_resolution"]
    assert pre["steps"] == 2 and ft["steps"] == 2 and same["steps"] == 2
    for stage, name in ((pre, "demo_pretrain.yaml"), (ft, "demo_finetune.yaml")):
        m = yaml.safe_load((ROOT / "configs" / name).read_text())["model"]
        size, stride = m["img_size"], pixels_per_token(m["patch_size"], m["hybrid_layers"])
        model = load_model(stage["model"])
        assert model.cfg.img_size == size and model.cfg.grid_size == (size // stride, size // stride)
        # a point per step on the subset, then the final model on the whole test split (a sixth of 600 images)
        assert [p["step"] for p in stage["curve"]] == [1, 2]
        assert stage["test_images"] == len(load_synthetic("test", 600).labels) == 100
    assert ft["img_size"] > pre["img_size"] == same["img_size"]  # the control: fine-tuning's recipe, low resolution
    assert load_model(same["model"]).cfg.img_size == pre["img_size"]
    assert ft["grid"][0] > pre["grid"][0]  # same patch, longer sequence (paper Sec. 3.2)
    runs = summary["transfer"]["runs"]
    assert [r["labels_per_class"] for r in runs] == [10, "all"]
    assert runs[0]["train_images"] == 10 * len(SYNTHETIC_CLASSES)
    assert all(r[k]["steps"] == 2 for r in runs for k in ("pretrained", "scratch"))
    assert summary["machine"]["host_class"] and summary["machine"]["summary"]  # vitlab.perf.cpu.machine_summary

    # the page is the reproduce report's: the claims first, every image inlined, the numbers in demo.json
    page = (out / "report.html").read_text()
    assert "<script" not in page and page.count("<img") >= 6 and page.count('src="data:image/png;base64,') == \
        page.count("<img")
    assert "The paper's claim and our measurement" in page
    for value in (pre["top1"], ft["top1"], same["top1"], runs[0]["pretrained"]["top1"], runs[0]["scratch"]["top1"]):
        assert f"{100 * value:.2f}%" in page
    claims = summary["claims"]
    assert claims[0]["paper"].startswith("Sec. 3.2") and claims[1]["paper"].startswith("Sec. 4.2")
    assert len(claims) == 2 + len(summary["findings"])
    assert all((out / f"{stem}.png").is_file() and (out / f"{stem}.json").is_file()
               for stem in ("eval_curve", "transfer", "attention_distance"))

    # --seeds 2: each comparison once more with the recipe's seed + 1, from the one pre-training
    for d, recipe in (("finetune-seed1", "demo_finetune.yaml"), ("same_resolution-seed1", "demo_finetune.yaml"),
                      ("transfer/pretrained_10-seed1", "demo_transfer.yaml"), ("transfer/scratch_all-seed1",
                                                                                "demo_transfer.yaml")):
        seed = yaml.safe_load((ROOT / "configs" / recipe).read_text())["train"]["seed"]
        assert yaml.safe_load((out / d / "recipe.yaml").read_text())["train"]["seed"] == seed + 1
    spread = summary["seed_spread"]
    gains = spread["resolution_gain"]["values"]
    ft1, same1 = (full_evaluation(load_recipe(out / d / "recipe.yaml"), str(out / d / "model.safetensors")).top1
                  for d in ("finetune-seed1", "same_resolution-seed1"))
    assert gains == pytest.approx([ft["top1"] - same["top1"], ft1 - same1])  # both on the whole test split
    assert spread["resolution_gain"]["se"] == pytest.approx(abs(gains[0] - gains[1]) / 2)  # s / sqrt(2), N = 2
    assert set(spread["transfer"]) == {"10", "all"}
    assert spread["transfer"]["10"]["values"][0] == pytest.approx(runs[0]["pretrained"]["top1"]
                                                                  - runs[0]["scratch"]["top1"])
    assert "Seed spread of the headline differences (2 seeds)" in page
    assert f"{100 * spread['resolution_gain']['mean']:+.2f} ± {100 * spread['resolution_gain']['se']:.2f}" in page
    assert "2 seeds: fine-tune minus control" in printed
    assert main(["demo", "-o", str(out)]) == 1  # never overwrites a demo


def test_the_old_import_path_names_the_new_one():
    with pytest.raises(ImportError, match=r"vitlab\.paper\.demo"):
        from vitlab.train.demo import run_demo  # noqa: F401
