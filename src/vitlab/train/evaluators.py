"""What a run evaluates, the recipe's `train.evaluators` (big_vision's `evals`; their settings: `evalconfig.py`):
the classification evaluator (the run's result), early stopping on the held-out val split, the few-shot probe.

Each is a runner with `run(model, step) -> row` (numbers keyed by name, `row_split` as the row's split), built on the
main process from the data `build_evaluator_data` built first, and an `Evaluation` that says when it runs
(`build_evaluations`); the run logs each row to metrics.jsonl, TensorBoard and the report. Evaluators only read the
model: they draw no number from the training RNGs, so a run with evaluators trains exactly as one without (early
stopping only ends it sooner).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from ..analysis.fewshot import extract_features, fewshot_evaluate
from ..data import EvalData, build_eval_data
from ..inference.evaluate import EvalResult, evaluate
from ..models.vit import VisionTransformer
from ..perf.precision import autocast
from .early_stop import EarlyStopper
from .evalconfig import ClassificationEvaluator, EarlyStopEvaluator, FewShotEvaluator

logger = logging.getLogger("vitlab.train")


class Runner(Protocol):
    """What evaluates: `name` is its rows' split."""

    @property
    def name(self) -> str: ...

    def run(self, model: Any, step: int) -> dict[str, Any]: ...


@dataclass
class Evaluation:
    """A runner and when it runs: in the loop every `every` steps (0: never), and at the end of a completed run
    (`final`, after the loop) or else in the loop at the last step too (early stopping's val evaluation, whose
    verdict every process learns: `stops`).

    `runner` is None on processes other than the main one: they hold the schedule only, to reach the evaluation's
    collectives at the same steps.
    """

    name: str
    every: int
    final: bool
    runner: Runner | None
    stops: bool = False

    def due(self, step: int, total_steps: int, final: bool) -> bool:
        """Whether it runs at `step` in the loop, or (`final`) at the end of the run."""
        if final:
            return self.final
        if step == total_steps:  # the last step's evaluations are the final ones, after the loop
            return not self.final
        return bool(self.every) and step % self.every == 0


class ClassificationRunner:
    """Top-1, top-5 and loss of the classifier on a split (`vitlab.inference.evaluate`).

    Args:
        name: The row's split, e.g. "eval_test".
        data: The split's batches; num_classes: the model's classes (class_names: their names, kept in `result`).
        device, precision: Where and how the model runs.
        max_samples: Evaluate only the first this many samples (None: all).
        raw: With EMA, the raw (not averaged) model: its top-1 goes in the row as `top1_raw`.
    """

    def __init__(self, name: str, data: Any, num_classes: int, *, device: torch.device, precision: str,
                 max_samples: int | None = None, class_names: list[str] | None = None,
                 raw: nn.Module | None = None) -> None:
        self.name, self.data, self.num_classes, self.class_names = name, data, num_classes, class_names
        self.device, self.precision, self.max_samples, self.raw = device, precision, max_samples, raw
        self.result: EvalResult | None = None  # the latest evaluation (per class too)

    def run(self, model: nn.Module, step: int) -> dict[str, Any]:
        """The metrics row of this evaluation at `step`: top1, top5, loss (and top1_raw)."""
        kw: dict[str, Any] = dict(device=self.device, precision=self.precision, max_samples=self.max_samples)
        r = self.result = evaluate(model, self.data, self.num_classes, class_names=self.class_names, **kw)
        row: dict[str, Any] = {"step": step, "split": self.name, "top1": r.top1, "top5": r.top5, "loss": r.loss}
        if self.raw is not None:
            row["top1_raw"] = evaluate(self.raw, self.data, self.num_classes, **kw).top1
        return row


class EarlyStopRunner:
    """Early stopping (`type: early_stop`): the classifier on the held-out val split, judged by the rule
    (`early_stop.EarlyStopper`: the val loss, or a smoothed top-1); the weights of each new best are kept (on the
    CPU: `best_weights`), and `stop` says whether `patience_epochs` epochs of training passed without one.

    Args:
        spec: Its settings; data: the val split; num_classes: the model's classes.
        state: The run's counters (`run.RunState`): the rule's state comes from and goes to `state.early_stop`, the
            best's step and top-1 to `state.best_step` / `best_val_top1`, the stop's step to `state.stopped_at`.
        best_weights: The best weights a resumed run had kept (None: none yet).
        images_per_step, epoch_images: The global batch and the training split's size (patience is in epochs).
        device, precision: Where and how the model runs.
    """

    name = "eval_val"

    def __init__(self, spec: EarlyStopEvaluator, data: Any, num_classes: int, *, state: Any,
                 best_weights: dict[str, torch.Tensor] | None, images_per_step: int, epoch_images: int,
                 device: torch.device, precision: str) -> None:
        self.classify = ClassificationRunner(self.name, data, num_classes, device=device, precision=precision)
        self.stopper = EarlyStopper(spec.rule(), images_per_step, epoch_images)
        self.stopper.load_state_dict(state.early_stop)
        self.state, self.best_weights, self.stop = state, best_weights, False
        self.val_images = int(getattr(data, "num_samples", 0) or 0)

    def run(self, model: nn.Module, step: int) -> dict[str, Any]:
        """The val row at `step`, judged; a new best's weights kept."""
        row = self.classify.run(model, step)
        state, stopper = self.state, self.stopper
        d = stopper.update(step, loss=row["loss"], top1=row["top1"])
        if d.new_best:
            state.best_val_top1, state.best_step = row["top1"], step
            self.best_weights = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        state.early_stop = stopper.state_dict()
        self.stop = d.stop
        if d.stop:
            state.stopped_at = step
        best = stopper.best_value if stopper.best_value is not None else float("nan")
        logger.info("step %d: %s %.4f; best %.4f at step %d", step, stopper.rule.describe(), d.value, best,
                    state.best_step)
        return row


