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
+1.5 points at the last step; with 8 epochs it falls from +1.5 at 30k to -0.3 at 58.8k
(benchmarks/results/HISTORY-paper.md).

Early stopping judges the val loss with a patience of 5 epochs (`vitlab.train.early_stop`; issue 37): the earlier
rule (the best raw val top-1 on the 1,200 val images, a patience of 5 evaluations, 2 epochs at 58.8k) stopped the
58.8k ViT at 65% of its budget on a one-evaluation top-1 spike while its val loss was still falling. One standard
error of a top-1 near 88% on 1,200 images is 0.9 points; every run's report states its own.

With `seeds` > 1 every (model, size) run is repeated with train.seed 1, 2, ... (model init, data order; the subset
stays the same), each in its own sub-run directory (`stats.seed_name`), and the claims compare means with their
standard errors (`vitlab.paper.stats`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from .budget import Job
from .figures import lines_plot
from .plan import ExperimentSettings, make_plan
from .recipes import LABELS, MODEL_KINDS, data_section, model_section, pretrain_recipe
from .report import Claim, Section, png_bytes
from .stats import NO, NOISE, PARTLY, YES, Estimate, arm, difference, pct_se, points, seed_name, verdict
from .subrun import SubRunResult, run_or_resume

NAME = "data-scale"
FULL_TRAIN = 60000  # Fashion-MNIST's training split, before the validation hold-out


@dataclass
class Settings(ExperimentSettings):
    """What the experiment runs (and `eval_samples`, `quick`: `ExperimentSettings`).

    Attributes:
        sizes: Training-subset sizes (nested: each is a prefix of the next one's draw), from the training split
            less the validation hold-out; the last one may be the whole remainder.
        epochs: The epoch budget of each size (same order): the most a run may train; early stopping ends it
            sooner once it stops improving on the validation split.
        models: Model kinds (`recipes.MODEL_KINDS`).
        batch_size: Every run's batch; warmup_frac: the warm-up's share of each run's steps.
        val_fraction: The validation hold-out (stratified, the same images for every run and size).
        evals: Validation evaluations per run (early stopping looks every steps / evals steps).
        patience_epochs: Epochs of training without a better val loss before a run stops (not evaluations: a
            58.8k-image run evaluates every 0.4 epochs, a 1k-image one every 2.5).
        stop_metric: What early stopping judges ("loss"; `train.evaluators.early_stop.metric`).
        augment: Keep the shipped recipe's random crops and flips (default off, see the module docstring).
        shots: The linear probe's shots per class; probe_seeds: its draws; probe_pool / probe_test: its images.
    """

    sizes: list[int] = field(default_factory=lambda: [1000, 3000, 10000, 30000, 58800])
    epochs: list[float] = field(default_factory=lambda: [50.0, 25.0, 10.0, 8.0, 8.0])  # 4, 3 ended before convergence
    models: list[str] = field(default_factory=lambda: list(MODEL_KINDS))
    batch_size: int = 128
    warmup_frac: float = 0.05
    val_fraction: float = 0.02  # 1,200 of the 60,000 training images
    evals: int = 20
    patience_epochs: float = 5.0
    stop_metric: str = "loss"  # the raw val top-1 stopped the 58.8k ViT on a spike (module docstring)
    augment: bool = False
    shots: int = 5
    probe_seeds: int = 5
    probe_pool: int = 1000
    probe_test: int = 1000

    QUICK: ClassVar[dict[str, Any]] = dict(sizes=[100, 300], epochs=[4.0, 2.0], batch_size=16, val_fraction=0.05,
                                           evals=3, patience_epochs=1.0, probe_seeds=2, probe_pool=100,
                                           probe_test=100, eval_samples=100)

    def steps(self, size: int, epochs: float) -> int:
        """Steps of `epochs` passes over `size` images (whole batches), at least 2."""
        return max(2, math.ceil(epochs * size / self.batch_size))

    def jobs(self) -> list[tuple[str, str, int, Job]]:
        """(sub-run name, model kind, size, budget job at its full epoch budget) of every run."""
        return [(f"{kind}-{n}", kind, n, Job(model_section(kind, self.quick), self.batch_size, self.steps(n, e)))
                for kind in self.models for n, e in zip(self.sizes, self.epochs)]

    def planned_jobs(self) -> list[tuple[str, Job, bool]]:
        """Every run, each repeated per seed."""
        return [(name, job, True) for name, _, _, job in self.jobs()]

    def scale(self, factor: float) -> None:
        # the prediction assumes no run stops early (an upper bound); one factor scales every epoch budget
        self.epochs = [e * factor for e in self.epochs]


def recipe_for(s: Settings, kind: str, size: int, seed: int = 0):
    epochs = s.epochs[s.sizes.index(size)]
    steps = s.steps(size, epochs)
    extra = {} if s.augment else {"inception_crop": False, "hflip": False}
    data = data_section(s.quick, train_subset=size, subset_seed=0, val_fraction=s.val_fraction, **extra)
    probe = {"shots": [s.shots], "seeds": s.probe_seeds, "train_samples": min(s.probe_pool, size),
             "eval_samples": s.probe_test}
    return pretrain_recipe(model_section(kind, s.quick), data, steps=steps, batch_size=s.batch_size,
                           warmup=max(1, round(s.warmup_frac * steps)), fewshot=probe, eval_samples=s.eval_samples,
                           seed=seed, early_stop_every=max(1, steps // s.evals),
                           early_stop_patience_epochs=s.patience_epochs, early_stop_metric=s.stop_metric,
                           early_stop_smoothing="none" if s.stop_metric == "loss" else "window")


def plan(exp_dir: Path, quick: bool, budget_min: float | None) -> tuple[Settings, dict[str, Any]]:
    return make_plan(exp_dir, NAME, Settings, quick=quick, budget_min=budget_min)


def run(out: Path, *, quick: bool = False, budget_min: float | None = None, progress: bool = False,
        seeds: int = 1) -> dict[str, Any]:
    """Train every (model, size) sub-run for each seed (skipping finished ones, resuming unfinished ones) and
    collect the result."""
    exp_dir = out / NAME
    s, probe = plan(exp_dir, quick, budget_min)
    runs: dict[str, dict[str, Any]] = {}
    for seed in range(seeds):
        for base, kind, size, job in s.jobs():
            name = seed_name(base, seed)
            r: SubRunResult = run_or_resume(name, recipe_for(s, kind, size, seed), exp_dir / name, progress=progress)
            fewshot = r.evaluators.get("fewshot", {})
            runs[name] = {**r.to_dict(), "arm": base, "seed": seed, "model_kind": kind, "size": size,
                          "fewshot": fewshot.get(f"{s.shots}shot"), "fewshot_std": fewshot.get(f"{s.shots}shot_std"),
                          "planned_steps": job.steps, "epochs": r.images_seen / size,
                          "best_epoch": (r.best_step or r.steps) * s.batch_size / size,
                          "stopped_early": r.steps < job.steps}
    return {"experiment": NAME, "settings": s.__dict__, "budget": probe, "runs": runs, "seeds": seeds}


def arm_estimate(result: dict[str, Any], kind: str, size: int, metric: str) -> Estimate | None:
    """The (model kind, size) arm's `metric` over its seeds: mean and standard error (`stats.arm`; one seed: the
    binomial standard error of its test images, the probe's `probe_test`)."""
    s = result["settings"]
    got = [r for name, r in result["runs"].items()
           if r.get("arm", name) == f"{kind}-{size}" and r.get(metric) is not None]
    if not got:
        return None
    n = s.get("probe_test") if metric == "fewshot" else got[0].get("test_images")
    return arm([r[metric] for r in sorted(got, key=lambda r: r.get("seed", 0))], n)


def lead_estimates(result: dict[str, Any], metric: str, other: str = "vit") -> dict[int, Estimate]:
    """BiT's accuracy minus `other`'s at each size both have (mean over seeds, standard error of the difference)."""
    out = {}
    for n in result["settings"]["sizes"]:
        b, v = arm_estimate(result, "bit", n, metric), arm_estimate(result, other, n, metric)
        if b is not None and v is not None:
            out[n] = difference(b, v)
    return out


def leads(result: dict[str, Any], metric: str, other: str = "vit") -> dict[int, float]:
    """BiT's mean accuracy minus `other`'s at each size both have, by size."""
    return {n: e.mean for n, e in lead_estimates(result, metric, other).items()}


def crossover(lead: dict[int, float]) -> float | None:
    """Where a least-squares line of the lead against log10(size) reaches zero (images), None if it does not fall."""
    if len(lead) < 2:
        return None
    x, y = np.log10(list(lead)), np.array(list(lead.values()))
    slope, icept = np.polyfit(x, y, 1)
    if slope > -1e-4:  # less than 0.01 points per tenfold data: no fall
        return None
    return float(10 ** min(-icept / slope, 300.0))


def _monotone_claim(lead: dict[int, Estimate], what: str, metric: str) -> Claim:
    """"yes" when the lead shrinks from the smallest to the largest size by at least 2 standard errors of that
    change and no step up in size raises it by 2 standard errors ("partly" when one does); "no" when it grows by 2
    standard errors; otherwise "within noise"."""
    sizes = list(lead)
    first, last = lead[sizes[0]], lead[sizes[-1]]
    shrink = difference(first, last)
    steps_ = [difference(lead[b], lead[a]) for a, b in itertools.pairwise(sizes)]  # rise of each step up in size
    rise = max(0.0, *(d.mean for d in steps_)) if steps_ else 0.0
    real_rises = [d for d in steps_ if verdict(d.mean, d.se) == YES]
    shrinks = verdict(shrink.mean, shrink.se)
    series = ", ".join(f"{n:,}: {points(d)}" for n, d in lead.items())
    falls = sum(d.mean < 0 for d in steps_)
    steps = ("falls at every step" if rise == 0 else
             f"falls at {falls} of {len(steps_)} steps, the largest rise {100 * rise:.1f}")
    v = (YES if not real_rises else PARTLY) if shrinks == YES else (NO if shrinks == NO else NOISE)
    return Claim(
        paper="Sec. 4.3, Fig. 3-4: ResNets (BiT) do better than ViT with smaller pre-training datasets, ViT overfits "
              "more; the ResNet's lead shrinks as the data grows",
        measured=f"{what}, BiT minus ViT by training images: {series} points ({steps}; "
                 f"{points(shrink)} from the smallest to the largest, ± one standard error; a change counts at 2 "
                 f"standard errors ({_se_words(first)}), {len(real_rises)} step(s) up in size raise it that much)",
        verdict=v,
        numbers={"metric": metric, "largest_rise": rise, "shrink": shrink.mean, "shrink_se": shrink.se,
                 **{f"lead_at_{n}": d.mean for n, d in lead.items()},
                 **{f"lead_se_at_{n}": d.se for n, d in lead.items()}})


def _se_words(e: Estimate) -> str:
    if e.source == "seeds":
        return f"standard errors from {e.n} seeds per arm"
    return "one seed per arm: standard errors of the test images alone, no seed spread"


def claims(result: dict[str, Any]) -> list[Claim]:
    """The ResNet's lead over the ViT against data size (test top-1 and 5-shot), and the crossover it implies."""
    s = result["settings"]
    out = []
    for metric, what in (("top1", "test top-1"), ("fewshot", f"{s['shots']}-shot linear probe")):
        lead = lead_estimates(result, metric)
        if len(lead) >= 2:
            out.append(_monotone_claim(lead, what, metric))
    lead = lead_estimates(result, "top1")
    if lead:
        large = max(lead)
        v, b = arm_estimate(result, "vit", large, "top1"), arm_estimate(result, "bit", large, "top1")
        assert v is not None and b is not None
        ahead = difference(v, b)
        x = crossover({n: e.mean for n, e in lead.items()})
        where = (f"the lead's trend (least squares against log10 of the size) reaches zero at about {x:,.0f} images"
                 if x is not None else "the lead does not fall with the data, so no crossover is in sight")
        out.append(Claim(
            paper="Sec. 4.3, Fig. 3: with the largest pre-training data (JFT-300M) ViT overtakes the ResNet",
            measured=f"test top-1 at {large:,} images: ViT {pct_se(v)}, BiT {pct_se(b)}: ViT minus BiT "
                     f"{points(ahead)} points; {where} (Fashion-MNIST has {FULL_TRAIN:,})",
            verdict=verdict(ahead.mean, ahead.se),
            numbers={"vit": v.mean, "bit": b.mean, "vit_minus_bit": ahead.mean, "se": ahead.se, "size": large,
                     "seeds": v.n, "crossover": x}))
    return out


def tables_and_figures(result: dict[str, Any]) -> tuple[list, list[Section]]:
    s, runs = result["settings"], result["runs"]
    header = ["model", *[f"{n:,} images" for n in s["sizes"]]]
    rows_top1: list[list[str]] = []
    rows_fs: list[list[str]] = []
    rows_ep: list[list[str]] = []
    panels: dict[str, dict[str, tuple]] = {"top1": {}, "fewshot": {}}
    for kind in s["models"]:
        sizes = [n for n in s["sizes"] if arm_estimate(result, kind, n, "top1") is not None]
        seed0 = [runs[f"{kind}-{n}"] for n in sizes if f"{kind}-{n}" in runs]
        for metric, rows in (("top1", rows_top1), ("fewshot", rows_fs)):
            ests = [arm_estimate(result, kind, n, metric) for n in sizes]
            rows.append([LABELS[kind], *[pct_se(e) for e in ests]])
            pts = [(r["size"], r[metric]) for r in runs.values()
                   if r.get("model_kind") == kind and r.get(metric) is not None]
            panels[metric][LABELS[kind]] = (sizes, [e.mean if e else None for e in ests],
                                            [e.se if e and e.n >= 2 else None for e in ests], pts)
        rows_ep.append([LABELS[kind], *[f"{r['best_epoch']:.1f} / {r['epochs']:.1f}"
                                        + (" (stopped)" if r["stopped_early"] else "") for r in seed0]])
    lead_lines: dict[str, tuple] = {}
    for k in s["models"]:
        if k == "bit":
            continue
        lead = lead_estimates(result, "top1", k)
        if lead:
            lead_lines[f"{LABELS['bit']} minus {LABELS[k]}"] = (
                [float(n) for n in lead], [e.mean for e in lead.values()],
                [e.se if e.n >= 2 else None for e in lead.values()])
    fig = lines_plot([("Test top-1 (Fig. 3 analogue)", panels["top1"]),
                      (f"{s['shots']}-shot linear probe on frozen features (Fig. 4 analogue)", panels["fewshot"]),
                      ("The ResNet's lead (test top-1)", lead_lines)],
                     xlabel="training images (random Fashion-MNIST subset)", ylabel="accuracy (%)", logx=True)
    budget = ", ".join(f"{n:,}: {e:g}" for n, e in zip(s["sizes"], s["epochs"]))
    seeds = result.get("seeds", 1)
    patience = s.get("patience_epochs")
    sec = Section("accuracy_vs_data", "Accuracy against data size (Fig. 3-4)",
                  f"Each point is the mean of {seeds} seed(s) (bars: one standard error; dots: every seed), each run "
                  f"trained to convergence for its subset: at most {budget} epochs (batch {s['batch_size']}), early "
                  f"stopping on the val {s.get('stop_metric', 'loss')} over {100 * s['val_fraction']:g}% of the "
                  f"training split held out (patience {patience:g} epochs, {s['evals']} evaluations per run), the "
                  f"best-validation weights scored on the test split and by the {s['shots']}-shot ridge probe; "
                  + ("random crops and flips." if s["augment"] else "no data augmentation."),
                  png_bytes(fig), {k: v for k, v in panels.items()} | {"lead_top1": lead_lines})
    tables = [(f"Test top-1 (the best-validation weights; mean ± standard error over {seeds} seed(s))", header,
               rows_top1),
              (f"{s['shots']}-shot linear probe", header, rows_fs),
              ("Epochs of seed 0: best validation / trained (stopped: early stopping ended the run)", header, rows_ep)]
    return tables, [sec]


TITLE = "vitlab reproduce data-scale: ViT vs hybrid vs BiT ResNet over data size (Sec. 4.3, Fig. 3-4)"
