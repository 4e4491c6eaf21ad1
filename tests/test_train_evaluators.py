"""What the training log reports beyond the loss: images/s, MFU and ETA on every training row, and the recipe's
evaluators (the paper's few-shot linear probe, Sec. 4.1) run at their declared steps with their numbers in
metrics.jsonl, the report and the typed result."""

from __future__ import annotations

import json
import math

import pytest

from vitlab.inference.evaluate import EvalResult
from vitlab.train import Recipe, TrainResult, train
from vitlab.train.meter import peak_flops
from vitlab.train.recipe import FewShotEvaluator
from vitlab.train.report import read_metrics

TINY = {"name": "ViT-Ti/16", "embed_dim": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64, "img_size": 28,
        "patch_size": 7, "in_chans": 1}
FEWSHOT = {"kind": "fewshot", "every": 2, "shots": [1, 3], "seeds": 2, "train_samples": 200, "eval_samples": 100}


def _recipe(data: dict, **train_kw) -> Recipe:
    tr = {"batch_size": 16, "steps": 5, "precision": "fp32", "log_every": 1, "eval_max_samples": 100,
          "deterministic": True, **train_kw}
    return Recipe.from_dict({"model": TINY, "data": data, "optim": {"lr": 1e-3}, "train": tr})


def test_fewshot_evaluator_runs_at_declared_steps_and_lands_in_metrics(tmp_path, synthetic_data):
    losses: list[float] = []
    result = train(_recipe(synthetic_data, evaluators=[FEWSHOT]), tmp_path / "run", progress=False,
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


@pytest.mark.parametrize(("spec", "words"), [
    ({"kind": "linear"}, "unknown evaluator kind 'linear'"),
    ({"every": 2}, "unknown evaluator kind None"),
    ({"kind": "fewshot", "shot": [5]}, "['shot']"),
    ({"kind": "fewshot", "shots": []}, "train.evaluators[0].shots must be a non-empty list"),
    ({"kind": "fewshot", "shots": [0]}, "train.evaluators[0].shots must be >= 1"),
    ({"kind": "fewshot", "every": -1}, "train.evaluators[0].every must be >= 0"),
    ({"kind": "fewshot", "eval_split": "train"}, "train.evaluators[0].eval_split must be one of"),
    ({"kind": "fewshot", "name": "train"}, "train.evaluators[0].name must be"),
])
def test_bad_evaluators_are_named(spec, words):
    with pytest.raises(ValueError) as e:
        Recipe.from_dict({"train": {"steps": 1, "evaluators": [spec]}})
    assert words in str(e.value) and "train.evaluators[0]" in str(e.value)


def test_evaluators_validate_round_trip_and_need_unique_names():
    r = Recipe.from_dict({"train": {"steps": 1, "evaluators": [{"kind": "fewshot", "every": 100}]}})
    (ev,) = r.train.evaluators
    assert isinstance(ev, FewShotEvaluator) and ev.every == 100 and ev.shots == [5]
    assert Recipe.from_dict(r.to_dict()).train.evaluators == r.train.evaluators  # recipe.yaml reads back
    with pytest.raises(ValueError, match="names must be unique"):
        Recipe.from_dict({"train": {"steps": 1, "evaluators": [{"kind": "fewshot"}, {"kind": "fewshot"}]}})


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
    done = train(_recipe(synthetic_data, evaluators=[FEWSHOT]), tmp_path / "run", resume=True, progress=False)
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
