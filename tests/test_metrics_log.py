"""metrics.jsonl read back: a torn last line (a kill mid-write) is dropped, a resumed run's replayed steps keep
their latest row, a run resumed after such a kill loses no row, and the file (and TensorBoard's log) of a resumed
run holds each step once, in order."""

from __future__ import annotations

import json
import os
import signal

import pytest

from vitlab.train import Recipe, list_checkpoints, train
from vitlab.train.report import read_metrics


def _row(step: int, split: str = "train", **kw) -> str:
    return json.dumps({"step": step, "split": split, **kw}) + "\n"


def test_torn_last_line_is_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(_row(1, loss=2.3) + _row(2, loss=2.1) + '{"step": 3, "split": "tra')  # killed mid-write
    assert read_metrics(path) == [{"step": 1, "split": "train", "loss": 2.3}, {"step": 2, "split": "train",
                                                                                 "loss": 2.1}]
    assert read_metrics(tmp_path / "missing.jsonl") == []
    (tmp_path / "empty.jsonl").write_text("")
    assert read_metrics(tmp_path / "empty.jsonl") == []


def test_replayed_steps_keep_their_latest_row_in_step_order(tmp_path):
    path = tmp_path / "metrics.jsonl"
    # steps 1-4 and an eval at 4, then a resume from the checkpoint at step 2 replays 3 and 4
    first = [_row(s, loss=10.0 + s) for s in (1, 2, 3, 4)] + [_row(4, "eval", top1=0.1)]
    again = [_row(3, loss=3.0), _row(4, loss=4.0), _row(4, "eval", top1=0.4), _row(5, loss=5.0)]
    path.write_text("".join(first + again))
    rows = read_metrics(path)
    assert [(r["step"], r["split"]) for r in rows] == [(1, "train"), (2, "train"), (3, "train"), (4, "eval"),
                                                       (4, "train"), (5, "train")]
    assert [r.get("loss", r.get("top1")) for r in rows] == [11.0, 12.0, 3.0, 0.4, 4.0, 5.0]


class _InterruptAt:
    def __init__(self, step: int):
        self.step = step

    def __call__(self, step, result):
        if step == self.step:
            os.kill(os.getpid(), signal.SIGINT)


def test_resume_after_a_torn_row_loses_no_row(tmp_path, synthetic_data):
    """A process killed while writing step 4's row, after logging step 3 past the checkpoint at step 2: the
    resumed run replays 3 and writes 4 on a line of its own (not glued to the torn bytes), so every step is
    read back once, with the resumed run's numbers."""
    r = Recipe.from_dict({
        "model": {"name": "ViT-Ti/16", "embed_dim": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64, "img_size": 28,
                  "patch_size": 7, "in_chans": 1},
        "data": {**synthetic_data, "inception_crop": False},
        "optim": {"name": "adamw", "lr": 1e-3},
        "schedule": {"name": "cosine", "warmup_steps": 1},
        "train": {"batch_size": 8, "steps": 5, "precision": "fp32", "log_every": 1,
                  "evaluators": {"eval": {"type": "classification", "batch_size": 100, "max_samples": 100}}},
    })
    run = tmp_path / "run"
    part = train(r, run, progress=False, on_step=_InterruptAt(2))
    assert part["step"] == 2 and list_checkpoints(run / "checkpoints") == [2]
    metrics = run / "metrics.jsonl"
    row2 = [json.loads(line) for line in metrics.read_text().splitlines() if '"train"' in line][-1]
    with open(metrics, "a", encoding="utf-8") as f:  # what the killed process had written after the checkpoint
        f.write(json.dumps({**row2, "step": 3, "loss": 999.0}) + "\n" + '{"step": 4, "split": "train", "lo')
    rest = train(r, run, resume=True, progress=False)
    assert rest["status"] == "completed" and rest["step"] == 5
    train_rows = [row for row in read_metrics(metrics) if row["split"] == "train"]
    assert [row["step"] for row in train_rows] == [1, 2, 3, 4, 5]
    assert train_rows[2]["loss"] != 999.0  # the replayed step's row is the resumed run's


# -- the file itself after a resume: each step's row once, in order, as TensorBoard's purge_step keeps its events ----


