"""Data scale (paper Sec. 4.3, Fig. 3-4): ViT, hybrid and BiT ResNet trained on growing random subsets of
Fashion-MNIST with one recipe per model and the same compute per run (the same steps of the same batch, whatever the
subset's size); test top-1 and the 5-shot linear probe on frozen features per size.

The paper (Fig. 3-4: ImageNet, ImageNet-21k, JFT-300M and random JFT subsets of 9 M to 300 M images): on the smaller
pre-training sets the BiT ResNets beat the ViTs; as the data grows the ResNets plateau and the ViTs pass them. The
point to show or refute here, at 1 k to 60 k images: the ResNet's lead over the ViT shrinks as the data grows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .budget import Job, budget_factor, scale_steps
from .plan import load_or_make_plan
from .recipes import LABELS, MODEL_KINDS, data_section, model_section, pretrain_recipe
from .report import Claim, Section, pct, png_bytes
from .subrun import SubRunResult, run_or_resume

NAME = "data-scale"
# A change in the ResNet's lead counts only beyond this (accuracy points as a fraction): about two standard errors of
# the difference of two accuracies measured on 5,000 test images (sqrt(2 * 0.25 / 5000) = 1%), before seed noise.
NOISE = 0.02


@dataclass
class Settings:
    """What the experiment runs.

    Attributes:
        sizes: Training-subset sizes (nested: each is a prefix of the next one's draw).
        models: Model kinds (`recipes.MODEL_KINDS`).
        steps, batch_size, warmup: Every run's length: the same for every size (same compute per model).
        shots: The linear probe's shots per class; probe_seeds: its draws; probe_pool / probe_test: its images.
        eval_samples: Test images scored (None: the whole test split).
        quick: Tiny models on synthetic data (the pipeline, not the finding).
    """

    sizes: list[int] = field(default_factory=lambda: [1000, 3000, 10000, 30000, 60000])
    models: list[str] = field(default_factory=lambda: list(MODEL_KINDS))
    steps: int = 128
    batch_size: int = 128
    warmup: int = 15
    shots: int = 5
    probe_seeds: int = 5
    probe_pool: int = 1000
    probe_test: int = 1000
    eval_samples: int | None = 5000
    quick: bool = False

    @classmethod
    def for_run(cls, quick: bool) -> Settings:
        if quick:
            return cls(sizes=[100, 300], steps=3, batch_size=16, warmup=1, probe_seeds=2, probe_pool=100,
                       probe_test=100, eval_samples=100, quick=True)
        return cls()

    def jobs(self) -> list[tuple[str, str, int, Job]]:
        """(sub-run name, model kind, size, budget job) of every run."""
        return [(f"{kind}-{n}", kind, n, Job(model_section(kind, self.quick), self.batch_size, self.steps))
                for kind in self.models for n in self.sizes]


def recipe_for(s: Settings, kind: str, size: int):
    data = data_section(s.quick, train_subset=size, subset_seed=0)
    probe = {"shots": [s.shots], "seeds": s.probe_seeds, "train_samples": min(s.probe_pool, size),
             "eval_samples": s.probe_test}
    return pretrain_recipe(model_section(kind, s.quick), data, steps=s.steps, batch_size=s.batch_size,
                           warmup=s.warmup, fewshot=probe, eval_samples=s.eval_samples)


def plan(exp_dir: Path, quick: bool, budget_min: float | None) -> tuple[Settings, dict[str, Any]]:
    def make() -> tuple[Settings, dict[str, Any]]:
        s = Settings.for_run(quick)
        if budget_min is None:
            return s, {}
        factor, probe = budget_factor([j for *_, j in s.jobs()], budget_min)
        s.steps = scale_steps(s.steps, factor)
        s.warmup = max(1, min(s.warmup, s.steps // 10))
        return s, probe

    return load_or_make_plan(exp_dir, NAME, quick=quick, budget_min=budget_min, make=make, settings_cls=Settings)


def run(out: Path, *, quick: bool = False, budget_min: float | None = None, progress: bool = False) -> dict[str, Any]:
    """Train every (model, size) sub-run (skipping finished ones, resuming unfinished ones) and collect the result."""
    exp_dir = out / NAME
    s, probe = plan(exp_dir, quick, budget_min)
    runs: dict[str, dict[str, Any]] = {}
    for name, kind, size, _ in s.jobs():
        r: SubRunResult = run_or_resume(name, recipe_for(s, kind, size), exp_dir / name, progress=progress)
        fewshot = r.evaluators.get("fewshot", {})
        runs[name] = {**r.to_dict(), "model_kind": kind, "size": size,
                      "fewshot": fewshot.get(f"{s.shots}shot"), "fewshot_std": fewshot.get(f"{s.shots}shot_std"),
                      "epochs": r.images_seen / size}
    return {"experiment": NAME, "settings": s.__dict__, "budget": probe, "runs": runs}


def claims(result: dict[str, Any]) -> list[Claim]:
    """The ResNet's lead over the ViT at the smallest and the largest size, test top-1 and 5-shot."""
    s, runs = result["settings"], result["runs"]
    small, large = min(s["sizes"]), max(s["sizes"])
    out = []
    for metric, what in (("top1", "test top-1"), ("fewshot", f"{s['shots']}-shot linear probe")):
        def acc(kind: str, n: int, metric: str = metric) -> float | None:
            r = runs.get(f"{kind}-{n}")
            return None if r is None else r[metric]

        b0, v0, b1, v1 = acc("bit", small), acc("vit", small), acc("bit", large), acc("vit", large)
        if None in (b0, v0, b1, v1):
            continue
        assert b0 is not None and v0 is not None and b1 is not None and v1 is not None
        lead0, lead1 = b0 - v0, b1 - v1
        leads = {}
        for n in s["sizes"]:
            b, v = acc("bit", n), acc("vit", n)
            if b is not None and v is not None:
                leads[n] = b - v
        series = ", ".join(f"{n:,}: {100 * d:+.1f}" for n, d in leads.items())
        out.append(Claim(
            paper="Sec. 4.3, Fig. 3-4: ResNets (BiT) do better than ViT with smaller pre-training datasets; the "
                  "ResNet's lead shrinks as the data grows",
            measured=f"{what}: BiT minus ViT is {100 * lead0:+.1f} points at {small:,} images and "
                     f"{100 * lead1:+.1f} points at {large:,} images (same steps per run; by size: {series}); a "
                     f"change counts beyond {100 * NOISE:.0f} points",
            verdict="yes" if lead0 > 0 and lead0 - lead1 > NOISE else ("partly" if lead0 - lead1 > NOISE else "no"),
            numbers={f"lead_at_{small}": lead0, f"lead_at_{large}": lead1, "metric": metric}))
        if metric == "top1":
            out.append(Claim(
                paper="Sec. 4.3, Fig. 3: with the largest pre-training data ViT overtakes the ResNet",
                measured=f"test top-1 at {large:,} images: ViT {pct(v1)}, BiT {pct(b1)}",
                verdict="yes" if v1 >= b1 else "no", numbers={"vit": v1, "bit": b1, "size": large}))
    return out


def tables_and_figures(result: dict[str, Any]) -> tuple[list, list[Section]]:
    from .figures import lines_plot

    s, runs = result["settings"], result["runs"]
    header = ["model", *[f"{n:,} images" for n in s["sizes"]]]
    rows_top1, rows_fs = [], []
    panels: dict[str, dict[str, tuple[list[float], list[float]]]] = {"top1": {}, "fewshot": {}}
    for kind in s["models"]:
        got = [runs[f"{kind}-{n}"] for n in s["sizes"] if f"{kind}-{n}" in runs]
        rows_top1.append([LABELS[kind], *[pct(r["top1"]) for r in got]])
        rows_fs.append([LABELS[kind], *[pct(r["fewshot"]) for r in got]])
        for metric in ("top1", "fewshot"):
            panels[metric][LABELS[kind]] = ([r["size"] for r in got], [r[metric] for r in got])
    fig = lines_plot([("Test top-1 (Fig. 3 analogue)", panels["top1"]),
                      (f"{s['shots']}-shot linear probe on frozen features (Fig. 4 analogue)", panels["fewshot"])],
                     xlabel="training images (random Fashion-MNIST subset)", ylabel="accuracy (%)", logx=True)
    steps = s["steps"] * s["batch_size"]
    sec = Section("accuracy_vs_data", "Accuracy against data size (Fig. 3-4)",
                  f"Each point is one run of {s['steps']} steps of {s['batch_size']} images ({steps:,} images seen, "
                  f"the same for every size); test top-1 on the test split and the {s['shots']}-shot ridge probe.",
                  png_bytes(fig), {k: v for k, v in panels.items()})
    tables = [("Test top-1", header, rows_top1), (f"{s['shots']}-shot linear probe", header, rows_fs)]
    return tables, [sec]


TITLE = "vitlab reproduce data-scale: ViT vs hybrid vs BiT ResNet over data size (Sec. 4.3, Fig. 3-4)"
