"""What the training log reports beyond the loss: images/s, MFU and ETA on every training row, and the recipe's
evaluators (`train.evaluators`, big_vision's `config.evals`: name -> {type, every, ...}; the paper's few-shot linear
probe, Sec. 4.1) run at their declared steps with their numbers in metrics.jsonl, the report and the typed result;
the evaluation keys they replaced are refused with one line naming the new key."""

from __future__ import annotations

import json
import math
import re

import pytest
import yaml

from vitlab.inference.evaluate import EvalResult
from vitlab.train import Recipe, TrainResult, load_recipe, train
from vitlab.train.evalconfig import RETIRED, ClassificationEvaluator, EarlyStopEvaluator, FewShotEvaluator
from vitlab.train.meter import peak_flops
from vitlab.train.report import read_metrics
from vitlab.train.rundir import read_run_recipe

TINY = {"name": "ViT-Ti/16", "embed_dim": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64, "img_size": 28,
        "patch_size": 7, "in_chans": 1}
FEWSHOT = {"type": "fewshot", "every": 2, "shots": [1, 3], "seeds": 2, "train_samples": 200, "eval_samples": 100}
EVAL = {"type": "classification", "max_samples": 100}


def _recipe(data: dict, fewshot: bool = False, **train_kw) -> Recipe:
    tr = {"batch_size": 16, "steps": 5, "precision": "fp32", "log_every": 1, "deterministic": True,
          "evaluators": {"eval": EVAL, **({"fewshot": FEWSHOT} if fewshot else {})}, **train_kw}
    return Recipe.from_dict({"model": TINY, "data": data, "optim": {"lr": 1e-3}, "train": tr})


def test_fewshot_evaluator_runs_at_declared_steps_and_lands_in_metrics(tmp_path, synthetic_data):
    losses: list[float] = []
    result = train(_recipe(synthetic_data, fewshot=True), tmp_path / "run", progress=False,
                   on_step=lambda step, r: losses.append(r.loss))
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    fewshot = [r for r in rows if r["split"] == "fewshot"]
    assert [r["step"] for r in fewshot] == [2, 4, 5]  # every 2 steps, and at the end of the run
    for r in fewshot:
        for k in ("1shot", "3shot"):
            assert 0.0 <= r[k] <= 1.0 and r[f"{k}_std"] >= 0.0
    # the typed result and the report carry the last values
    assert isinstance(result, TrainResult) and isinstance(result.eval, EvalResult)
    assert result.evaluators["fewshot"]["3shot"] == fewshot[-1]["3shot"]
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["evaluators"]["fewshot"]["step"] == 5
    assert "fewshot at step 5: 1-shot" in (tmp_path / "run" / "report.md").read_text()
    json.dumps(result.to_dict())  # JSON-ready
    # evaluators only read the model: the same recipe without them takes exactly the same steps
    plain: list[float] = []
    train(_recipe(synthetic_data), tmp_path / "plain", progress=False, on_step=lambda step, r: plain.append(r.loss))
    assert plain == losses


def test_training_rows_report_images_per_s_mfu_and_eta(tmp_path, synthetic_data):
    result = train(_recipe(synthetic_data), tmp_path / "run", progress=False)
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["split"] == "train"]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    for r in rows:
        assert r["images_per_s"] > 0 and 0 < r["mfu"] < 1
        assert math.isfinite(r["eta_s"]) and r["eta_s"] >= 0
        # the remaining steps at this run's mean step time so far
        assert r["eta_s"] == pytest.approx(r["train_time_s"] / r["step"] * (5 - r["step"]), rel=1e-9)
    assert rows[-1]["eta_s"] == 0  # nothing left
    assert result.images_per_s > 0 and 0 < result.mfu < 1
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["median_mfu"] == result.mfu
    assert "MFU" in (tmp_path / "run" / "report.md").read_text()


def test_peak_flops_is_measured_once_per_process():
    first = peak_flops("cpu", "fp32")
    hits = peak_flops.cache_info().hits
    assert first > 1e8  # any CPU multiplies faster than 0.1 GFLOP/s
    assert peak_flops("cpu", "fp32") == first and peak_flops.cache_info().hits == hits + 1


