"""Early stopping on the held-out val split (an evaluator of `type: early_stop` in `train.evaluators`,
`vitlab.train.early_stop`): the rule judges the val loss or a smoothed top-1 with a patience in epochs, so that a
one-evaluation spike of the val top-1 while the loss still falls does not stop a run (issue 37); the run stops after
`patience_epochs` epochs without a new best, ends with the best evaluation's weights (the final evaluation scores
them, model.safetensors holds them), says so in its report with the curve, and a resumed run keeps the best weights
it had found before the interruption.
The val metrics are scripted, so the tests check the rule and the bookkeeping, not learning."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from safetensors.torch import load_file

import vitlab.train.evaluators as evaluators_mod
from vitlab.data import DataConfig, build_eval_data, build_train_stream
from vitlab.inference.evaluate import EvalResult, evaluate
from vitlab.train import Recipe, train
from vitlab.train.early_stop import EarlyStopper, Rule, summary, top1_standard_error
from vitlab.weights import load_model

TINY = {"name": "ViT-Ti/16", "embed_dim": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32, "img_size": 28,
        "patch_size": 7, "in_chans": 1}
VAL_TOP1 = [0.50, 0.70, 0.60, 0.65, 0.40, 0.90, 0.95, 0.99]  # the best is at step 2; two worse ones follow
# issue 37's failure: a one-evaluation spike of the val top-1 (step 3) while the val loss still falls
SPIKE_TOP1 = [0.80, 0.82, 0.86, 0.825, 0.83, 0.835, 0.84, 0.845, 0.85, 0.855]
FALLING_LOSS = [0.60, 0.55, 0.52, 0.50, 0.48, 0.46, 0.45, 0.44, 0.43, 0.42]
BATCH = 16
EPOCH = build_train_stream(DataConfig(dataset="synthetic", val_fraction=0.05), img_size=28, in_chans=1,
                           batch_size=BATCH, seed=0).epoch_size


def _epochs(steps: int) -> float:
    return steps * BATCH / EPOCH


def _recipe(**stop_kw) -> Recipe:
    tr = {"batch_size": BATCH, "steps": 8, "precision": "fp32", "log_every": 1, "checkpoint_every": 1,
          "keep_checkpoints": 10, "evaluators": {
              "eval": {"type": "classification", "batch_size": 100, "max_samples": 100},
              "early_stop": {"type": "early_stop", "every": 1, "patience_epochs": _epochs(2), "batch_size": 100,
                             **stop_kw}}}
    return Recipe.from_dict({"model": TINY, "data": {"dataset": "synthetic", "val_fraction": 0.05},
                             "optim": {"name": "adamw", "lr": 3e-3}, "train": tr})


@pytest.fixture
def scripted_val(monkeypatch):
    """`evaluate` in the evaluators module: the real one for the test split, a scripted (top-1, loss) for the val
    split: `script["top1"]` and `script["loss"]` (default 1 - top-1)."""
    real = evaluators_mod.evaluate
    script: dict = {"top1": VAL_TOP1, "loss": None, "calls": 0}

    def fake(model, data, num_classes, **kw):
        if not data.name.endswith("/val"):
            return real(model, data, num_classes, **kw)
        i = script["calls"]
        top1 = script["top1"][i]
        loss = script["loss"][i] if script["loss"] is not None else 1.0 - top1
        script["calls"] += 1
        return EvalResult(top1=top1, top5=1.0, loss=loss, num_samples=data.num_samples)

    monkeypatch.setattr(evaluators_mod, "evaluate", fake)
    return script


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_stops_after_patience_and_ends_with_the_best_weights(tmp_path, scripted_val):
    result = train(_recipe(), tmp_path / "run", progress=False)
    assert result.step == 4 and result.status.startswith("completed (early stop at step 4: no better val loss")
    assert result.best_step == 2 and result.best_val_top1 == pytest.approx(0.70)
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["best_step"] == 2 and report["images_seen"] == 4 * 16
    # the report says it stopped, with the curve: every val evaluation, the chosen best and the stop point
    es = report["early_stop"]
    assert es["stopped_early"] and es["stopped_at"] == 4 and es["best_step"] == 2 and es["metric"] == "loss"
    assert [r["top1"] for r in es["curve"]] == VAL_TOP1[:4] and es["val_images"] > 0
    assert es["val_top1_standard_error"] == pytest.approx(top1_standard_error(0.70, es["val_images"]))
    md = (tmp_path / "run" / "report.md").read_text()
    assert "**stopped early** at step 4 of 8" in md and "| 2 |" in md and "| best |" in md and "| stop |" in md
    final = load_file(str(tmp_path / "run" / "model.safetensors"))
    step2 = load_file(str(tmp_path / "run" / "checkpoints" / "step_00000002.safetensors"))
    step3 = load_file(str(tmp_path / "run" / "checkpoints" / "step_00000003.safetensors"))
    assert _same(final, step2) and not _same(final, step3)  # the kept weights, not the later ones
    # the final test evaluation scored the kept weights
    model = load_model(tmp_path / "run" / "model.safetensors")
    ev = build_eval_data(DataConfig(dataset="synthetic", val_fraction=0.05), "test", img_size=28, in_chans=1,
                         batch_size=100)
    assert evaluate(model, ev, ev.num_classes, precision="fp32", max_samples=100).top1 == report["final"]["top1"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["top1"] for r in rows if r["split"] == "eval_val"] == VAL_TOP1[:4]


def test_without_patience_the_run_goes_to_the_end_with_the_best_weights(tmp_path, scripted_val):
    result = train(_recipe(patience_epochs=0), tmp_path / "run", progress=False)
    assert result.step == 8 and result.status == "completed" and result.best_step == 8
    final = load_file(str(tmp_path / "run" / "model.safetensors"))
    assert _same(final, load_file(str(tmp_path / "run" / "checkpoints" / "step_00000008.safetensors")))
    assert not _same(final, load_file(str(tmp_path / "run" / "checkpoints" / "step_00000002.safetensors")))


def test_a_resumed_run_keeps_the_best_weights_found_before(tmp_path, scripted_val):
    def stop_at_3(step, _):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    first = train(_recipe(), tmp_path / "run", progress=False, on_step=stop_at_3)
    assert first.status.startswith("interrupted") and first.step == 3
    step2 = load_file(str(tmp_path / "run" / "checkpoints" / "step_00000002.safetensors"))
    second = train(_recipe(), tmp_path / "run", progress=False, resume=True)
    assert second.step == 4 and second.best_step == 2  # evaluations 1-3 came before the interruption
    assert _same(load_file(str(tmp_path / "run" / "model.safetensors")), step2)


def test_early_stopping_needs_a_val_split():
    with pytest.raises(ValueError, match=r"data\.val_fraction > 0"):
        Recipe.from_dict({"model": TINY, "data": {"dataset": "synthetic"},
                          "train": {"steps": 2, "evaluators": {"stop": {"type": "early_stop", "every": 1}}}})
    with pytest.raises(ValueError, match=r"train\.evaluators\.stop\.every must be an int >= 1"):
        Recipe.from_dict({"model": TINY, "data": {"dataset": "synthetic", "val_fraction": 0.1},
                          "train": {"steps": 2, "evaluators": {"stop": {"type": "early_stop", "patience_epochs": 3}}}})
    with pytest.raises(ValueError, match=r"at most one of type early_stop"):
        Recipe.from_dict({"model": TINY, "data": {"dataset": "synthetic", "val_fraction": 0.1},
                          "train": {"steps": 2, "evaluators": {"a": {"type": "early_stop", "every": 1},
                                                               "b": {"type": "early_stop", "every": 2}}}})


def test_a_raw_top1_is_refused_and_the_retired_key_names_its_replacement():
    data = {"dataset": "synthetic", "val_fraction": 0.1}
    with pytest.raises(ValueError, match=r"early_stop\.metric: top1 needs train\.evaluators\.early_stop\.smoothing: "
                                         r"ema or window"):
        Recipe.from_dict({"model": TINY, "data": data, "train": {"steps": 2, "evaluators": {
            "early_stop": {"type": "early_stop", "every": 1, "metric": "top1"}}}})
    with pytest.raises(ValueError, match=r"^train\.early_stop_patience is retired: set "
                                         r"train\.evaluators\.early_stop\.patience_epochs"):
        Recipe.from_dict({"model": TINY, "data": data, "train": {"steps": 2, "early_stop_patience": 5}})
    # a recipe.yaml written before the change holds `early_stop_patience: 0`: it still loads, unchanged
    old = Recipe.from_dict({"model": TINY, "data": data, "train": {"steps": 2, "early_stop_patience": 0}})
    assert old.to_dict() == Recipe.from_dict({"model": TINY, "data": data, "train": {"steps": 2}}).to_dict()


def _judge(rule: Rule, top1: list[float], loss: list[float], every: int = 1, epoch_images: int = 160) -> EarlyStopper:
    """The rule over scripted evaluations every `every` steps of 16 images; stops feeding at the first stop."""
    s = EarlyStopper(rule, images_per_step=16, epoch_images=epoch_images)
    for i, (a, b) in enumerate(zip(top1, loss)):
        if s.update((i + 1) * every, loss=b, top1=a).stop:
            break
    return s


def test_a_top1_spike_while_the_loss_falls_does_not_stop_the_rule():
    patience = 0.3  # epochs: 3 evaluations of 0.1 epoch
    # the old rule (raw top-1): the spike at step 3 is the best; three evaluations later it stops
    raw = _judge(Rule("top1", "none", 3, patience), SPIKE_TOP1, FALLING_LOSS)
    assert raw.best_step == 3 and raw.curve[-1]["step"] == 6
    # the val loss: every evaluation a new best, the run goes on to the end
    loss = _judge(Rule("loss", "none", 3, patience), SPIKE_TOP1, FALLING_LOSS)
    assert loss.best_step == 10 and len(loss.curve) == 10 and loss.best_value == pytest.approx(0.42)
    # a window mean of 3: (0.82 + 0.86 + 0.825) / 3 at step 4 ... a new best at step 8 before the patience runs out
    window = _judge(Rule("top1", "window", 3, patience), SPIKE_TOP1, FALLING_LOSS)
    assert len(window.curve) == 10 and window.best_step == 10
    assert window.curve[3]["judged"] == pytest.approx((0.82 + 0.86 + 0.825) / 3)
    assert window.best_value == pytest.approx((0.845 + 0.85 + 0.855) / 3)
    # an EMA of span 5 (alpha 1/3) damps the spike to a third: rising at every evaluation
    ema = _judge(Rule("top1", "ema", 5, patience), SPIKE_TOP1, FALLING_LOSS)
    assert len(ema.curve) == 10 and ema.best_step == 10
    assert ema.curve[2]["judged"] == pytest.approx(0.86 / 3 + 2 / 3 * (0.82 / 3 + 2 / 3 * 0.80))


def test_patience_counts_epochs_not_evaluations():
    top1 = [0.5, 0.9] + [0.6] * 30
    loss = [1 - a for a in top1]
    # the same training evaluated every step or every 2 steps stops after the same 0.4 epochs without a new best
    often = _judge(Rule("loss", "none", 3, 0.4), top1, loss, every=1)
    rarely = _judge(Rule("loss", "none", 3, 0.4), top1, loss, every=2)
    assert often.curve[-1]["step"] - often.best_step == rarely.curve[-1]["step"] - rarely.best_step == 4
    assert often.epochs(4) == pytest.approx(0.4)
    # without patience it never stops; the summary states the val split's standard error
    never = _judge(Rule("loss", "none", 3, 0.0), top1, loss)
    assert len(never.curve) == len(top1) and never.best_step == 2
    s = summary(never, val_images=1200, stopped_at=None, total_steps=32)
    assert not s["stopped_early"] and s["best_val_top1"] == 0.9
    assert s["val_top1_standard_error"] == pytest.approx((0.9 * 0.1 / 1200) ** 0.5)


def test_a_run_with_a_top1_spike_and_a_falling_loss_trains_to_its_end(tmp_path, scripted_val):
    scripted_val["top1"], scripted_val["loss"] = SPIKE_TOP1, FALLING_LOSS
    result = train(_recipe(patience_epochs=_epochs(3)), tmp_path / "run", progress=False)
    assert result.status == "completed" and result.step == 8 and result.best_step == 8
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert not report["early_stop"]["stopped_early"] and report["early_stop"]["best_step"] == 8
    assert [r["loss"] for r in report["early_stop"]["curve"]] == FALLING_LOSS[:8]
    assert "ran to its last step (8)" in (tmp_path / "run" / "report.md").read_text()
