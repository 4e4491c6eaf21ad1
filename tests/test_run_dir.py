"""A run directory under concurrent and killed processes: one process trains in it at a time (a lock, refused with
exit 1, free again after a SIGKILL), a resume falls back past a damaged weights file, a run killed before its first
checkpoint can be resumed, stale temporaries of killed writes are removed, and the metrics are read back one row per
step."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
import yaml
from safetensors.torch import load_file

from vitlab.cli import main
from vitlab.train import Recipe, RunDirError, RunLockedError, latest_checkpoint, list_checkpoints, train
from vitlab.train import loop as loop_mod
from vitlab.train.report import read_metrics
from vitlab.train.rundir import LOCK_NAME, RunLock, remove_stale_temps

RECIPE = {
    "model": {"name": "ViT-Ti/16", "embed_dim": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64, "img_size": 28,
              "patch_size": 7, "in_chans": 1},
    "data": {"dataset": "synthetic", "num_samples": 480, "inception_crop": False},
    "optim": {"name": "adamw", "lr": 1e-3},
    "schedule": {"name": "cosine", "warmup_steps": 1},
    "train": {"batch_size": 8, "steps": 4, "precision": "fp32", "log_every": 1, "checkpoint_every": 1,
              "evaluators": {"eval": {"type": "classification", "every": 0, "batch_size": 80, "max_samples": 80}}},
}


def _recipe(**train_kw) -> Recipe:
    return Recipe.from_dict({**RECIPE, "train": {**RECIPE["train"], **train_kw}})


class _Stop:
    """on_step hook: SIGINT to this process at `at` (the loop saves a checkpoint there), or an exception (a crash
    before any checkpoint, which leaves the run directory as a kill does)."""

    def __init__(self, at: int, crash: bool = False):
        self.at, self.crash = at, crash

    def __call__(self, step, result):
        if step == self.at:
            if self.crash:
                raise RuntimeError("killed (simulated)")
            os.kill(os.getpid(), signal.SIGINT)


# -- the lock: two real processes ------------------------------------------------------------------------------

HOLDER = textwrap.dedent("""
    import sys, time, yaml
    from vitlab.train import Recipe, train
    def hold(step, result):
        if step == 2:  # the checkpoint of step 1 is written; hold the run directory until killed
            print("holding", flush=True)
            time.sleep(600)
    recipe = Recipe.from_dict(yaml.safe_load(open(sys.argv[1])))
    train(recipe, sys.argv[2], progress=False, on_step=hold, device="cpu")