@pytest.mark.parametrize(("name", "spec", "words"), [
    ("probe", {"type": "linear"}, "unknown evaluator type 'linear'"),
    ("probe", {"every": 2}, "unknown evaluator type None"),
    ("probe", {"kind": "fewshot"}, "unknown evaluator type None (`kind` is now `type`)"),
    ("probe", {"type": "fewshot", "shot": [5]}, "['shot']"),
    ("probe", {"type": "fewshot", "shots": []}, "train.evaluators.probe.shots must be a non-empty list"),
    ("probe", {"type": "fewshot", "shots": [0]}, "train.evaluators.probe.shots must be >= 1"),
    ("probe", {"type": "fewshot", "every": -1}, "train.evaluators.probe.every must be >= 0"),
    ("probe", {"type": "fewshot", "eval_split": "train"}, "train.evaluators.probe.eval_split must be one of"),
    ("eval_probe", {"type": "fewshot"}, "train.evaluators.eval_probe: a fewshot evaluator's name"),
    ("eval", {"type": "classification", "split": "train"}, "train.evaluators.eval.split must be one of"),
    ("eval", {"type": "classification", "max_samples": 0}, "train.evaluators.eval.max_samples must be >= 1"),
    ("stop", {"type": "early_stop"}, "train.evaluators.stop.every must be an int >= 1"),
    ("stop", {"type": "early_stop", "every": 1, "metric": "top5"}, "train.evaluators.stop.metric must be one of"),
])
def test_bad_evaluators_are_named(name, spec, words):
    with pytest.raises(ValueError) as e:
        Recipe.from_dict({"train": {"steps": 1, "evaluators": {name: spec}}})
    assert words in str(e.value) and f"train.evaluators.{name}" in str(e.value)


def test_evaluators_validate_round_trip_order_and_default():
    r = Recipe.from_dict({"data": {"val_fraction": 0.1}, "train": {"steps": 1, "evaluators": {
        "fewshot": {"type": "fewshot", "every": 100}, "stop": {"type": "early_stop", "every": 5},
        "test": {"type": "classification", "every": 50}}}})
    # in the order they run at a step: the classification one, early stopping, then the others as declared
    assert list(r.train.evaluators) == ["test", "stop", "fewshot"]
    fs = r.train.evaluators["fewshot"]
    assert isinstance(fs, FewShotEvaluator) and fs.every == 100 and fs.shots == [5]
    assert r.train.evaluation == ClassificationEvaluator(every=50) and r.train.evaluation.row_split == "eval_test"
    assert r.train.early_stopping == EarlyStopEvaluator(every=5)
    assert Recipe.from_dict(r.to_dict()).train.evaluators == r.train.evaluators  # recipe.yaml reads back
    assert r.to_dict()["train"]["evaluators"]["fewshot"]["type"] == "fewshot"  # the name is the key, not a field
    # none declared: the run's classification evaluator, `eval`, on the test split at the end
    plain = Recipe.from_dict({"train": {"steps": 1}})
    assert plain.train.evaluators == {"eval": ClassificationEvaluator()} and plain.train.early_stopping is None
    with pytest.raises(ValueError, match=r"at most one of type classification, got \['a', 'b'\]"):
        Recipe.from_dict({"train": {"steps": 1, "evaluators": {"a": {"type": "classification"},
                                                               "b": {"type": "classification"}}}})
    with pytest.raises(ValueError, match=r"^train\.evaluators is a mapping of name -> settings now, not a list"):
        Recipe.from_dict({"train": {"steps": 1, "evaluators": [{"kind": "fewshot", "every": 100}]}})
    assert Recipe.from_dict({"train": {"steps": 1, "evaluators": []}}).train.evaluators == plain.train.evaluators


