"""The settings of `train.evaluators`, a run's evaluations (big_vision's `config.evals.{name} = {type, log_steps}`):
a mapping of name -> settings, each with a `type` (`TYPES`: one dataclass per type, validated when the recipe loads)
and `every` (steps between runs; 0: only at the end).

    evaluators:
      eval: {type: classification, split: test, every: 500}        # the run's result; its rows: split eval_test
      early_stop: {type: early_stop, every: 100, patience_epochs: 5}  # on the held-out val split; rows eval_val
      fewshot: {type: fewshot, every: 500, shots: [5, 10]}          # the paper's few-shot probe; rows fewshot

A run has one classification evaluator, its result (`eval`, on the test split at the end, when none is declared), at
most one early_stop, and any number of fewshot; at a step they run in that order (`check_evaluators` orders them).
Their runners are in `evaluators.py`. The keys they replace (`train.eval_every`, `train.early_stop_every`, ...) are
refused with one line naming the new key (`RETIRED`); a run's own recipe.yaml written before is read in the new form
(`upgrade`), so that such a run can still be resumed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..models.config import check_keys, check_number
from .early_stop import METRICS, SMOOTHING, Rule


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


@dataclass
class ClassificationEvaluator:
    """`type: classification`: top-1, top-5 and loss of the classifier on a split, the run's result (its final
    evaluation is what report.md states and model.safetensors' metadata holds). Its rows' split is `eval_{split}`.

    Attributes:
        type: "classification".
        every: Evaluate every this many steps (0: only at the end); it always runs at the end of a completed run.
        split: "test", or "val" (the part of train held out by data.val_fraction).
        max_samples: Evaluate on only the first this many images of the split (null: all of it).
        batch_size: Images per forward pass (null: the training micro-batch, batch_size / accum_steps).
    """

    type: str = "classification"
    every: int = 0
    split: str = "test"
    max_samples: int | None = None
    batch_size: int | None = None

    def validate(self, where: str) -> None:
        check_number(f"{where}.every", self.every, lo=0, integer=True)
        _choice(f"{where}.split", self.split, ("val", "test"))
        check_number(f"{where}.max_samples", self.max_samples, lo=1, integer=True, allow_none=True)
        check_number(f"{where}.batch_size", self.batch_size, lo=1, integer=True, allow_none=True)

    @property
    def row_split(self) -> str:
        return f"eval_{self.split}"


@dataclass
class EarlyStopEvaluator:
    """`type: early_stop`: early stopping on the held-out val split (needs data.val_fraction > 0): evaluate on it
    every `every` steps and at the last step, keep the weights of the best judged value (`metric`), and end the run
    with them (they are what the final classification evaluation scores and what model.safetensors holds). The lr
    schedule still spans `steps` / `epochs`. Its rows' split is `eval_val`; the report states the val split's size,
    the standard error of a top-1 on it and the curve (`vitlab.train.early_stop`).

    Attributes:
        type: "early_stop".
        every: Evaluate on the val split every this many steps (at least 1).
        metric: What is judged: "loss" (the val loss, default: steady) or "top1" (the val top-1, which must then be
            smoothed: a one-evaluation spike of a raw top-1 is noise, not a best).
        smoothing: "none", "ema" or "window" (the mean of the last `smooth_evals` evaluations); "none" only with the
            loss.
        smooth_evals: The window's length (or the EMA's span) in evaluations.
        patience_epochs: Stop once this many epochs of training brought no new best (epochs, not evaluations:
            evaluating more often does not stop a run sooner); 0: run to the end, still ending with the best weights.
        batch_size: Images per forward pass (null: the training micro-batch).
    """

    type: str = "early_stop"
    every: int = 0
    metric: str = "loss"
    smoothing: str = "none"
    smooth_evals: int = 3
    patience_epochs: float = 0.0
    batch_size: int | None = None

    def validate(self, where: str) -> None:
        check_number(f"{where}.every", self.every, lo=1, integer=True,
                     what="an int >= 1 (steps between evaluations on the val split)")
        _choice(f"{where}.metric", self.metric, METRICS)
        _choice(f"{where}.smoothing", self.smoothing, SMOOTHING)
        check_number(f"{where}.smooth_evals", self.smooth_evals, lo=1, integer=True)
        check_number(f"{where}.patience_epochs", self.patience_epochs, lo=0)
        check_number(f"{where}.batch_size", self.batch_size, lo=1, integer=True, allow_none=True)
        if self.metric == "top1" and self.smoothing == "none":
            raise ValueError(f"{where}.metric: top1 needs {where}.smoothing: ema or window (a raw val top-1 lets a "
                             f"one-evaluation noise spike pass for the best); or judge the loss")

    def rule(self) -> Rule:
        return Rule(self.metric, self.smoothing, self.smooth_evals, self.patience_epochs)


@dataclass
class FewShotEvaluator:
    """`type: fewshot`: the paper's few-shot linear probe (Sec. 4.1, "Metrics"), run on the frozen pre-logits features
    of the model being trained (`vitlab.analysis.fewshot`). Its rows' split is its name.

    Attributes:
        type: "fewshot".
        every: Run every this many steps (0: only at the end); it always runs at the end of a completed run.
        shots: Examples per class drawn for the ridge classifier (the paper: 1, 5, 10, 25).
        seeds: Random draws of the shots averaged per shot count.
        l2_reg: Ridge strength (big_vision's 2^10).
        train_split: Split the shots are drawn from ("train", unaugmented; or "val").
        train_samples: Size of the pool the shots are drawn from (the first this many images of train_split).
        eval_split: Split the probe is scored on ("test" or "val").
        eval_samples: Images of eval_split scored (the first this many).
        batch_size: Feature-extraction batch size (null: the training micro-batch).
    """

    type: str = "fewshot"
    every: int = 0
    shots: list[int] = field(default_factory=lambda: [5])
    seeds: int = 3
    l2_reg: float = 1024.0
    train_split: str = "train"
    train_samples: int = 2000
    eval_split: str = "test"
    eval_samples: int = 1000
    batch_size: int | None = None

    def validate(self, where: str) -> None:
        check_number(f"{where}.every", self.every, lo=0, integer=True)
        if not isinstance(self.shots, list | tuple) or not self.shots:
            raise ValueError(f"{where}.shots must be a non-empty list of positive ints, got {self.shots!r}")
        self.shots = list(self.shots)
        for s in self.shots:
            check_number(f"{where}.shots", s, lo=1, integer=True)
        check_number(f"{where}.seeds", self.seeds, lo=1, integer=True)
        check_number(f"{where}.l2_reg", self.l2_reg, lo=0)
        _choice(f"{where}.train_split", self.train_split, ("train", "val"))
        _choice(f"{where}.eval_split", self.eval_split, ("val", "test"))
        check_number(f"{where}.train_samples", self.train_samples, lo=1, integer=True)
        check_number(f"{where}.eval_samples", self.eval_samples, lo=1, integer=True)
        check_number(f"{where}.batch_size", self.batch_size, lo=1, integer=True, allow_none=True)


TYPES: dict[str, type] = {"classification": ClassificationEvaluator, "early_stop": EarlyStopEvaluator,
                          "fewshot": FewShotEvaluator}
ROLES = ("classification", "early_stop")  # at most one each; they run first, in this order (a stop skips the rest)


def check_evaluators(specs: Any) -> dict[str, Any]:
    """`train.evaluators` as {name: settings}, each validated, in the order they run: the classification evaluator
    (`eval` with the defaults when none is declared), early_stop, then the others as declared."""
    if specs is None or (isinstance(specs, list | tuple) and not specs):  # recipe.yaml files before: `[]`
        specs = {}
    if isinstance(specs, list | tuple):
        raise ValueError("train.evaluators is a mapping of name -> settings now, not a list: write e.g. `evaluators: "
                         "{fewshot: {type: fewshot, every: 500}}` (`kind` is now `type`, the name the key)")
    if not isinstance(specs, dict):
        raise ValueError(f"train.evaluators must be a mapping of name -> settings with a 'type', got {specs!r}")
    out: dict[str, Any] = {}
    for name, spec in specs.items():
        where = f"train.evaluators.{name}"
        if not isinstance(name, str) or not name or name == "train":
            raise ValueError(f"train.evaluators: {name!r} is not a name (a non-empty string other than 'train')")
        if dataclasses.is_dataclass(spec):
            spec = dataclasses.asdict(spec)  # type: ignore[arg-type]
        if not isinstance(spec, dict) or spec.get("type") not in TYPES:
            kind = spec.get("type") if isinstance(spec, dict) else spec
            hint = " (`kind` is now `type`)" if isinstance(spec, dict) and "kind" in spec else ""
            raise ValueError(f"{where}: unknown evaluator type {kind!r}{hint}; valid types: {sorted(TYPES)}")
        cls = TYPES[spec["type"]]
        ev = cls(**check_keys(spec, cls, f"recipe section {where!r}"))
        ev.validate(where)
        if isinstance(ev, FewShotEvaluator) and name.startswith("eval"):
            raise ValueError(f"{where}: a fewshot evaluator's name is its rows' split: not 'eval*' (the classifier's)")
        out[name] = ev
    for t in ROLES:
        names = [n for n, ev in out.items() if ev.type == t]
        if len(names) > 1:
            raise ValueError(f"train.evaluators: at most one of type {t}, got {names}")
    if not any(ev.type == "classification" for ev in out.values()):
        if "eval" in out:
            raise ValueError("train.evaluators.eval is the run's classification evaluator: give the "
                             f"{out['eval'].type} evaluator another name, or declare one of type classification")
        out = {"eval": ClassificationEvaluator(), **out}
    rank = {t: i for i, t in enumerate(ROLES)}
    return dict(sorted(out.items(), key=lambda kv: rank.get(kv[1].type, len(ROLES))))  # stable: declared order kept


# Keys retired into `train.evaluators` (issue 36), with the key that replaces each and its "off" value: a recipe in the
# old form (no `train.evaluators` mapping) holding them at that value, as every recipe.yaml written before does, still
# loads; set, or beside a `train.evaluators` mapping, each is refused with one line naming its replacement.
RETIRED: dict[str, tuple[Any, str]] = {
    "eval_every": (0, "train.evaluators.eval.every (type: classification)"),
    "eval_split": ("test", "train.evaluators.eval.split (type: classification)"),
    "eval_max_samples": (None, "train.evaluators.eval.max_samples (type: classification)"),
    "eval_batch_size": (None, "the batch_size of each of train.evaluators (e.g. train.evaluators.eval.batch_size)"),
    "early_stop_every": (0, "train.evaluators.early_stop.every (type: early_stop)"),
    "early_stop_metric": ("loss", "train.evaluators.early_stop.metric (type: early_stop)"),
    "early_stop_smoothing": ("none", "train.evaluators.early_stop.smoothing (type: early_stop)"),
    "early_stop_smooth_evals": (3, "train.evaluators.early_stop.smooth_evals (type: early_stop)"),
    "early_stop_patience_epochs": (0, "train.evaluators.early_stop.patience_epochs (type: early_stop)"),
    "early_stop_patience": (0, "train.evaluators.early_stop.patience_epochs (type: early_stop; epochs without a "
                               "better val loss, where early_stop_patience counted evaluations)"),
}


def without_retired_keys(train: dict[str, Any]) -> dict[str, Any]:
    """The train section without the retired keys that are off in an old-form recipe (`RETIRED`).

    Raises:
        ValueError: one line naming the first retired key that is set (or is beside a `train.evaluators` mapping)
            and the key to use instead.
    """
    old = [k for k in RETIRED if k in train]
    if not old:
        return train
    new_form = isinstance(train.get("evaluators"), dict)
    for k in old:
        off, new = RETIRED[k]
        if new_form or train[k] != off:
            raise ValueError(f"train.{k} is retired: set {new}")
    return {k: v for k, v in train.items() if k not in RETIRED}


def upgrade(train: dict[str, Any]) -> dict[str, Any]:
    """A train section in the old form (the evaluation keys of `RETIRED`, `evaluators` a list of `{kind, name, ...}`),
    as every run's recipe.yaml written before the change holds, in the new form, meaning the same; a section in the
    new form is returned as it is. For a run's own record (`rundir.read_run_recipe`), not for recipes people write."""
    old = [k for k in RETIRED if k in train]
    if isinstance(train.get("evaluators"), dict) or train.get("early_stop_patience") or (
            not old and not train.get("evaluators")):
        return train
    new = {k: v for k, v in train.items() if k not in RETIRED and k != "evaluators"}
    bs = train.get("eval_batch_size")  # every evaluation's batch size, before
    evals: dict[str, Any] = {"eval": {"type": "classification", "every": train.get("eval_every", 0),
                                      "split": train.get("eval_split", "test"),
                                      "max_samples": train.get("eval_max_samples"), "batch_size": bs}}
    if train.get("early_stop_every"):
        rule = {k: train[f"early_stop_{k}"] for k in ("metric", "smoothing", "smooth_evals", "patience_epochs")
                if f"early_stop_{k}" in train}
        evals["early_stop"] = {"type": "early_stop", "every": train["early_stop_every"], "batch_size": bs, **rule}
    for spec in train.get("evaluators") or []:
        spec = dict(spec) if isinstance(spec, dict) else {"kind": spec}
        name, kind = spec.pop("name", "fewshot"), spec.pop("kind", None)
        evals[name] = {"type": kind, **spec, "batch_size": spec.get("batch_size") or bs}
    return {**new, "evaluators": evals}
