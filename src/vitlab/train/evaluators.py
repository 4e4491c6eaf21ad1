"""What a run evaluates: its own evaluation on `train.eval_split`, early stopping's on the val split, and the
evaluators declared in a recipe's `train.evaluators` (big_vision's `evals`).

Each is a runner with `run(model, step) -> row` (numbers keyed by name, the runner's name as the row's split),
built on the main process from data the run built first, and an `Evaluation` that says when it runs; the run logs
each row to metrics.jsonl, TensorBoard and the report. Declared kinds have their settings in `recipe.EVALUATORS`
and their runner in `RUNNERS`. Evaluators only read the model: they draw no number from the training RNGs, so a run
with evaluators trains exactly as one without.
"""

from __future__ import annotations

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
from .recipe import FewShotEvaluator


class Runner(Protocol):
    """What evaluates: `name` is its rows' split."""

    @property
    def name(self) -> str: ...

    def run(self, model: Any, step: int) -> dict[str, Any]: ...


@dataclass
class Evaluation:
    """A runner and when it runs: in the loop every `every` steps (0: never), and at the end of a completed run
    (`final`, after the loop) or else in the loop at the last step too (early stopping's val evaluation).

    `runner` is None on processes other than the main one: they hold the schedule only, to reach the evaluation's
    collectives at the same steps.
    """

    name: str
    every: int
    final: bool
    runner: Runner | None

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
        spec: The evaluator's settings.
        data: (pool, test): the splits its features come from (`build_data`).
        device, precision: Where and how the features are computed.
    """

    def __init__(self, spec: FewShotEvaluator, data: tuple[EvalData, EvalData], *, device: torch.device,
                 precision: str) -> None:
        self.spec = spec
        self.pool, self.test = data
        self.device, self.precision = device, precision
        self.num_classes = self.pool.num_classes

    @staticmethod
    def build_data(spec: FewShotEvaluator, data_cfg: Any, *, img_size: Any, in_chans: int,
                   batch_size: int) -> tuple[EvalData, EvalData]:
        """The pool and the scored images, prepared as for evaluation (`batch_size` unless the spec sets one)."""
        bs = spec.batch_size or batch_size
        return (build_eval_data(data_cfg, spec.train_split, img_size=img_size, in_chans=in_chans, batch_size=bs),
                build_eval_data(data_cfg, spec.eval_split, img_size=img_size, in_chans=in_chans, batch_size=bs))

    @property
    def name(self) -> str:
        return self.spec.name

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


RUNNERS = {"fewshot": FewShotRunner}  # kind -> runner, beside recipe.EVALUATORS (kind -> settings)


def build_evaluator_data(spec: Any, data_cfg: Any, **kw: Any) -> Any:
    """The data a declared evaluator reads (`kw`: img_size, in_chans, batch_size)."""
    return RUNNERS[spec.kind].build_data(spec, data_cfg, **kw)


def build_evaluator(spec: Any, data: Any, **kw: Any) -> Runner:
    """The runner of a declared evaluator, on the data `build_evaluator_data` built (`kw`: device, precision)."""
    return RUNNERS[spec.kind](spec, data, **kw)
