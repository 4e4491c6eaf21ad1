"""Data scale (paper Sec. 4.3, Fig. 3-4): ViT, hybrid and BiT ResNet trained on growing random subsets of
Fashion-MNIST, each run to convergence for its subset: an epoch budget per size, early stopping on a held-out
validation split carved from the training set, and the run's best-validation weights scored on the whole test split
(test top-1) and by the 5-shot linear probe on frozen features.

The paper (Fig. 3-4: ImageNet, ImageNet-21k, JFT-300M and random JFT subsets of 9 M to 300 M images): on the smaller
pre-training sets the BiT ResNets beat the ViTs, which overfit more; as the data grows the ResNets plateau and the
ViTs pass them. The point to show or refute here, at 1 k to 58.8 k images: the ResNet's lead over the ViT shrinks
as the data grows.

Why "to convergence": at the same compute per run (the first design), a 1,000-image run sees its data a hundred
times and a 60,000-image run a quarter of a time, every run is compute-bound, and the ViT's slower learning per
step hides the effect of the data. Here the small-data runs overfit and are stopped at their best, the large-data
runs get the epochs their size needs (fewer epochs, more steps). No data augmentation by default: random crops and
flips hand the ViT part of the convolutional inductive bias (translation, mirror invariance) that the experiment
is about, and stand in for data (Steiner et al. 2021, "How to train your ViT?"); `augment=True` keeps the shipped
recipe's crops and flips.

The budgets (50 / 25 / 10 / 8 / 8 epochs for 1k / 3k / 10k / 30k / 58.8k images) let early stopping end the small
runs and the large ones near their best: with 4 and 3 epochs at 30k and 58.8k (2026-12-05) the ViTs' best
validation step was at 88% and 94% of the budget, the ViT still learning, and the ResNet's lead rose from +1.4 to
+1.5 points at the last step; with 8 epochs it falls from +1.5 at 30k to -0.3 at 58.8k (docs/paper.md).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .budget import Job, budget_factor
from .figures import lines_plot
from .plan import load_or_make_plan
from .recipes import LABELS, MODEL_KINDS, data_section, model_section, pretrain_recipe
from .report import Claim, Section, pct, png_bytes
from .subrun import SubRunResult, run_or_resume

NAME = "data-scale"
# A change in the ResNet's lead counts only beyond this (accuracy points as a fraction): about two standard errors of
# the difference of two accuracies measured on the 10,000 test images (sqrt(2 * 0.2 * 0.8 / 10000) = 0.6%).
NOISE = 0.012
FULL_TRAIN = 60000  # Fashion-MNIST's training split, before the validation hold-out


@dataclass
class Settings:
    """What the experiment runs.

    Attributes:
        sizes: Training-subset sizes (nested: each is a prefix of the next one's draw), from the training split
            less the validation hold-out; the last one may be the whole remainder.
        epochs: The epoch budget of each size (same order): the most a run may train; early stopping ends it
            sooner once it stops improving on the validation split.
        models: Model kinds (`recipes.MODEL_KINDS`).
        batch_size: Every run's batch; warmup_frac: the warm-up's share of each run's steps.
        val_fraction: The validation hold-out (stratified, the same images for every run and size).
        evals: Validation evaluations per run (early stopping looks every steps / evals steps).
        patience: Evaluations in a row without a new best before a run stops.
        augment: Keep the shipped recipe's random crops and flips (default off, see the module docstring).
        shots: The linear probe's shots per class; probe_seeds: its draws; probe_pool / probe_test: its images.
        eval_samples: Test images scored (None: the whole test split).
        quick: Tiny models on synthetic data (the pipeline, not the finding).
    """

    sizes: list[int] = field(default_factory=lambda: [1000, 3000, 10000, 30000, 58800])
    epochs: list[float] = field(default_factory=lambda: [50.0, 25.0, 10.0, 8.0, 8.0])  # 4, 3 ended before convergence
    models: list[str] = field(default_factory=lambda: list(MODEL_KINDS))
    batch_size: int = 128
    warmup_frac: float = 0.05
    val_fraction: float = 0.02
    evals: int = 20
    patience: int = 5
    augment: bool = False
    shots: int = 5
    probe_seeds: int = 5
    probe_pool: int = 1000
    probe_test: int = 1000
    eval_samples: int | None = None
    quick: bool = False

    @classmethod
    def for_run(cls, quick: bool) -> Settings:
        if quick:
            return cls(sizes=[100, 300], epochs=[4.0, 2.0], batch_size=16, val_fraction=0.05, evals=3, patience=1,
                       probe_seeds=2, probe_pool=100, probe_test=100, eval_samples=100, quick=True)
        return cls()

    def steps(self, size: int, epochs: float) -> int:
        """Steps of `epochs` passes over `size` images (whole batches), at least 2."""
        return max(2, math.ceil(epochs * size / self.batch_size))

    def jobs(self) -> list[tuple[str, str, int, Job]]:
        """(sub-run name, model kind, size, budget job at its full epoch budget) of every run."""
        return [(f"{kind}-{n}", kind, n, Job(model_section(kind, self.quick), self.batch_size, self.steps(n, e)))
                for kind in self.models for n, e in zip(self.sizes, self.epochs)]


def recipe_for(s: Settings, kind: str, size: int):
    epochs = s.epochs[s.sizes.index(size)]
    steps = s.steps(size, epochs)
    extra = {} if s.augment else {"inception_crop": False, "hflip": False}
    data = data_section(s.quick, train_subset=size, subset_seed=0, val_fraction=s.val_fraction, **extra)
    probe = {"shots": [s.shots], "seeds": s.probe_seeds, "train_samples": min(s.probe_pool, size),
             "eval_samples": s.probe_test}
    return pretrain_recipe(model_section(kind, s.quick), data, steps=steps, batch_size=s.batch_size,
                           warmup=max(1, round(s.warmup_frac * steps)), fewshot=probe, eval_samples=s.eval_samples,
                           early_stop_every=max(1, steps // s.evals), early_stop_patience=s.patience)


def plan(exp_dir: Path, quick: bool, budget_min: float | None) -> tuple[Settings, dict[str, Any]]:
    def make() -> tuple[Settings, dict[str, Any]]:
        s = Settings.for_run(quick)
        if budget_min is None:
            return s, {}
        # the prediction assumes no run stops early (an upper bound); one factor scales every epoch budget
        factor, probe = budget_factor([j for *_, j in s.jobs()], budget_min)
        s.epochs = [e * factor for e in s.epochs]
        return s, probe

    return load_or_make_plan(exp_dir, NAME, quick=quick, budget_min=budget_min, make=make, settings_cls=Settings)


def run(out: Path, *, quick: bool = False, budget_min: float | None = None, progress: bool = False) -> dict[str, Any]:
    """Train every (model, size) sub-run (skipping finished ones, resuming unfinished ones) and collect the result."""
    exp_dir = out / NAME
    s, probe = plan(exp_dir, quick, budget_min)
    runs: dict[str, dict[str, Any]] = {}
    for name, kind, size, job in s.jobs():
        recipe = recipe_for(s, kind, size)
        r: SubRunResult = run_or_resume(name, recipe, exp_dir / name, progress=progress)
        fewshot = r.evaluators.get("fewshot", {})
        runs[name] = {**r.to_dict(), "model_kind": kind, "size": size,
                      "fewshot": fewshot.get(f"{s.shots}shot"), "fewshot_std": fewshot.get(f"{s.shots}shot_std"),
                      "planned_steps": job.steps, "epochs": r.images_seen / size,
                      "best_epoch": (r.best_step or r.steps) * s.batch_size / size,
                      "stopped_early": r.steps < job.steps}
    return {"experiment": NAME, "settings": s.__dict__, "budget": probe, "runs": runs}


def leads(result: dict[str, Any], metric: str, other: str = "vit") -> dict[int, float]:
    """BiT's accuracy minus `other`'s at each size both have, by size."""
    runs = result["runs"]
    out = {}
    for n in result["settings"]["sizes"]:
        b, v = runs.get(f"bit-{n}"), runs.get(f"{other}-{n}")
        if b is not None and v is not None and b[metric] is not None and v[metric] is not None:
            out[n] = b[metric] - v[metric]
    return out


def crossover(lead: dict[int, float]) -> float | None:
    """Where a least-squares line of the lead against log10(size) reaches zero (images), None if it does not fall."""
    if len(lead) < 2:
        return None
    x, y = np.log10(list(lead)), np.array(list(lead.values()))
    slope, icept = np.polyfit(x, y, 1)
    if slope > -1e-4:  # less than 0.01 points per tenfold data: no fall
        return None
    return float(10 ** min(-icept / slope, 300.0))


def _monotone_claim(lead: dict[int, float], what: str, metric: str) -> Claim:
    """"yes" when the lead shrinks from the smallest to the largest size by more than NOISE and no step up in size
    raises it by more than NOISE (monotone within the measurement's noise); "partly" when it shrinks overall only."""
    sizes = list(lead)
    drops = [lead[a] - lead[b] for a, b in itertools.pairwise(sizes)]
    series = ", ".join(f"{n:,}: {100 * d:+.1f}" for n, d in lead.items())
    first, last = lead[sizes[0]], lead[sizes[-1]]
    rise = max(0.0, -min(drops))
    monotone = rise <= NOISE
    shrinks = first > 0 and first - last > NOISE
    steps = ("falls at every step" if rise == 0 else
             f"falls at {sum(d > 0 for d in drops)} of {len(drops)} steps, the largest rise {100 * rise:.1f}")
    return Claim(
        paper="Sec. 4.3, Fig. 3-4: ResNets (BiT) do better than ViT with smaller pre-training datasets, ViT overfits "
              "more; the ResNet's lead shrinks as the data grows",
        measured=f"{what}, BiT minus ViT by training images: {series} points ({steps}; "
                 f"{100 * (first - last):+.1f} from the smallest to the largest; a change counts beyond "
                 f"{100 * NOISE:.1f}, about two standard errors)",
        verdict="yes" if monotone and shrinks else ("partly" if shrinks else "no"),
        numbers={"metric": metric, "largest_rise": rise, **{f"lead_at_{n}": d for n, d in lead.items()}})


def claims(result: dict[str, Any]) -> list[Claim]:
    """The ResNet's lead over the ViT against data size (test top-1 and 5-shot), and the crossover it implies."""
    s = result["settings"]
    out = []
    for metric, what in (("top1", "test top-1"), ("fewshot", f"{s['shots']}-shot linear probe")):
        lead = leads(result, metric)
        if len(lead) >= 2:
            out.append(_monotone_claim(lead, what, metric))
    lead = leads(result, "top1")
    if lead:
        large = max(lead)
        runs = result["runs"]
        v, b = runs[f"vit-{large}"]["top1"], runs[f"bit-{large}"]["top1"]
        x = crossover(lead)
        where = (f"the lead's trend (least squares against log10 of the size) reaches zero at about {x:,.0f} images"
                 if x is not None else "the lead does not fall with the data, so no crossover is in sight")
        out.append(Claim(
            paper="Sec. 4.3, Fig. 3: with the largest pre-training data (JFT-300M) ViT overtakes the ResNet",
            measured=f"test top-1 at {large:,} images: ViT {pct(v)}, BiT {pct(b)}; {where} (Fashion-MNIST has "
                     f"{FULL_TRAIN:,})",
            verdict="yes" if v >= b else "no", numbers={"vit": v, "bit": b, "size": large, "crossover": x}))
    return out


def tables_and_figures(result: dict[str, Any]) -> tuple[list, list[Section]]:
    s, runs = result["settings"], result["runs"]
    header = ["model", *[f"{n:,} images" for n in s["sizes"]]]
    rows_top1, rows_fs, rows_ep = [], [], []
    panels: dict[str, dict[str, tuple[list[float], list[float]]]] = {"top1": {}, "fewshot": {}}
    for kind in s["models"]:
        got = [runs[f"{kind}-{n}"] for n in s["sizes"] if f"{kind}-{n}" in runs]
        rows_top1.append([LABELS[kind], *[pct(r["top1"]) for r in got]])
        rows_fs.append([LABELS[kind], *[pct(r["fewshot"]) for r in got]])
        rows_ep.append([LABELS[kind], *[f"{r['best_epoch']:.1f} / {r['epochs']:.1f}"
                                        + (" (stopped)" if r["stopped_early"] else "") for r in got]])
        for metric in ("top1", "fewshot"):
            panels[metric][LABELS[kind]] = ([r["size"] for r in got], [r[metric] for r in got])
    lead_lines = {f"{LABELS['bit']} minus {LABELS[k]}": ([float(n) for n in lead], list(lead.values()))
                  for k in s["models"] if k != "bit" for lead in [leads(result, "top1", k)] if lead}
    fig = lines_plot([("Test top-1 (Fig. 3 analogue)", panels["top1"]),
                      (f"{s['shots']}-shot linear probe on frozen features (Fig. 4 analogue)", panels["fewshot"]),
                      ("The ResNet's lead (test top-1)", lead_lines)],
                     xlabel="training images (random Fashion-MNIST subset)", ylabel="accuracy (%)", logx=True)
    budget = ", ".join(f"{n:,}: {e:g}" for n, e in zip(s["sizes"], s["epochs"]))
    sec = Section("accuracy_vs_data", "Accuracy against data size (Fig. 3-4)",
                  f"Each point is one run trained to convergence for its subset: at most {budget} epochs (batch "
                  f"{s['batch_size']}), early stopping on {100 * s['val_fraction']:g}% of the training split held "
                  f"out (patience {s['patience']} of {s['evals']} evaluations), the best-validation weights scored "
                  f"on the test split and by the {s['shots']}-shot ridge probe; "
                  + ("random crops and flips." if s["augment"] else "no data augmentation."),
                  png_bytes(fig), {k: v for k, v in panels.items()} | {"lead_top1": lead_lines})
    tables = [("Test top-1 (the best-validation weights)", header, rows_top1),
              (f"{s['shots']}-shot linear probe", header, rows_fs),
              ("Epochs: best validation / trained (stopped: early stopping ended the run)", header, rows_ep)]
    return tables, [sec]


TITLE = "vitlab reproduce data-scale: ViT vs hybrid vs BiT ResNet over data size (Sec. 4.3, Fig. 3-4)"
