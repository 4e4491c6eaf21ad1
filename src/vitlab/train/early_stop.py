"""Early stopping's rule, as a small object with no torch in it: what a run judges on the held-out val split, when
it has a new best, and when it stops (`train.early_stop_*`).

A run's val top-1 on a split of a thousand images moves by about a point from one evaluation to the next by chance
alone (one standard error at accuracy p on n images is sqrt(p (1 - p) / n): 0.9 points at 88% on 1,200 images), so
a rule that keeps the best raw top-1 and stops after a few evaluations without a better one selects a noise spike
(issue 37: a 58.8k-image ViT stopped at 65% of its budget on a one-evaluation peak while its val loss was still
falling). The rule here judges the val loss (default: a mean over every image, far steadier than a count of right
answers) or a smoothed top-1 (an exponential moving average or the mean of the last few evaluations), and counts
its patience in epochs of training, not in evaluations, so that evaluating more often does not make it stop sooner.

    rule = Rule(metric="loss", smoothing="none", smooth_evals=3, patience_epochs=2.0)
    stopper = EarlyStopper(rule, images_per_step=128, epoch_images=58800)
    d = stopper.update(step, loss=0.43, top1=0.884)   # -> Decision(value, new_best, stop)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..utils.stats import binomial_se

METRICS = ("loss", "top1")
SMOOTHING = ("none", "ema", "window")


@dataclass(frozen=True)
class Rule:
    """What early stopping judges and how long it waits.

    Attributes:
        metric: "loss" (the val cross-entropy, lower is better) or "top1" (higher is better).
        smoothing: "none", "ema" (exponential moving average with alpha = 2 / (smooth_evals + 1), started at the
            first value) or "window" (the mean of the last `smooth_evals` evaluations; fewer at the start).
        smooth_evals: The window's length, or the EMA's span, in evaluations.
        patience_epochs: Stop once this many epochs of training passed since the best judged value (0: never stop;
            the run still ends with the best weights).
    """

    metric: str = "loss"
    smoothing: str = "none"
    smooth_evals: int = 3
    patience_epochs: float = 0.0

    def describe(self) -> str:
        what = "val loss" if self.metric == "loss" else "val top-1"
        if self.smoothing == "ema":
            what = f"{what} (EMA, span {self.smooth_evals} evaluations)"
        elif self.smoothing == "window":
            what = f"{what} (mean of the last {self.smooth_evals} evaluations)"
        return what


@dataclass
class Decision:
    """One evaluation's verdict: the judged (smoothed) value, whether it is a new best, whether to stop now."""

    value: float
    new_best: bool
    stop: bool


@dataclass
class EarlyStopper:
    """The rule applied to a sequence of evaluations; its state (`state_dict`) travels in checkpoints.

    Args:
        rule: The rule.
        images_per_step: Training images per optimizer step (the global batch).
        epoch_images: Images in one epoch of the training split.
    """

    rule: Rule
    images_per_step: int
    epoch_images: int
    recent: list[float] = field(default_factory=list)  # raw values of the window (window smoothing)
    ema: float | None = None
    best_value: float | None = None
    best_step: int = 0
    curve: list[dict[str, Any]] = field(default_factory=list)  # every evaluation: step, epoch, loss, top1, judged

    def epochs(self, steps: int) -> float:
        return steps * self.images_per_step / max(1, self.epoch_images)

    def _smooth(self, x: float) -> float:
        r = self.rule
        if r.smoothing == "ema":
            alpha = 2.0 / (r.smooth_evals + 1)
            self.ema = x if self.ema is None else alpha * x + (1 - alpha) * self.ema
            return self.ema
        if r.smoothing == "window":
            self.recent = [*self.recent, x][-r.smooth_evals:]
            return sum(self.recent) / len(self.recent)
        return x

    def update(self, step: int, *, loss: float, top1: float) -> Decision:
        """Judge the evaluation at `step`; a new best resets the patience (the caller keeps that step's weights)."""
        raw = loss if self.rule.metric == "loss" else top1
        value = self._smooth(float(raw))
        better = (self.best_value is None or (value < self.best_value if self.rule.metric == "loss"
                                              else value > self.best_value)) and math.isfinite(value)
        if better:
            self.best_value, self.best_step = value, step
        waited = self.epochs(step - self.best_step)
        stop = bool(self.rule.patience_epochs) and not better and waited >= self.rule.patience_epochs - 1e-9
        self.curve.append({"step": step, "epoch": self.epochs(step), "loss": float(loss), "top1": float(top1),
                           "judged": value})
        return Decision(value, better, stop)

    def state_dict(self) -> dict[str, Any]:
        return {"recent": list(self.recent), "ema": self.ema, "best_value": self.best_value,
                "best_step": self.best_step, "curve": [dict(r) for r in self.curve]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.recent = list(state.get("recent") or [])
        self.ema = state.get("ema")
        self.best_value = state.get("best_value")
        self.best_step = int(state.get("best_step") or 0)
        self.curve = [dict(r) for r in state.get("curve") or []]


def top1_standard_error(p: float, n: int) -> float:
    """The standard error of a top-1 accuracy `p` measured on `n` images: sqrt(p (1 - p) / n)."""
    return binomial_se(p, n)


def summary(stopper: EarlyStopper, *, val_images: int, stopped_at: int | None, total_steps: int) -> dict[str, Any]:
    """What a run's report says about its early stopping: the rule, the val split's size and the standard error of
    a top-1 on it, the curve (every evaluation), the chosen best and where the run stopped (None: it ran to the
    end)."""
    best = next((r for r in stopper.curve if r["step"] == stopper.best_step), None)
    best_top1 = best["top1"] if best else None
    r = stopper.rule
    return {"metric": r.metric, "smoothing": r.smoothing, "smooth_evals": r.smooth_evals,
            "patience_epochs": r.patience_epochs, "rule": stopper.rule.describe(), "val_images": val_images,
            "best_step": stopper.best_step, "best_epoch": stopper.epochs(stopper.best_step),
            "best_value": stopper.best_value, "best_val_top1": best_top1,
            "val_top1_standard_error": (top1_standard_error(best_top1, val_images) if best_top1 is not None
                                        else None),
            "stopped_early": stopped_at is not None and stopped_at < total_steps, "stopped_at": stopped_at,
            "total_steps": total_steps, "curve": [dict(c) for c in stopper.curve]}
