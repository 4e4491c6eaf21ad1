"""The training loop: `train(recipe, run_dir)` builds a `Run` and drives it in `_loop`, which reads top to bottom
in one screen: step (logged), run the evaluations due (`train.evaluators`: the classification one, early stopping's
on val with the best weights kept, the few-shot probe), stop early, checkpoint, stop on a signal.

It never loses work: checkpoints are atomic, SIGTERM and Ctrl-C finish the current step and save, a non-finite
step is skipped (never applied) and many in a row stop the run with the last good checkpoint kept, and
`resume=True` continues exactly (from the newest checkpoint that loads). One process at a time trains in a run
directory: it holds the directory's lock (`rundir.RunLock`) from its checks to its report. The log rows carry
images/s, MFU and the ETA (`meter.py`), and the recipe's `train.evaluators` run at their declared steps
(`evalconfig.py`, `evaluators.py`).

Where the rest lives: `run.py` (the run object), `step.py` (one optimizer step), `outputs.py` (what a run writes,
`TrainResult`), `build.py` (model and data configuration), `distill.py` (DeiT distillation's teacher and loss),
`probe.py` (`train.linear_probe`: a linear classifier on frozen features), `rundir.py`, `rng.py`,
`vitlab.perf.precision`, `vitlab.inference.evaluate`.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..inference.evaluate import evaluate
from ..perf.allocator import keep_freed_memory
from .build import build_model, data_config_with_init, init_preprocess
from .checkpoint import list_checkpoints
from .distributed import DistInfo, all_true, barrier, setup_distributed, teardown_distributed
from .outputs import TrainResult
from .probe import linear_probe
from .recipe import Recipe
from .run import Run
from .rundir import RunDirError, RunLock, RunLockedError, check_run_dir, check_same_recipe, remove_stale_temps
from .step import NonFiniteError, StepResult, resize_batch, train_step

__all__ = ["NonFiniteError", "Run", "RunDirError", "RunLockedError", "StepResult", "TrainResult", "build_model",
           "data_config_with_init", "evaluate", "init_preprocess", "resize_batch", "train", "train_step"]


class StopFlag:
    """SIGTERM / SIGINT set a flag; the loop finishes its step, saves and exits. A second Ctrl-C aborts."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._old: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if self.reason is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # second Ctrl-C: give up at once (the last checkpoint is intact)
        self.reason = signal.Signals(signum).name

    def __enter__(self) -> StopFlag:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


def _loop(run: Run, stop: StopFlag) -> str:
    """Step until the end, the time budget or a signal; log, evaluate and checkpoint on the way. The status."""
    tr, state = run.tr, run.state
    while state.step < run.total_steps:
        if run.step() is None:
            return f"completed (time budget {tr.time_budget_min:g} min)"
        done = state.step == run.total_steps
        if run.evaluate() and not done and run.early_stopping is not None:  # early stopping's evaluation says stop
            rule = run.early_stopping.rule()
            return (f"completed (early stop at step {state.step}: no better {rule.describe()} in "
                    f"{rule.patience_epochs:g} epochs; the weights of step {state.best_step})")
        stopping = not all_true(stop.reason is None, run.info)
        if (tr.checkpoint_every and state.step % tr.checkpoint_every == 0 and not done) or stopping:
            run.save()  # a skipped step changed no weight, so the state is still a good one
        if stopping:
            return f"interrupted ({stop.reason or 'signal on another process'})"
    return "completed"


def train(
    recipe: Recipe,
    run_dir: str | os.PathLike,
    *,
    resume: bool = False,
    progress: bool = True,
    device: str | None = None,
    on_step: Callable[[int, StepResult], None] | None = None,
    on_loss: Callable[[torch.Tensor], torch.Tensor] | None = None,
    stream: Any = None,
    eval_data: Any = None,
) -> TrainResult:
    """Run a recipe to its end (or to a SIGTERM / Ctrl-C, after which `resume=True` continues exactly).

    Args:
        recipe: The recipe (its `train.precision` defaults to "auto").
        run_dir: Where checkpoints, metrics.jsonl, TensorBoard logs, the final model and the report go.
        resume: Continue the run in `run_dir` from its latest checkpoint that loads (a damaged newer one is
            skipped with a warning); a run stopped before its first checkpoint starts again from step 0.
        progress: Show a tqdm progress bar (main process only).
        device: "cpu" / "cuda"; None picks CUDA when available.
        on_step: Called after every optimizer step with (step, result).
        on_loss: Hook on each micro-batch loss (fault injection in tests).
        stream, eval_data: Ready-made data (tests); by default built from `recipe.data`.

    Returns:
        A `TrainResult` (report.json holds it too, with the final evaluation summarised).

    Raises:
        RunLockedError: Another live process trains in `run_dir` (the directory is locked for the whole run).
        RunDirError: `run_dir` holds a run and `resume` is False, or holds none to resume.
    """
    run_dir = Path(run_dir)
    keep_freed_memory()  # no page-fault storm from re-mmapping activations every step (vitlab/perf/allocator.py)
    info = setup_distributed(device)
    lock = RunLock(run_dir) if info.is_main else None  # one process trains in a run directory at a time
    try:
        if lock is not None:
            lock.acquire()
            remove_stale_temps(run_dir)  # holding the lock: no live writer owns them
            if resume:
                check_same_recipe(run_dir, recipe)
            check_run_dir(run_dir, resume)
        barrier(info)
        # a --resume of a run stopped before its first checkpoint starts it again (every rank sees the same folder)
        resume = resume and bool(list_checkpoints(run_dir / "checkpoints"))
        result = _train(recipe, run_dir, info, resume=resume, progress=progress, on_step=on_step, on_loss=on_loss,
                        stream=stream, eval_data=eval_data)
    finally:
        if lock is not None:
            lock.release()
    teardown_distributed(info)  # after a clean finish only: a failed peer would never reach the barrier
    return result


def _train(recipe: Recipe, run_dir: Path, info: DistInfo, *, resume: bool, progress: bool,
           on_step: Callable[[int, StepResult], None] | None, on_loss: Callable[[torch.Tensor], torch.Tensor] | None,
           stream: Any, eval_data: Any) -> TrainResult:
    tr = recipe.train
    if tr.batch_size % (tr.accum_steps * info.world_size):
        raise ValueError(f"train.batch_size {tr.batch_size} must divide by accum_steps x processes = "
                         f"{tr.accum_steps} x {info.world_size}")
    if tr.linear_probe:  # a classifier on frozen features (train/probe.py): no checkpoints, nothing to resume
        return linear_probe(recipe, run_dir, info)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    if tr.deterministic:
        torch.use_deterministic_algorithms(True)
    try:
        with Run(recipe, run_dir, info, resume=resume, progress=progress, on_step=on_step, on_loss=on_loss,
                 stream=stream, eval_data=eval_data) as run, StopFlag() as stop:
            status = _loop(run, stop)
            if run.state.step == run.total_steps or status.startswith("completed"):
                run.evaluate(final=True)  # early stopping's best weights back, then the end's evaluations
                run.save()
        return run.finish(status)
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
