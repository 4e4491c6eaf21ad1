"""Evaluators declared in a recipe's `train.evaluators` and run during training (big_vision's `evals`).

Each kind has its settings in `recipe.EVALUATORS` (where `every` says when it runs) and a runner here with
`run(model, step) -> row`; the row (numbers keyed by name) goes to metrics.jsonl under the evaluator's name as its
split, to TensorBoard and to the report. Evaluators only read the model: they draw no number from the training
RNGs, so a run with evaluators trains exactly as one without.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from ..analysis.fewshot import extract_features, fewshot_evaluate
from ..data import build_eval_data
from ..models.vit import VisionTransformer
from ..perf.precision import autocast
from .recipe import FewShotEvaluator


def _first(batches: Iterable[tuple[torch.Tensor, torch.Tensor]], n: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
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
        data_cfg: The run's `vitlab.data.DataConfig` (the images are prepared as for evaluation).
        img_size, in_chans: What the model takes.
        batch_size: Feature-extraction batch size unless the spec sets one.
        device, precision: Where and how the features are computed.
    """

    def __init__(self, spec: FewShotEvaluator, data_cfg: Any, *, img_size: Any, in_chans: int, batch_size: int,
                 device: torch.device, precision: str) -> None:
        self.spec = spec
        self.device, self.precision = device, precision
        bs = spec.batch_size or batch_size
        self.pool = build_eval_data(data_cfg, spec.train_split, img_size=img_size, in_chans=in_chans, batch_size=bs)
        self.test = build_eval_data(data_cfg, spec.eval_split, img_size=img_size, in_chans=in_chans, batch_size=bs)
        self.num_classes = self.pool.num_classes

    @property
    def name(self) -> str:
        return self.spec.name

    def run(self, model: VisionTransformer, step: int) -> dict[str, Any]:
        """The metrics row of this evaluation at `step`: `{k}shot` (mean accuracy) and `{k}shot_std` per shot count."""
        t0 = time.perf_counter()
        with autocast(self.device, self.precision):
            train_x, train_y = extract_features(model, _first(self.pool, self.spec.train_samples), self.device)
            test_x, test_y = extract_features(model, _first(self.test, self.spec.eval_samples), self.device)
        results = fewshot_evaluate(train_x, train_y, test_x, test_y, shots=self.spec.shots, seeds=self.spec.seeds,
                                   l2_reg=self.spec.l2_reg, num_classes=self.num_classes)
        row: dict[str, Any] = {"step": step, "split": self.name}
        for r in results:
            row[f"{r.shots}shot"] = r.mean
            row[f"{r.shots}shot_std"] = r.std
        row["eval_s"] = time.perf_counter() - t0
        return row


RUNNERS = {"fewshot": FewShotRunner}  # kind -> runner, beside recipe.EVALUATORS (kind -> settings)


def build_evaluators(specs: list[Any], data_cfg: Any, **kw: Any) -> list[FewShotRunner]:
    """A runner for each declared evaluator (`kw` as `FewShotRunner`'s)."""
    return [RUNNERS[spec.kind](spec, data_cfg, **kw) for spec in specs]
