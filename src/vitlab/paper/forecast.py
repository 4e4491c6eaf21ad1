"""`vitlab reproduce EXPERIMENT --plan [--seeds N]`: what an experiment would train and how long that takes here,
before training anything.

Each distinct model of the experiment is timed for a few optimizer steps on random inputs in this process (its
threads, this machine's load, `budget.step_seconds`); the forecast is every planned run's steps times its model's
step time: the shared runs (a pre-training) once, the compared arms once per seed, and what is left after the
finished sub-runs under OUT. Evaluation is not in it, and early stopping can end runs sooner (data-scale's forecast
is an upper bound). Nothing is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .budget import budget_factor, step_seconds
from .stats import seed_name
from .subrun import finished


def forecast(name: str, out: str | Path, *, quick: bool = False, seeds: int = 1,
             budget_min: float | None = None) -> dict[str, Any]:
    """The forecast of experiment `name` under `out` with `seeds` seeds and `--budget` `budget_min` (see the module
    docstring); an OUT that holds the experiment's plan.json is forecast with its settings (made with these options,
    else ValueError as `vitlab reproduce` would say), and nothing is written.

    Returns:
        {"experiment", "seeds", "runs", "runs_left", "predicted_min", "left_min", "seconds_per_step": {model key:
        s}, "jobs": [{"name", "steps", "batch_size", "per_seed", "minutes", "done"}]}.
    """
    from . import experiment_module

    mod = experiment_module(name)
    out = Path(out)
    exp_dir = out / name
    if not hasattr(mod, "plan"):
        return {"experiment": name, "seeds": seeds, "runs": 0, "runs_left": 0, "predicted_min": 0.0, "left_min": 0.0,
                "seconds_per_step": {}, "jobs": [],
                "note": "analysis of the other experiments' models only (trains a ViT only when none exists)"}
    if (exp_dir / "plan.json").is_file():  # the settings fixed there (read, not rewritten)
        settings, _ = mod.plan(exp_dir, quick, budget_min)
    else:
        settings = mod.Settings.for_run(quick)
        if budget_min is not None:  # the lengths `--budget` would scale to (timed here, as the run would)
            settings.scale(budget_factor([job for _, job, _ in settings.planned_jobs()], budget_min)[0])
    timings: dict[str, float] = {}
    jobs, total, left, n_runs, n_left = [], 0.0, 0.0, 0, 0
    for base, job, per_seed in settings.planned_jobs():
        if job.key() not in timings:
            timings[job.key()] = step_seconds(job.model, job.batch_size, job.num_classes)
        minutes = job.steps * timings[job.key()] / 60.0
        for seed in range(seeds if per_seed else 1):
            run = seed_name(base, seed)
            done = finished((exp_dir / run).resolve())
            total += minutes
            n_runs += 1
            if not done:
                left += minutes
                n_left += 1
            jobs.append({"name": run, "steps": job.steps, "batch_size": job.batch_size, "per_seed": per_seed,
                         "minutes": minutes, "done": done})
    return {"experiment": name, "seeds": seeds, "runs": n_runs, "runs_left": n_left, "predicted_min": total,
            "left_min": left, "seconds_per_step": timings, "jobs": jobs}


def describe(f: dict[str, Any]) -> str:
    """The forecast in two lines."""
    if f.get("note"):
        return f"{f['experiment']}: {f['note']}"
    return (f"{f['experiment']}, {f['seeds']} seed(s): {f['runs']} training runs, {f['predicted_min']:.1f} min of "
            f"training predicted at this machine's current speed (evaluation not counted; early stopping may end "
            f"runs sooner);\n  left to train under this OUT: {f['runs_left']} runs, {f['left_min']:.1f} min")
