"""What a run writes, and what `train` returns (`TrainResult`).

`Outputs` holds a run directory's writers (main process; on the others it writes nothing): recipe.yaml,
metrics.jsonl and TensorBoard (`log`, `log_train`), the progress bar, the checkpoints (`save_checkpoint`, which
refuses to write non-finite tensors), the final weights and the report. The layout is `rundir.py`'s.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..inference.evaluate import EvalResult, Result
from ..utils.extras import needs
from ..utils.io import write_atomic, writing
from ..weights import save_weights
from . import checkpoint as ckpt
from .recipe import Recipe
from .report import open_metrics, write_report
from .rundir import write_recipe
from .step import NonFiniteError, first_non_finite

logger = logging.getLogger("vitlab.train")


@dataclass
class TrainResult(Result):
    """What `train` returns (report.json holds it too, with `eval` summarised).

    Attributes:
        status: "completed", "completed (time budget N min)" or "interrupted (SIGTERM)" and the like.
        step: Optimizer steps done; total_steps: steps the run was set for.
        skipped_steps: Non-finite steps skipped (never applied).
        images_seen: Training images consumed (all processes).
        train_time_s: Seconds spent in training steps (evaluation and checkpoints not counted).
        run_dir: The run directory; resumed_from: the checkpoint this process resumed from, if any.
        world_size: Processes; precision: the autocast precision used ("auto" resolved).
        model: The final weights (a completed run, main process), else None.
        eval: The final classification evaluation (a completed run, main process), else None; eval_split: its split.
        evaluators: The last row of each of `train.evaluators` whose rows are not the classifier's, by name.
        report: report.md (a completed run, main process), else None.
        images_per_s, mfu: Median training speed over the run's log rows (main process).
        bad_data: Bad files skipped (or replaced) by this process, by data ("train", "eval"): {"num_skipped",
            "skipped": the first `vitlab.data.workers.MAX_REPORTED` {"path", "reason"}} (main process).
        best_step, best_val_top1: With an early_stop evaluator: the step whose weights the run ended with and their
            val top-1.
        early_stop: With an early_stop evaluator: the rule, the val split's size and a top-1's standard error on it,
            the curve (every val evaluation), the chosen best and the stop point (`early_stop.summary`).
    """

    status: str
    step: int
    total_steps: int
    skipped_steps: int
    images_seen: int
    train_time_s: float
    run_dir: str
    resumed_from: str | None
    world_size: int
    precision: str
    model: str | None = None
    eval: EvalResult | None = None
    eval_split: str | None = None
    evaluators: dict[str, dict[str, Any]] = field(default_factory=dict)
    report: str | None = None
    images_per_s: float | None = None
    mfu: float | None = None
    bad_data: dict[str, dict[str, Any]] = field(default_factory=dict)
    best_step: int | None = None
    best_val_top1: float | None = None
    early_stop: dict[str, Any] | None = None


class Outputs:
    """A run directory's writers.

    Args:
        run_dir: The run directory; main: whether this process writes (the main one).
        recipe: Saved as recipe.yaml and in every weights file's metadata, with `classes` and `total_steps`.
        trained_pre: The preprocessing the weights are saved with (None: none recorded).
    """

    def __init__(self, run_dir: Path, recipe: Recipe, *, main: bool, classes: list[str], total_steps: int,
                 trained_pre: Any) -> None:
        self.run_dir, self.ckpt_dir, self.recipe, self.main = run_dir, run_dir / "checkpoints", recipe, main
        self.classes, self.total_steps, self.trained_pre = classes, total_steps, trained_pre
        self.metrics_f: Any = None
        self.writer: Any = None
        self.pbar: Any = None

    def open(self, *, resume: bool, progress: bool, step: int, again: set[str]) -> None:
        """recipe.yaml (a new run), metrics.jsonl, TensorBoard and the progress bar (main process only), for a run
        at `step`; `again`: the splits of the final evaluations, logged again when a run resumes at its last step."""
        if not self.main:
            return
        with needs("train", "training's TensorBoard log"):  # before anything is written or opened
            from torch.utils.tensorboard import SummaryWriter
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not resume:
            write_recipe(self.run_dir, self.recipe)
        # the rows and events an earlier process of the run wrote after the checkpoint this one goes on from (step
        # S; 0 for a run started again) are dropped: they are logged again. Step S's own were written before its
        # checkpoint and stay (but the final evaluation's, at the last step, is done again), so TensorBoard purges
        # from S + 1 (its purge_step drops events at and after it).
        again = again if step >= self.total_steps else set()
        self.metrics_f = open_metrics(self.run_dir / "metrics.jsonl", step, again_at_step=again)  # closed in close()
        with writing(self.run_dir / "tb"):  # it writes its first event file at once
            self.writer = SummaryWriter(str(self.run_dir / "tb"), purge_step=step + 1)
        if progress:
            from tqdm import tqdm

            self.pbar = tqdm(total=self.total_steps, initial=step, unit="step", dynamic_ncols=True, desc="train")

    def close(self) -> None:
        """Close the progress bar, TensorBoard and metrics.jsonl. All are closed even when one fails (a full disk);
        then the first failure is raised."""
        outs = ((self.pbar, None), (self.writer, "tb"), (self.metrics_f, "metrics.jsonl"))
        self.pbar = self.writer = self.metrics_f = None
        failed: Exception | None = None
        for out, name in outs:
            try:
                if out is not None:
                    with writing(self.run_dir / (name or "")):
                        out.close()
            except Exception as e:
                failed = failed or e
        if failed is not None:
            raise failed

    def log(self, row: dict[str, Any]) -> None:
        """A metrics.jsonl row and its numbers in TensorBoard under `split/name`."""
        if self.metrics_f is not None:
            with writing(self.run_dir / "metrics.jsonl"):  # a full disk: "cannot write ...metrics.jsonl: ..."
                self.metrics_f.write(json.dumps(row) + "\n")
                self.metrics_f.flush()
        if self.writer is not None:
            with writing(self.run_dir / "tb"):
                for k, v in row.items():
                    if k not in ("step", "split") and isinstance(v, int | float):
                        self.writer.add_scalar(f"{row['split']}/{k}", v, row["step"])

    def tick(self) -> None:
        """The progress bar's step."""
        if self.pbar is not None:
            self.pbar.update(1)

    def log_train(self, row: dict[str, Any]) -> None:
        """The training row (loss, lr, grad norm, images/s, MFU, ETA, ...): logged, on the progress bar, in the log."""
        self.log(row)
        if self.pbar is not None:
            self.pbar.set_postfix(loss=f"{row['loss']:.4f}", lr=f"{row['lr']:.2e}", img_s=f"{row['images_per_s']:.0f}",
                                  mfu=f"{row['mfu']:.1%}", refresh=False)
        eta = f"{row['eta_s'] / 60:.1f} min" if math.isfinite(row["eta_s"]) else "-"
        logger.info("step %d/%d: loss %.4f, lr %.2e, %.0f images/s, MFU %.1f%%, ETA %s", row["step"], self.total_steps,
                    row["loss"], row["lr"], row["images_per_s"], 100 * row["mfu"], eta)

    def log_eval(self, row: dict[str, Any], train_time_s: float) -> None:
        """An evaluation's row, with the training time so far; in the log too."""
        logger.info("step %d: %s %s", row["step"], row["split"], ", ".join(
            f"{k} {v:.4f}" for k, v in row.items() if k not in ("step", "split")))
        row["train_time_s"] = train_time_s
        self.log(row)

    def last_checkpoint(self) -> str:
        """A sentence that says which checkpoint is on disk to resume from (every checkpoint written is finite)."""
        steps = ckpt.list_checkpoints(self.ckpt_dir) if self.ckpt_dir.is_dir() else []
        if not steps:
            return "No checkpoint had been written yet."
        return f"The last good checkpoint, step {steps[-1]}, is kept in {self.ckpt_dir}."

    def check_finite(self, what: str, **parts: Any) -> None:
        """NonFiniteError naming the first inf / nan tensor of `parts` (state dicts), before `what` is written."""
        for name, part in parts.items():
            bad = first_non_finite(part)
            if bad is not None:
                raise NonFiniteError(f"refusing to write {what}: {name} {bad} holds inf or nan values. "
                                     f"{self.last_checkpoint()}")

    def save_weights(self, path: Path, model: Any, extra: dict[str, Any]) -> None:
        """`model`'s weights with the preprocessing they were trained with, the recipe, the classes and `extra`."""
        if self.trained_pre is not None:
            model.preprocess = self.trained_pre
        meta = {"recipe": self.recipe.to_dict(), "classes": self.classes, "total_steps": self.total_steps}
        save_weights(model, path, metadata={**meta, **extra})

    def save_checkpoint(self, step: int, model: Any, train_state: dict[str, Any], keep: int) -> None:
        """The checkpoint of `step` (weights and training state), the `keep` latest kept; refused if not finite."""
        self.check_finite(f"the checkpoint of step {step}", weights=model.state_dict(),
                          optimizer_state=train_state["optimizer"], ema=train_state["ema"])
        ckpt.save_checkpoint(self.ckpt_dir, step, lambda p: self.save_weights(p, model, {"step": step}),
                             train_state, keep)

    def save_final(self, model: Any, extra: dict[str, Any]) -> str:
        """model.safetensors: the weights the run ends with (refused if not finite), `extra` in its metadata."""
        path = self.run_dir / "model.safetensors"
        self.check_finite(str(path), weights=model.state_dict())
        write_atomic(path, lambda p: self.save_weights(p, model, extra), overwrite=True)
        return str(path)

    def write_report(self, result: TrainResult) -> str:
        """report.json, report.md and curves.png from the result and metrics.jsonl; report.md's path."""
        report = {k: v for k, v in result.to_dict().items() if v is not None}
        return str(write_report(self.run_dir, report, self.recipe))
