"""One training run of an experiment, resumable: each sub-run is a `vitlab train` run directory.

`run_or_resume(recipe, run_dir)` trains `recipe` in `run_dir` unless that directory already holds its finished run
(then its report.json is read back and nothing is trained), and continues an unfinished one from its newest
checkpoint (`vitlab.train.train(..., resume=True)`), so an interrupted `vitlab reproduce` picks up where it stopped.
A finished run whose recipe differs from the one asked for is an error naming the changed keys (the same check as
`vitlab train --resume`), never a silent reuse.
"""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..train import train
from ..train.recipe import Recipe
from ..train.rundir import check_same_recipe

logger = logging.getLogger("vitlab.paper")


@dataclass
class SubRunResult:
    """What an experiment reads back from a finished sub-run.

    Attributes:
        name: The sub-run's name in the experiment (its folder's name).
        run_dir: The run directory.
        status: "trained" (this call trained it from step 0), "resumed" (continued from a checkpoint) or "done"
            (finished before this call; nothing trained).
        top1: Final test top-1 in [0, 1].
        steps: Optimizer steps; images_seen: training images consumed.
        train_time_s: Seconds of training (all calls together when resumed).
        evaluators: The last row of each train.evaluators entry (e.g. {"fewshot": {"5shot": 0.71, ...}}).
        model: The final weights (model.safetensors).
        best_step, best_val_top1: With early stopping: the step whose weights the run ended with (what `top1`
            scores) and their validation top-1; None without.
        test_images: Images `top1` was measured on.
        early_stop: With early stopping: the run's report of it (rule, val images and standard error, curve, best,
            stop point; `vitlab.train.early_stop.summary`); None without.
        precision: What the training ran in ("fp32", "bf16"; `train.precision: auto` resolved).
        images_per_s: The median training speed (None when not measured).
    """

    name: str
    run_dir: str
    status: str
    top1: float
    steps: int
    images_seen: int
    train_time_s: float
    evaluators: dict[str, Any] = field(default_factory=dict)
    model: str = ""
    best_step: int | None = None
    best_val_top1: float | None = None
    test_images: int | None = None
    early_stop: dict[str, Any] | None = None
    precision: str = ""
    images_per_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "run_dir": self.run_dir, "status": self.status, "top1": self.top1,
                "steps": self.steps, "images_seen": self.images_seen, "train_time_s": self.train_time_s,
                "evaluators": self.evaluators, "model": self.model, "best_step": self.best_step,
                "best_val_top1": self.best_val_top1, "test_images": self.test_images,
                "early_stop": self.early_stop, "precision": self.precision, "images_per_s": self.images_per_s}


def finished(run_dir: Path) -> bool:
    """Whether `run_dir` holds a completed run (its report.json says so and the final weights are there)."""
    report = run_dir / "report.json"
    if not report.is_file() or not (run_dir / "model.safetensors").is_file():
        return False
    try:
        return str(json.loads(report.read_text(encoding="utf-8")).get("status", "")).startswith("completed")
    except (OSError, ValueError):
        return False


def _read(name: str, run_dir: Path, status: str) -> SubRunResult:
    report = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    ev = report.get("final") or report.get("eval") or {}
    top1 = ev.get("top1")
    if top1 is None:
        raise ValueError(f"{run_dir / 'report.json'} has no final top-1 (final.top1)")
    return SubRunResult(name=name, run_dir=str(run_dir), status=status, top1=float(top1),
                        steps=int(report.get("step", 0)), images_seen=int(report.get("images_seen", 0)),
                        train_time_s=float(report.get("train_time_s", 0.0)),
                        evaluators=dict(report.get("evaluators") or {}), model=str(run_dir / "model.safetensors"),
                        best_step=report.get("best_step"), best_val_top1=report.get("best_val_top1"),
                        test_images=ev.get("num_samples"), early_stop=report.get("early_stop"),
                        precision=str(report.get("precision", "")), images_per_s=report.get("images_per_s"))


def run_or_resume(name: str, recipe: Recipe, run_dir: str | Path, *, progress: bool = False) -> SubRunResult:
    """Train `recipe` in `run_dir`, or resume it there, or read back its finished result.

    Raises:
        ValueError: `run_dir` holds a run of another recipe (the differing keys are named).
        Whatever `vitlab.train.train` raises (another process training there: RunLockedError).
    """
    run_dir = Path(run_dir)
    has_run = (run_dir / "recipe.yaml").is_file()
    if has_run:
        check_same_recipe(run_dir, recipe)
    if finished(run_dir):
        return _read(name, run_dir, "done")
    status = "resumed" if has_run else "trained"
    logger.info("%s: %s in %s", name, "resuming" if has_run else "training", run_dir)
    with warnings.catch_warnings():
        # a run stopped before its first checkpoint starts again from step 0 (train warns; we report it instead)
        warnings.filterwarnings("ignore", message=r"--resume: .* has no checkpoint yet")
        result = train(recipe, run_dir, resume=has_run, progress=progress)
    if not result.status.startswith("completed"):
        raise KeyboardInterrupt(f"{name}: {result.status}; run the same command again to resume")
    return _read(name, run_dir, status)
