"""An experiment's plan: its settings (quick or full, scaled to a budget) fixed on the first call and kept in
`plan.json`, so that running the same command again resumes the same sub-runs instead of starting others. The
number of seeds is not part of the plan: a later call with more `--seeds` keeps the runs of the seeds it has and
adds the others.

Each experiment's `Settings` subclasses `ExperimentSettings` with its own fields, its quick setting (`QUICK`), its
training jobs (`planned_jobs`, which `--budget` and `--plan` time) and how a budget factor scales them (`scale`);
`make_plan(exp_dir, name, Settings, ...)` is then the experiment's plan.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

from ..utils.io import write_atomic
from .budget import Job, budget_factor


@dataclass
class ExperimentSettings:
    """What every experiment's settings have (its own fields follow these).

    Attributes:
        eval_samples: Test images scored (None: the whole test split).
        quick: Tiny models on synthetic data (the pipeline, not the finding).
    """

    eval_samples: int | None = None
    quick: bool = False

    QUICK: ClassVar[dict[str, Any]] = {}  # the quick setting: the fields the CI's seconds-long run changes

    @classmethod
    def for_run(cls, quick: bool) -> Self:
        """The quick setting, or the full one (the fields' defaults)."""
        return cls(**copy.deepcopy(cls.QUICK), quick=True) if quick else cls()  # its lists the instance's own

    def planned_jobs(self) -> list[tuple[str, Job, bool]]:
        """(sub-run name, budget job, repeated per seed) of every training run."""
        raise NotImplementedError

    def scale(self, factor: float) -> None:
        """Scale the training lengths by `factor` (`--budget`; `vitlab.paper.budget`)."""
        raise NotImplementedError


S = TypeVar("S", bound=ExperimentSettings)
T = TypeVar("T")


def make_plan(exp_dir: Path, name: str, settings_cls: type[S], *, quick: bool,
              budget_min: float | None) -> tuple[S, dict[str, Any]]:
    """The settings of experiment `name` (`load_or_make_plan`): the quick or full setting, its training lengths scaled
    by one factor so that the predicted training time is `budget_min` minutes (None: unscaled); and the budget's
    probe ({} without a budget)."""

    def make() -> tuple[S, dict[str, Any]]:
        s = settings_cls.for_run(quick)
        if budget_min is None:
            return s, {}
        factor, probe = budget_factor([job for _, job, _ in s.planned_jobs()], budget_min)
        s.scale(factor)
        return s, probe

    return load_or_make_plan(exp_dir, name, quick=quick, budget_min=budget_min, make=make, settings_cls=settings_cls)


def load_or_make_plan(exp_dir: Path, name: str, *, quick: bool, budget_min: float | None,
                      make: Any, settings_cls: type[T]) -> tuple[T, dict[str, Any]]:
    """The settings in `exp_dir/plan.json` when it was made with the same options, else `make()`'s, saved there.

    Args:
        make: () -> (settings, probe): the settings for these options (and the budget probe, or {}).

    Raises:
        ValueError: plan.json was made with other options (--quick / --budget); the message says how to go on.
    """
    path = exp_dir / "plan.json"
    options = {"experiment": name, "quick": quick, "budget_min": budget_min}
    if path.is_file():
        saved = json.loads(path.read_text(encoding="utf-8"))
        if saved.get("options") != options:
            raise ValueError(f"{exp_dir} holds a run of {name} made with {_describe(saved.get('options') or {})}; "
                             f"run it with the same options to resume it, or choose another --out")
        known = {f.name for f in dataclasses.fields(settings_cls)}  # type: ignore[arg-type]
        stale = sorted(set(saved["settings"]) - known)
        if stale:
            raise ValueError(f"{path} was made by an earlier version of vitlab (settings {', '.join(stale)} are gone; "
                             f"e.g. early stopping now judges the val loss with a patience in epochs, issue 37); its "
                             f"runs are not this version's: choose another --out, or remove {exp_dir} to start over")
        return settings_cls(**saved["settings"]), saved.get("budget") or {}
    settings, probe = make()
    exp_dir.mkdir(parents=True, exist_ok=True)
    plan = {"options": options, "settings": dataclasses.asdict(settings), "budget": probe}  # type: ignore[call-overload]
    write_atomic(path, json.dumps(plan, indent=2), overwrite=True)
    return settings, probe


def _describe(options: dict[str, Any]) -> str:
    quick = "--quick" if options.get("quick") else "the full setting"
    budget = f" --budget {options['budget_min']:g}" if options.get("budget_min") else " no --budget"
    return quick + budget