def first_samples(batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                  n: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The first `n` samples of `batches`, in batches."""
    seen = 0
    for x, y in batches:
        if seen >= n:
            return
        x, y = x[: n - seen], y[: n - seen]
        seen += len(y)
        yield x, y


class FewShotRunner:
    """The paper's few-shot linear probe on the frozen pre-logits features (Sec. 4.1; `vitlab.analysis.fewshot`):
    features of a fixed pool of `train_samples` images and of `eval_samples` evaluation images, a ridge classifier
    fitted on `shots` images per class drawn `seeds` times, and its mean accuracy (and std over the draws).

    Args:
        name: The evaluator's name: its rows' split.
        spec: The evaluator's settings.
        data: (pool, test): the splits its features come from (`build_evaluator_data`).
        device, precision: Where and how the features are computed.
    """

    def __init__(self, name: str, spec: FewShotEvaluator, data: tuple[EvalData, EvalData], *, device: torch.device,
                 precision: str) -> None:
        self.name, self.spec = name, spec
        self.pool, self.test = data
        self.device, self.precision = device, precision
        self.num_classes = self.pool.num_classes

    def run(self, model: VisionTransformer, step: int) -> dict[str, Any]:
        """The metrics row of this evaluation at `step`: `{k}shot` (mean accuracy) and `{k}shot_std` per shot count."""
        t0 = time.perf_counter()
        with autocast(self.device, self.precision):
            train_x, train_y = extract_features(model, first_samples(self.pool, self.spec.train_samples), self.device)
            test_x, test_y = extract_features(model, first_samples(self.test, self.spec.eval_samples), self.device)
        results = fewshot_evaluate(train_x, train_y, test_x, test_y, shots=self.spec.shots, seeds=self.spec.seeds,
                                   l2_reg=self.spec.l2_reg, num_classes=self.num_classes)
        row: dict[str, Any] = {"step": step, "split": self.name}
        for r in results:
            row[f"{r.shots}shot"] = r.mean
            row[f"{r.shots}shot_std"] = r.std
        row["eval_s"] = time.perf_counter() - t0
        return row


def row_split(name: str, spec: Any) -> str:
    """The split of an evaluator's rows: `eval_{split}` for the classifier's (classification; early_stop: eval_val),
    else its name."""
    if isinstance(spec, ClassificationEvaluator):
        return spec.row_split
    return EarlyStopRunner.name if isinstance(spec, EarlyStopEvaluator) else name


def build_evaluator_data(spec: Any, data_cfg: Any, *, img_size: Any, in_chans: int, batch_size: int) -> Any:
    """The data an evaluator reads, prepared as for evaluation, in its `batch_size` (default: `batch_size`): its
    split (classification), the val split (early_stop), or (pool, scored images) (fewshot)."""
    kw: dict[str, Any] = dict(img_size=img_size, in_chans=in_chans, batch_size=spec.batch_size or batch_size)
    if isinstance(spec, FewShotEvaluator):
        return build_eval_data(data_cfg, spec.train_split, **kw), build_eval_data(data_cfg, spec.eval_split, **kw)
    return build_eval_data(data_cfg, "val" if isinstance(spec, EarlyStopEvaluator) else spec.split, **kw)



def build_evaluations(specs: dict[str, Any], data: dict[str, Any] | None, *, num_classes: int, class_names: list[str],
                      raw: nn.Module | None, state: Any, best_weights: dict[str, torch.Tensor] | None,
                      images_per_step: int, epoch_images: int, device: torch.device,
                      precision: str) -> list[Evaluation]:
    """The evaluations of `specs` (`train.evaluators`, in the order they run), with their runners on the main process
    (`data`: each one's, by name, from `build_evaluator_data`; None on the other processes: schedules only).

    Args:
        num_classes, class_names: The model's classes.
        raw: With EMA, the raw weights' model (the classification evaluator scores its top-1 too), else None.
        state, best_weights, images_per_step, epoch_images: Early stopping's (`EarlyStopRunner`).
        device, precision: Where and how the model runs.
    """
    kw: dict[str, Any] = dict(device=device, precision=precision)
    out = []
    for name, spec in specs.items():
        runner: Runner | None = None
        if data is not None and isinstance(spec, ClassificationEvaluator):
            runner = ClassificationRunner(spec.row_split, data[name], num_classes, max_samples=spec.max_samples,
                                          class_names=class_names, raw=raw, **kw)
        elif data is not None and isinstance(spec, EarlyStopEvaluator):
            runner = EarlyStopRunner(spec, data[name], num_classes, state=state, best_weights=best_weights,
                                     images_per_step=images_per_step, epoch_images=epoch_images, **kw)
        elif data is not None:
            runner = FewShotRunner(name, spec, data[name], **kw)
        stops = isinstance(spec, EarlyStopEvaluator)
        out.append(Evaluation(row_split(name, spec), spec.every, not stops, runner, stops))
    return out