def _tiny(synthetic_data: dict, eval_every: int = 1, **train_kw) -> Recipe:
    return Recipe.from_dict({
        "model": {"name": "ViT-Ti/16", "embed_dim": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64, "img_size": 28,
                  "patch_size": 7, "in_chans": 1},
        "data": {**synthetic_data, "inception_crop": False},
        "optim": {"name": "adamw", "lr": 1e-3},
        "schedule": {"name": "cosine", "warmup_steps": 1},
        "train": {"batch_size": 8, "steps": 6, "precision": "fp32", "log_every": 1, "checkpoint_every": 2,
                  "evaluators": {"eval": {"type": "classification", "every": eval_every, "batch_size": 50,
                                          "max_samples": 50}}, **train_kw},
    })


def _raw_rows(metrics) -> list[tuple[int, str]]:
    """(step, split) of every line of metrics.jsonl as written: no de-duplication, unlike read_metrics."""
    return [(row["step"], row["split"]) for row in map(json.loads, metrics.read_text().splitlines())]


class _Crash(Exception):
    pass


def _crash_at(step: int):
    def hook(s, result):
        if s == step:
            raise _Crash(f"killed in step {s}")

    return hook


def test_a_resumed_run_drops_the_rows_written_after_its_checkpoint(tmp_path, synthetic_data):
    """Killed in step 4 of a run that checkpoints every 2 steps: its rows of step 3 (train and eval) are past the
    checkpoint of step 2 the resume goes on from, and the resumed run writes them again: the file holds each once."""
    r, run = _tiny(synthetic_data), tmp_path / "run"
    with pytest.raises(_Crash):
        train(r, run, progress=False, on_step=_crash_at(4))  # in step 4: rows of 1-3 written, checkpoint of 2
    assert list_checkpoints(run / "checkpoints") == [2]
    metrics = run / "metrics.jsonl"
    assert (3, "train") in _raw_rows(metrics) and (3, "eval_test") in _raw_rows(metrics)
    rest = train(r, run, resume=True, progress=False)
    assert rest["status"] == "completed" and rest["step"] == 6
    rows = _raw_rows(metrics)
    steps = [step for step, split in rows if split == "train"]
    assert steps == [1, 2, 3, 4, 5, 6]  # once each, in order
    assert [step for step, split in rows if split == "eval_test"] == [1, 2, 3, 4, 5, 6]  # 6: the final evaluation
    assert [step for step, _ in rows] == sorted(step for step, _ in rows)


def test_tensorboard_keeps_the_checkpoint_step_and_drops_the_replayed_ones(tmp_path, synthetic_data):
    """TensorBoard's purge_step P hides the earlier events at steps >= P: the resumed run passes S + 1, since the
    events of step S itself were written before its checkpoint and are not logged again."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    r, run = _tiny(synthetic_data, eval_every=0), tmp_path / "run"
    with pytest.raises(_Crash):
        train(r, run, progress=False, on_step=_crash_at(4))
    train(r, run, resume=True, progress=False)
    first = {row["step"]: row["loss"] for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
             if row["split"] == "train"}
    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    loss = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert [step for step, _ in loss] == [1, 2, 3, 4, 5, 6]
    assert [value for _, value in loss] == pytest.approx([first[s] for s in range(1, 7)])


def test_a_run_resumed_at_its_last_step_evaluates_once_more_and_logs_it_once(tmp_path, synthetic_data, monkeypatch):
    """Killed after the final checkpoint but before the report: the resume evaluates at the last step again."""
    from vitlab.train.run import Run

    r, run = _tiny(synthetic_data, steps=2, eval_every=0), tmp_path / "run"

    def killed(self, status):
        raise _Crash("killed before the report")

    with monkeypatch.context() as m:
        m.setattr(Run, "finish", killed)
        with pytest.raises(_Crash):
            train(r, run, progress=False)
    assert list_checkpoints(run / "checkpoints") == [2]
    assert train(r, run, resume=True, progress=False)["status"] == "completed"
    assert _raw_rows(run / "metrics.jsonl") == [(1, "train"), (2, "train"), (2, "eval_test")]
