"""The paper's findings, reproduced at a scale one machine runs: `vitlab reproduce EXPERIMENT`.

    data-scale   ViT vs hybrid vs BiT ResNet on growing data, each run to convergence (Sec. 4.3, Fig. 3-4)
    transfer     pre-train, then fine-tune / linear-probe with 1..all labels per class vs scratch (Table 2 protocol)
    resolution   pre-train below the native resolution, fine-tune at it, vs continuing below (Sec. 3.2)
    inside       filters, position embeddings, attention distance, rollout of the longest-trained ViT, and
                 Raghu et al. 2021's data explanation of missing local heads (Sec. 4.5, Fig. 6-7)

Each experiment's sub-runs are `vitlab train` run directories under OUT/EXPERIMENT/ (OUT/upstream/ holds transfer's
pre-training); calling it again skips finished sub-runs and resumes unfinished
ones. The report (result.json, PNGs, report.html) goes to OUT/EXPERIMENT/report/. With `seeds` > 1 every compared
arm runs once per seed (its own sub-run directory, resumable per seed) and the claims compare means in standard
errors (`vitlab.paper.stats`); `vitlab.paper.forecast` predicts the training time first.

    from vitlab.paper import reproduce
    page = reproduce("data-scale", "runs/paper", quick=True)

`vitlab demo` (`vitlab.paper.demo`, the paper's story in minutes) runs through the same code: its training steps are
sub-runs, its transfer is the transfer experiment's task, its page this report (`vitlab.paper.demo_page`).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from ..perf.cpu import machine_summary
from .report import write_report

EXPERIMENTS = ("data-scale", "transfer", "resolution", "inside")

__all__ = ["EXPERIMENTS", "experiment_module", "reproduce"]


def experiment_module(name: str) -> ModuleType:
    """The module of an experiment (`run`, `claims`, `tables_and_figures`, `TITLE`)."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; choose one of {', '.join(EXPERIMENTS)}")
    return importlib.import_module(f"{__name__}.{name.replace('-', '_')}")


def reproduce(name: str, out: str | Path, *, quick: bool = False, budget_min: float | None = None,
              progress: bool = False, on_report: Callable[[Path], Any] | None = None, seeds: int = 1) -> Path:
    """Run experiment `name` under `out` (resuming what is there) and write its report; returns report.html's path.

    Args:
        quick: The CI setting: tiny models on synthetic data, seconds; checks the pipeline and the report, not the
            finding.
        budget_min: Scale every sub-run's steps by one factor so the experiment's predicted training time is this
            many minutes (`vitlab.paper.budget`); None: the setting's own steps.
        progress: Progress bars of the sub-runs.
        seeds: Runs of every compared arm, with train.seed 0 .. seeds - 1 (model init, data order, augmentation);
            seed 0's are the single-seed runs, so a call with more seeds adds runs and retrains none.
    """
    if seeds < 1:
        raise ValueError(f"seeds must be at least 1, got {seeds}")
    mod = experiment_module(name)
    out = Path(out)
    t0 = time.perf_counter()
    result = mod.run(out, quick=quick, budget_min=budget_min, progress=progress, seeds=seeds)
    result["wall_time_s_this_call"] = time.perf_counter() - t0
    result["machine"] = machine_summary()
    claims = mod.claims(result)
    tables, parts = mod.tables_and_figures(result)
    setting = "quick (CI: tiny models, synthetic data; the numbers mean nothing)" if quick else "full"
    noise = (f"{seeds} seeds per compared arm: tables give mean ± standard error, figures every seed; a claim reads "
             "yes (or no) only when the mean difference is at least 2 standard errors above (below) its bar, else "
             "within noise" if seeds > 1 else
             "one seed per arm: the standard errors are the test images' alone (no seed spread; --seeds N adds it); "
             "a claim reads yes (or no) only 2 standard errors above (below) its bar, else within noise")
    intro = (f"Setting: {setting}; {noise}. Machine: {result['machine']['summary']}. Training time of the sub-runs: "
             f"{sum(r.get('train_time_s', 0.0) for r in result['runs'].values()) / 60:.1f} min; wall time of this "
             f"call {result['wall_time_s_this_call'] / 60:.1f} min (finished sub-runs are read back, not retrained).")
    page = write_report(out / name / "report", title=mod.TITLE, intro=intro, claims=claims, tables=tables,
                        parts=parts, result=result)
    if on_report is not None:
        on_report(page)
    return page