@pytest.mark.parametrize(("old", "value", "new"), [
    ("eval_every", 100, "train.evaluators.eval.every (type: classification)"),
    ("eval_split", "val", "train.evaluators.eval.split"),
    ("eval_max_samples", 500, "train.evaluators.eval.max_samples"),
    ("eval_batch_size", 250, "the batch_size of each of train.evaluators"),
    ("early_stop_every", 10, "train.evaluators.early_stop.every (type: early_stop)"),
    ("early_stop_metric", "top1", "train.evaluators.early_stop.metric"),
    ("early_stop_smoothing", "ema", "train.evaluators.early_stop.smoothing"),
    ("early_stop_smooth_evals", 5, "train.evaluators.early_stop.smooth_evals"),
    ("early_stop_patience_epochs", 2.0, "train.evaluators.early_stop.patience_epochs"),
])
def test_the_old_evaluation_keys_are_refused_with_one_line_naming_the_new_key(tmp_path, old, value, new):
    data = {"dataset": "synthetic", "val_fraction": 0.1}
    with pytest.raises(ValueError, match=rf"^train\.{old} is retired: set {re.escape(new)}") as e:
        Recipe.from_dict({"data": data, "train": {"steps": 1, old: value}})
    assert "\n" not in str(e.value)
    path = tmp_path / "old.yaml"  # from a file: one line too, naming the file
    path.write_text(f"train:\n  steps: 1\n  {old}: {value}\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: train\.{old} is retired: set ") as e:
        load_recipe(path, check_data=False)
    assert "\n" not in str(e.value)
    # beside a train.evaluators mapping (a --set on a recipe of the new form), even its old default is refused
    off = RETIRED[old][0]
    with pytest.raises(ValueError, match=rf"^train\.{old} is retired"):
        Recipe.from_dict({"train": {"steps": 1, old: off, "evaluators": {"eval": {"type": "classification"}}}})
    # a recipe.yaml written before the change holds every one at its default: it still loads, meaning the same
    assert Recipe.from_dict({"train": {"steps": 1, old: off, "evaluators": []}}).to_dict() == \
        Recipe.from_dict({"train": {"steps": 1}}).to_dict()


def test_a_run_recorded_in_the_old_form_reads_back_in_the_new_form(tmp_path):
    """A run's recipe.yaml written before `train.evaluators` took the evaluation keys (what --resume compares with):
    the same evaluations in the new form (`evalconfig.upgrade`)."""
    old = {"data": {"dataset": "synthetic", "val_fraction": 0.1}, "train": {
        "steps": 10, "eval_every": 5, "eval_split": "val", "eval_batch_size": 50, "eval_max_samples": None,
        "early_stop_every": 2, "early_stop_metric": "top1", "early_stop_smoothing": "ema", "early_stop_smooth_evals": 4,
        "early_stop_patience_epochs": 1.5, "early_stop_patience": 0,
        "evaluators": [{"kind": "fewshot", "name": "fewshot", "every": 5, "batch_size": None}]}}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(old))
    r = read_run_recipe(tmp_path / "recipe.yaml")
    assert r.train.evaluators == {
        "eval": ClassificationEvaluator(every=5, split="val", batch_size=50),
        "early_stop": EarlyStopEvaluator(every=2, metric="top1", smoothing="ema", smooth_evals=4, patience_epochs=1.5,
                                         batch_size=50),
        "fewshot": FewShotEvaluator(every=5, batch_size=50)}


def test_evaluators_may_be_added_when_resuming(tmp_path, synthetic_data):
    """Evaluators change nothing the optimizer sees, so a resumed run may add them (train.evaluators is one of the
    keys that may change); they run from there on."""
    import os
    import signal

    def stop_after_2(step, result):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    part = train(_recipe(synthetic_data), tmp_path / "run", progress=False, on_step=stop_after_2)
    assert part.status == "interrupted (SIGTERM)" and part.step == 2 and part.model is None and part.eval is None
    done = train(_recipe(synthetic_data, fewshot=True), tmp_path / "run", resume=True, progress=False)
    assert done.status == "completed" and done.resumed_from is not None
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows if r["split"] == "fewshot"] == [4, 5]
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3, 4, 5]


def test_meter_measures_the_peak_again_when_the_run_outruns_it(monkeypatch):
    """A probe taken while the cores were busy under-states the peak; MFU must not then read above 100%."""
    from vitlab import ViTConfig
    from vitlab.train import meter

    monkeypatch.setattr(meter, "peak_flops", lambda *a, **k: 1.0)  # a probe that ran on a busy machine
    probes = []
    monkeypatch.setattr(meter, "measure_peak", lambda *a, seconds=0.2: probes.append(seconds) or 1e18)
    m = meter.Meter(ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, mlp_dim=64), "cpu", "fp32")
    m.start(0.0, 0, 0)
    speed = m.interval(1.0, 100, 1, 10, (32, 32))
    assert probes == [1.0] and 0 < speed.mfu < 1
    m.interval(2.0, 200, 2, 10, (32, 32))
    assert probes == [1.0]  # measured again once, not at every interval