""")


def test_second_process_is_refused_until_the_first_is_killed(tmp_path, capsys):
    cfg, run = tmp_path / "tiny.yaml", tmp_path / "run"
    cfg.write_text(yaml.safe_dump(RECIPE))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(cfg), str(run)], stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        assert proc.stdout.readline().strip() == "holding"
        args = ["train", str(cfg), "-o", str(run), "--no-progress", "--device", "cpu"]
        for extra in ([], ["--resume"]):  # a second run into the same -o, and a second resume of the run
            capsys.readouterr()
            assert main([*args, *extra]) == 1
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and err[0].startswith("vitlab train: error: run directory")
            assert f"in use by process {proc.pid} on {socket.gethostname()} since " in err[0]
        with pytest.raises(RunLockedError):
            train(_recipe(), run, resume=True, progress=False)
        assert list_checkpoints(run / "checkpoints") == [1]  # the refused ones wrote nothing
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=60)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert (run / LOCK_NAME).exists()  # a stale lock file; the kernel dropped its lock with the process
    capsys.readouterr()
    assert main([*args, "--resume"]) == 0
    assert "weights:" in capsys.readouterr().out
    assert not (run / LOCK_NAME).exists()
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl") if r["split"] == "train"] == [1, 2, 3, 4]


def test_lock_is_exclusive_within_a_process_and_released(tmp_path):
    with RunLock(tmp_path / "run") as held:
        record = json.loads(held.path.read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        with pytest.raises(RunLockedError, match=rf"in use by process {os.getpid()} on .* since .*{LOCK_NAME}"):
            RunLock(tmp_path / "run").acquire()
    assert not (tmp_path / "run").exists()  # it made the folder; nothing was written there: nothing is left
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / LOCK_NAME).write_text('{"pid": 1, "host": "gone"}')  # left by a SIGKILLed holder
    with RunLock(tmp_path / "run"):
        pass
    assert (tmp_path / "run").is_dir() and not (tmp_path / "run" / LOCK_NAME).exists()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=60)
    return proc.pid


@pytest.fixture
def no_flock(monkeypatch):
    """A file system without flock(2) (some NFS and FUSE mounts): the pid file is the lock."""
    import fcntl

    def flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", flock)


def test_pid_file_lock_where_flock_is_missing(tmp_path, no_flock):
    run = tmp_path / "run"
    with RunLock(run) as held:
        assert json.loads(held.path.read_text())["pid"] == os.getpid()
        with pytest.raises(RunLockedError, match=f"in use by process {os.getpid()}"):
            RunLock(run).acquire()
        with pytest.raises(RunLockedError):
            train(_recipe(), run, progress=False)
    assert not run.exists()
    host = socket.gethostname()
    run.mkdir()
    lock = run / LOCK_NAME
    for holder in ({"pid": _dead_pid(), "host": host},  # killed: its pid is not running
                   {"pid": os.getpid(), "host": host, "pid_start": "reused"}):  # a pid reused by another process
        lock.write_text(json.dumps(holder))
        with RunLock(run):
            assert json.loads(lock.read_text())["pid"] == os.getpid()
        assert not lock.exists()
    lock.write_text(json.dumps({"pid": _dead_pid(), "host": "another-host", "since": "2026-01-01 00:00:00 UTC"}))
    with pytest.raises(RunLockedError, match="on another-host since 2026-01-01"):  # its liveness is not knowable
        RunLock(run).acquire()


# -- resume: damaged latest weights, no checkpoint yet ---------------------------------------------------------


def test_resume_skips_a_damaged_latest_weights_file_and_replayed_rows_are_read_once(tmp_path):
    run = tmp_path / "run"
    part = train(_recipe(checkpoint_every=2), run, progress=False, on_step=_Stop(3))
    assert part["status"] == "interrupted (SIGINT)" and list_checkpoints(run / "checkpoints") == [2, 3]
    bad = run / "checkpoints" / "step_00000003.safetensors"
    bad.write_bytes(bad.read_bytes()[:-100])  # truncated (a disk that lied, a copy cut short)
    with pytest.warns(UserWarning, match=r"skipping unreadable checkpoint of step 3: .*step_00000003\.safetensors"):
        assert latest_checkpoint(run / "checkpoints")[0] == 2
    with pytest.warns(UserWarning, match=r"step_00000003\.safetensors"):
        rest = train(_recipe(checkpoint_every=2), run, resume=True, progress=False)
    assert rest["status"] == "completed" and rest["step"] == 4
    assert rest["resumed_from"].endswith("step_00000002.safetensors")
    ref = train(_recipe(checkpoint_every=2), tmp_path / "ref", progress=False)  # the same run, never stopped
    a, b = load_file(ref["model"]), load_file(rest["model"])
    assert all(torch.equal(a[k], b[k]) for k in a)
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # step 3 was replayed: its row from the stopped process (past the checkpoint of step 2) was dropped first
    assert [r["step"] for r in lines if r["split"] == "train"] == [1, 2, 3, 4]
    rows = read_metrics(run / "metrics.jsonl")
    keys = [(r["split"], r["step"]) for r in rows]
    assert len(keys) == len(set(keys)) and [s for sp, s in keys if sp == "train"] == [1, 2, 3, 4]


def test_resume_skips_non_finite_weights(tmp_path):
    from safetensors.torch import save_file

    run = tmp_path / "run"
    train(_recipe(checkpoint_every=1), run, progress=False, on_step=_Stop(2))
    path = run / "checkpoints" / "step_00000002.safetensors"
    tensors = load_file(path)
    tensors["head.weight"][0, 0] = float("nan")
    save_file(tensors, path)
    with pytest.warns(UserWarning, match=r"step_00000002\.safetensors hold non-finite values \(head\.weight\)"):
        rest = train(_recipe(checkpoint_every=1), run, resume=True, progress=False)
    assert rest["resumed_from"].endswith("step_00000001.safetensors") and rest["step"] == 4


def test_all_checkpoints_damaged_says_how_to_start_again(tmp_path):
    run = tmp_path / "run"
    train(_recipe(), run, progress=False, on_step=_Stop(1))
    (run / "checkpoints" / "step_00000001.safetensors").write_bytes(b"not weights")
    with pytest.warns(UserWarning), pytest.raises(RunDirError, match=r"no loadable checkpoint.*remove .* --resume"):
        train(_recipe(), run, resume=True, progress=False)


def test_run_killed_before_its_first_checkpoint_can_be_resumed(tmp_path, capsys):
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="simulated"):
        train(_recipe(checkpoint_every=0), run, progress=False, on_step=_Stop(2, crash=True))
    assert (run / "recipe.yaml").is_file() and (run / "metrics.jsonl").is_file()
    assert list_checkpoints(run / "checkpoints") == []
    # a new run there is refused, and says what works; --resume starts it again from step 0
    with pytest.raises(RunDirError, match=r"no checkpoint yet: pass --resume to start it again from step 0"):
        train(_recipe(checkpoint_every=0), run, progress=False)
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump({**RECIPE, "train": {**RECIPE["train"], "checkpoint_every": 0}}))
    args = ["train", str(cfg), "-o", str(run), "--no-progress", "--device", "cpu"]
    capsys.readouterr()
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no checkpoint yet" in err[0] and "--resume" in err[0]
    with pytest.warns(UserWarning, match=r"no checkpoint yet .*starting it again from step 0"):
        assert main([*args, "--resume"]) == 0
    ref = train(_recipe(checkpoint_every=0), tmp_path / "ref", progress=False)
    a, b = load_file(ref["model"]), load_file(run / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)  # the same as a run never stopped
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl") if r["split"] == "train"] == [1, 2, 3, 4]
    # a folder that holds no run at all is still not "resumed"
    with pytest.raises(RunDirError, match=r"holds no run to resume .*no checkpoint"):
        train(_recipe(), tmp_path / "nothing", resume=True, progress=False)
    assert not (tmp_path / "nothing").exists()


# -- stale temporaries -----------------------------------------------------------------------------------------


def test_stale_temporaries_of_killed_writes_are_removed_at_the_next_start(tmp_path):
    run = tmp_path / "run"
    train(_recipe(), run, progress=False, on_step=_Stop(1))
    ckpts = run / "checkpoints"
    stale = [ckpts / ".tmp-0123abcd-step_00000002.safetensors", ckpts / ".tmp-89abcdef-step_00000002.state.pt",
             run / ".tmp-deadbeef-model.safetensors", run / ".tmp-00000000-report.json",
             ckpts / ".tmp-0000ffff-.tmp-0123abcd-step_00000002.safetensors"]  # a nested (staged) write
    others = [run / ".tmp-0123abcd-notes.txt", run / "notes.txt", ckpts / ".tmp-xyz-step_00000002.state.pt"]
    for p in stale + others:
        p.write_bytes(b"\0" * 1000)
    rest = train(_recipe(), run, resume=True, progress=False)
    assert rest["status"] == "completed"
    assert not [p for p in stale if p.exists()]
    assert all(p.exists() for p in others)  # not the run's own temporaries: not ours to remove


def test_stale_temporaries_are_removed_only_under_the_lock(tmp_path, monkeypatch):
    """train() removes them after taking the lock: a refused second process never touches a live writer's."""
    run = tmp_path / "run"
    live = run / "checkpoints" / ".tmp-0123abcd-step_00000002.safetensors"
    live.parent.mkdir(parents=True)
    live.write_bytes(b"being written")
    calls = []
    monkeypatch.setattr(loop_mod, "remove_stale_temps", lambda d: calls.append(d) or [])
    with RunLock(run), pytest.raises(RunLockedError):
        train(_recipe(), run, resume=True, progress=False)
    assert live.exists() and calls == []
    assert remove_stale_temps(run) == [live] and not live.exists()


# -- metrics.jsonl read back -----------------------------------------------------------------------------------


def test_read_metrics_skips_lines_that_are_not_rows(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join([
        json.dumps({"step": 1, "split": "train", "loss": 2.0}),
        "42", "[1, 2]", "null", json.dumps({"step": "two", "split": "train"}), json.dumps({"split": "train"}),
        json.dumps({"step": 2, "loss": 1.5}),  # no split: a training row (the oldest logs had none)
        '{"step": 3, "split": "tr',
    ]) + "\n")
    assert read_metrics(path) == [{"step": 1, "split": "train", "loss": 2.0},
                                  {"step": 2, "split": "train", "loss": 1.5}]
