"""The trainer never loses work: exact resume, atomic checkpoints under SIGKILL, the non-finite step guard,
run directories that are never overwritten, and the loss falling on real Fashion-MNIST."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import vitlab
from vitlab.train import NonFiniteError, Recipe, RunDirError, latest_checkpoint, list_checkpoints, train, train_step
from vitlab.train import checkpoint as ckpt_mod

TINY = {"name": "ViT-Ti/16", "embed_dim": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64, "img_size": 28,
        "patch_size": 7, "in_chans": 1}


def recipe(data: dict, model: dict | None = None, **train_kw) -> Recipe:
    tr = {"batch_size": 16, "steps": 8, "precision": "fp32", "log_every": 1,
          "evaluators": {"eval": {"type": "classification", "batch_size": 250, "max_samples": 250}}, **train_kw}
    return Recipe.from_dict({
        "model": {**TINY, **(model or {})},
        "data": {**data, "inception_crop": False},
        "optim": {"name": "adamw", "lr": 3e-3, "weight_decay": 0.05, "clip_grad_norm": 1.0},
        "schedule": {"name": "cosine", "warmup_steps": 2},
        "train": tr,
    })


class Recorder:
    """on_step hook: records losses; optionally sends this process a signal after a given step."""

    def __init__(self, signal_at: int | None = None, sig: int = signal.SIGINT):
        self.losses: list[float] = []
        self.signal_at, self.sig = signal_at, sig

    def __call__(self, step, result):
        self.losses.append(result.loss)
        if step == self.signal_at:
            os.kill(os.getpid(), self.sig)


def test_interrupted_and_resumed_run_equals_uninterrupted_bitwise(tmp_path, synthetic_data):
    # dropout, stochastic depth, mixup and EMA all consume RNG: resume must replay every stream exactly
    r = recipe(synthetic_data, model={"dropout": 0.1, "drop_path": 0.1}, deterministic=True, mixup=0.4,
               label_smoothing=0.1, ema_decay=0.9, checkpoint_every=0)
    full = Recorder()
    ref = train(r, tmp_path / "full", progress=False, on_step=full)
    assert ref["status"] == "completed" and len(full.losses) == 8

    first = Recorder(signal_at=3, sig=signal.SIGTERM)
    part = train(r, tmp_path / "cut", progress=False, on_step=first)
    assert part["status"].startswith("interrupted") and part["step"] == 3
    assert list_checkpoints(tmp_path / "cut" / "checkpoints") == [3]
    second = Recorder()
    rest = train(r, tmp_path / "cut", resume=True, progress=False, on_step=second)
    assert rest["status"] == "completed" and rest["step"] == 8

    assert first.losses + second.losses == full.losses  # bitwise, step for step
    a, b = load_file(ref["model"]), load_file(rest["model"])
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert ref["eval"]["top1"] == rest["eval"]["top1"]


def test_ctrl_c_finishes_the_step_and_saves(tmp_path, synthetic_data):
    summary = train(recipe(synthetic_data, steps=5), tmp_path / "run", progress=False, on_step=Recorder(signal_at=2))
    assert summary["status"] == "interrupted (SIGINT)" and summary["step"] == 2
    assert list_checkpoints(tmp_path / "run" / "checkpoints") == [2]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored


def test_run_dir_is_never_overwritten_and_resume_needs_a_checkpoint(tmp_path, synthetic_data):
    r = recipe(synthetic_data, steps=2)
    train(r, tmp_path / "run", progress=False)
    before = (tmp_path / "run" / "model.safetensors").read_bytes()
    with pytest.raises(RunDirError, match=r"already holds a run.*--resume"):
        train(r, tmp_path / "run", progress=False)
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == before
    with pytest.raises(RunDirError, match="no checkpoint"):
        train(r, tmp_path / "empty", resume=True, progress=False)
    changed = recipe(synthetic_data, steps=2, label_smoothing=0.2)
    with pytest.raises(ValueError, match=r"recipe differs.*train.label_smoothing"):
        train(changed, tmp_path / "run", resume=True, progress=False)


def test_non_finite_step_is_skipped_and_never_reaches_the_weights():
    torch.manual_seed(0)
    model = vitlab.create_model("ViT-Ti/16", embed_dim=32, depth=1, num_heads=2, mlp_dim=64, img_size=28,
                                patch_size=7, in_chans=1, num_classes=10)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = [(torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,)))]
    kw = dict(lr=1e-2, device=torch.device("cpu"), precision="fp32", clip_grad_norm=1.0)
    train_step(model, opt, batch, **kw)  # one good step so the optimizer has state
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt_before = opt.state_dict()["state"][0]["exp_avg"].clone()

    res = train_step(model, opt, batch, on_loss=lambda loss: loss * float("nan"), **kw)  # NaN loss
    assert not res.applied
    handle = model.head.weight.register_hook(lambda g: g * float("inf"))  # finite loss, non-finite gradient
    res = train_step(model, opt, batch, **kw)
    handle.remove()
    assert not res.applied and res.loss == res.loss  # the loss was finite
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], opt_before)
    assert all(p.grad is None for p in model.parameters())
    assert train_step(model, opt, batch, **kw).applied  # and training goes on


def test_too_many_non_finite_steps_stop_with_the_last_good_checkpoint(tmp_path, synthetic_data):
    calls = {"n": 0}

    def nan_from_step_5(loss):
        calls["n"] += 1
        return loss * float("nan") if calls["n"] >= 5 else loss

    r = recipe(synthetic_data, steps=20, checkpoint_every=2, max_bad_steps=3)
    with pytest.raises(NonFiniteError, match=r"3 non-finite steps in a row.*last good checkpoint"):
        train(r, tmp_path / "run", progress=False, on_loss=nan_from_step_5)
    # steps 5 and 6 were skipped (nothing applied), the checkpoint at 6 holds step-4 weights; 7 stopped the run
    steps = list_checkpoints(tmp_path / "run" / "checkpoints")
    assert steps[-1] == 6
    _, weights, state = latest_checkpoint(tmp_path / "run" / "checkpoints")
    assert state["run"]["skipped_steps"] == 2
    model = vitlab.load_model(weights)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_skipped_step_is_counted_and_training_completes(tmp_path, synthetic_data):
    calls = {"n": 0}

    def one_nan(loss):
        calls["n"] += 1
        return loss * float("nan") if calls["n"] == 2 else loss

    summary = train(recipe(synthetic_data, steps=4), tmp_path / "run", progress=False, on_loss=one_nan)
    assert summary["status"] == "completed" and summary["skipped_steps"] == 1


# -- atomic checkpoints -----------------------------------------------------------------------------------

def _tiny_model():
    return vitlab.create_model("ViT-Ti/16", embed_dim=32, depth=1, num_heads=2, mlp_dim=64, img_size=28,
                               patch_size=7, in_chans=1, num_classes=10)


def test_failed_write_leaves_previous_checkpoint(tmp_path, monkeypatch):
    d = tmp_path / "checkpoints"
    model = _tiny_model()
    ckpt_mod.save_checkpoint(d, 1, lambda p: vitlab.save_weights(model, p), {"x": torch.ones(3)}, keep=3)

    def half_then_fail(obj, path):
        path.write_bytes(b"PK\x03\x04 half a zip")
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(ckpt_mod, "_torch_save", half_then_fail)
    with pytest.raises(OSError, match="simulated"):
        ckpt_mod.save_checkpoint(d, 2, lambda p: vitlab.save_weights(model, p), {"x": torch.zeros(3)}, keep=3)
    assert list_checkpoints(d) == [1]
    step, weights, state = latest_checkpoint(d)
    assert step == 1 and torch.equal(state["x"], torch.ones(3))
    vitlab.load_model(weights)
    assert not [p for p in d.iterdir() if p.name.startswith(".tmp")]  # no stray temporary file


KILL_SCRIPT = textwrap.dedent("""
    import sys, time, torch, vitlab
    from vitlab.train import checkpoint as c
    d, phase = sys.argv[1], sys.argv[2]
    m = vitlab.create_model("ViT-Ti/16", embed_dim=32, depth=1, num_heads=2, mlp_dim=64, img_size=28,
                            patch_size=7, in_chans=1, num_classes=10)
    c.save_checkpoint(d, 1, lambda p: vitlab.save_weights(m, p), {"x": torch.ones(2)}, keep=1)
    def stall(path):  # write half a file, then hang so the parent can SIGKILL us mid-write
        with open(path, "wb") as f:
            f.write(b"\\0" * 1000)
            f.flush()
            print("writing", flush=True)
            time.sleep(60)
    if phase == "weights":
        c.save_checkpoint(d, 2, lambda p: stall(p), {"x": torch.zeros(2)}, keep=1)
    else:
        c._torch_save = lambda obj, p: stall(p)
        c.save_checkpoint(d, 2, lambda p: vitlab.save_weights(m, p), {"x": torch.zeros(2)}, keep=1)
