"""Early stopping on the held-out val split (`train.early_stop_every` / `early_stop_patience`): the run stops after
`patience` evaluations without a new best, ends with the best evaluation's weights (the final evaluation scores
them, model.safetensors holds them), and a resumed run keeps the best weights it had found before the interruption.
The val top-1 sequence is scripted, so the test checks the bookkeeping, not learning."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from safetensors.torch import load_file

import vitlab.train.evaluators as evaluators_mod
from vitlab.data import DataConfig, build_eval_data
from vitlab.inference.evaluate import EvalResult, evaluate
from vitlab.train import Recipe, train
from vitlab.weights import load_model

TINY = {"name": "ViT-Ti/16", "embed_dim": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32, "img_size": 28,
        "patch_size": 7, "in_chans": 1}
VAL_TOP1 = [0.50, 0.70, 0.60, 0.65, 0.40, 0.90, 0.95, 0.99]  # the best is at step 2; two worse ones follow


def _recipe(**train_kw) -> Recipe:
    tr = {"batch_size": 16, "steps": 8, "precision": "fp32", "log_every": 1, "checkpoint_every": 1,
          "keep_checkpoints": 10, "eval_batch_size": 100, "eval_max_samples": 100, "early_stop_every": 1,
          "early_stop_patience": 2, **train_kw}
    return Recipe.from_dict({"model": TINY, "data": {"dataset": "synthetic", "val_fraction": 0.05},
                             "optim": {"name": "adamw", "lr": 3e-3}, "train": tr})


@pytest.fixture
def scripted_val(monkeypatch):
    """`evaluate` in the evaluators module: the real one for the test split, the scripted top-1 for the val split."""
    real = evaluators_mod.evaluate
    calls: list[int] = []

    def fake(model, data, num_classes, **kw):
        if not data.name.endswith("/val"):
            return real(model, data, num_classes, **kw)
        top1 = VAL_TOP1[len(calls)]
        calls.append(1)
        return EvalResult(top1=top1, top5=1.0, loss=1.0 - top1, num_samples=data.num_samples)

    monkeypatch.setattr(evaluators_mod, "evaluate", fake)
    return calls


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_stops_after_patience_and_ends_with_the_best_weights(tmp_path, scripted_val):
    result = train(_recipe(), tmp_path / "run", progress=False)
    assert result.step == 4 and result.status.startswith("completed (early stop at step 4")
    assert result.best_step == 2 and result.best_val_top1 == pytest.approx(0.70)
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["best_step"] == 2 and report["images_seen"] == 4 * 16
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
    result = train(_recipe(early_stop_patience=0), tmp_path / "run", progress=False)
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
                          "train": {"steps": 2, "early_stop_every": 1}})
    with pytest.raises(ValueError, match=r"early_stop_patience needs train\.early_stop_every"):
        Recipe.from_dict({"model": TINY, "data": {"dataset": "synthetic", "val_fraction": 0.1},
                          "train": {"steps": 2, "early_stop_patience": 3}})