""")


@pytest.mark.parametrize("phase", ["weights", "state"])
def test_sigkill_during_checkpoint_write_keeps_previous(tmp_path, phase):
    d = tmp_path / "checkpoints"
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(d), phase], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert list_checkpoints(d) == [1]  # keep=1 never deleted step 1: step 2 never completed
    step, weights, state = latest_checkpoint(d)
    assert step == 1 and torch.equal(state["x"], torch.ones(2))
    vitlab.load_model(weights)
    assert [p for p in d.iterdir() if p.name.startswith(".tmp")]  # the torn temporary file is all that's left


def test_keeps_last_k_checkpoints(tmp_path):
    model = _tiny_model()
    for step in range(1, 6):
        ckpt_mod.save_checkpoint(tmp_path, step, lambda p: vitlab.save_weights(model, p), {}, keep=2)
    assert list_checkpoints(tmp_path) == [4, 5]
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == [
        "step_00000004.safetensors", "step_00000004.state.pt", "step_00000005.safetensors", "step_00000005.state.pt"]


def test_state_file_loads_with_weights_only(tmp_path, synthetic_data):
    train(recipe(synthetic_data, steps=2, ema_decay=0.5, mixup=0.2), tmp_path / "run", progress=False)
    path = tmp_path / "run" / "checkpoints" / "step_00000002.state.pt"
    state = torch.load(path, weights_only=True)
    assert state["step"] == 2 and {"optimizer", "rng", "data", "ema", "run"} <= set(state)
    assert state["data"][0]["step"] == 2  # the stream's position


# -- learning on real data ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_loss_falls_on_fashion_mnist(tmp_path, fmnist_root):
    r = recipe({"dataset": "fashion_mnist", "root": fmnist_root},
               model={"embed_dim": 64, "num_heads": 2, "mlp_dim": 128, "depth": 2},
               steps=60, batch_size=64,
               evaluators={"eval": {"type": "classification", "max_samples": 2000, "batch_size": 500}})
    rec = Recorder()
    summary = train(r, tmp_path / "run", progress=False, on_step=rec)
    first, last = sum(rec.losses[:5]) / 5, sum(rec.losses[-5:]) / 5
    assert first > 2.0 and last < first - 0.5, (first, last)
    # chance is 10%; 60 steps of 64 images already separate most classes
    assert summary["eval"]["top1"] > 0.4
