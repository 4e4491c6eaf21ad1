"""Resolution (paper Sec. 3.2): fine-tuning at a higher resolution than pre-training often helps; the patch size stays
the same, so the sequence grows, and the pre-trained position embeddings are interpolated in 2-D according to their
place in the image.

The upstream ViT (28 px, 7x7 patches of 4x4 pixels: `upstream`) is fine-tuned on its own task at larger sizes with
each position-embedding resize mode (jax, bilinear, bicubic), against (a) evaluating it at the larger size without
fine-tuning (embeddings resampled only) and (b) fine-tuning it for the same steps at its own 28 px, which separates
the gain of the resolution from the gain of the extra steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .budget import Job, budget_factor, scale_with_upstream
from .plan import load_or_make_plan
from .recipes import data_section, finetune_recipe, model_section
from .report import Claim, Section, pct, png_bytes
from .subrun import run_or_resume
from .upstream import UPSTREAM_CLASSES, ensure_upstream, upstream_recipe

NAME = "resolution"
BASE_SIZE = 28


@dataclass
class Settings:
    """What the experiment runs.

    Attributes:
        sizes: Fine-tuning sizes (multiples of the 4-pixel patch): 40 px = 10x10 tokens, 56 px = 14x14.
        modes: Position-embedding resize modes (`vitlab.config.RESIZE_MODES`).
        steps, batch_size, warmup, lr: Every fine-tuning run (SGD, the paper's recipe; the head is kept: same task).
        upstream_*: The shared pre-training, when this experiment is the first to need it.
        eval_samples: Test images scored (the first this many of the upstream classes' test split).
        quick: Tiny models on synthetic data.
    """

    sizes: list[int] = field(default_factory=lambda: [40, 56])
    modes: list[str] = field(default_factory=lambda: ["jax", "bilinear", "bicubic"])
    steps: int = 60
    batch_size: int = 32
    warmup: int = 6
    lr: float = 0.01
    upstream_steps: int = 400
    upstream_batch: int = 128
    upstream_warmup: int = 30
    eval_samples: int | None = 2000
    quick: bool = False

    @classmethod
    def for_run(cls, quick: bool) -> Settings:
        if quick:
            return cls(sizes=[40], modes=["bilinear", "bicubic"], steps=3, batch_size=16, warmup=1,
                       upstream_steps=4, upstream_batch=16, upstream_warmup=1, eval_samples=100, quick=True)
        return cls()


def plan(exp_dir: Path, quick: bool, budget_min: float | None) -> tuple[Settings, dict[str, Any]]:
    def make() -> tuple[Settings, dict[str, Any]]:
        s = Settings.for_run(quick)
        if budget_min is None:
            return s, {}
        k = len(UPSTREAM_CLASSES)
        jobs = [Job(model_section("vit", quick), s.upstream_batch, s.upstream_steps, k),
                Job(model_section("vit", quick), s.batch_size, s.steps, k)]
        jobs += [Job(model_section("vit", quick, size), s.batch_size, s.steps, k) for size in s.sizes
                 for _ in s.modes]
        factor, probe = budget_factor(jobs, budget_min)
        scale_with_upstream(s, factor)
        return s, probe

    return load_or_make_plan(exp_dir, NAME, quick=quick, budget_min=budget_min, make=make, settings_cls=Settings)


def _eval_resized(model_path: str, size: int, mode: str, data: dict[str, Any], eval_samples: int | None) -> float:
    """Top-1 of the pre-trained model run at `size` with its position embeddings resampled by `mode`, no training."""
    from ..data import DataConfig, build_eval_data
    from ..evaluate import evaluate
    from ..weights import load_model

    model = load_model(model_path, img_size=size, pos_embed_resize=mode)
    ev = build_eval_data(DataConfig.from_dict(data), "test", img_size=size, in_chans=model.cfg.in_chans,
                         batch_size=500)
    return evaluate(model, ev, ev.num_classes, precision="fp32", max_samples=eval_samples).top1


def run(out: Path, *, quick: bool = False, budget_min: float | None = None, progress: bool = False) -> dict[str, Any]:
    exp_dir = out / NAME
    s, probe = plan(exp_dir, quick, budget_min)
    up = ensure_upstream(out, upstream_recipe(quick, s.upstream_steps, s.upstream_batch, s.upstream_warmup,
                                              s.eval_samples), progress=progress)
    data = data_section(quick, classes=UPSTREAM_CLASSES)
    runs: dict[str, dict[str, Any]] = {"upstream": up.to_dict()}

    def finetune(size: int, mode: str) -> float:
        name = f"finetune-{size}px" + ("" if size == BASE_SIZE else f"-{mode}")
        r = run_or_resume(name, finetune_recipe(
            model_section("vit", quick, size), data, init=up.model, steps=s.steps, batch_size=s.batch_size,
            warmup=s.warmup, lr=s.lr, drop_head=False, pos_embed_resize=mode, eval_samples=s.eval_samples),
            exp_dir / name, progress=progress)
        runs[name] = r.to_dict()
        return r.top1

    base = _eval_resized(up.model, BASE_SIZE, "bicubic", data, s.eval_samples)  # same images as the others
    control = finetune(BASE_SIZE, "bicubic")
    table: dict[str, dict[str, dict[str, float]]] = {}
    for size in s.sizes:
        table[str(size)] = {mode: {"no_finetune": _eval_resized(up.model, size, mode, data, s.eval_samples),
                                   "finetune": finetune(size, mode)} for mode in s.modes}
    return {"experiment": NAME, "settings": s.__dict__, "budget": probe, "runs": runs, "table": table,
            "pretrained_28px": base, "finetune_28px": control, "upstream": {"top1": up.top1, "steps": up.steps}}


def claims(result: dict[str, Any]) -> list[Claim]:
    table, control, base = result["table"], result["finetune_28px"], result["pretrained_28px"]
    best = {size: max(modes.values(), key=lambda r: r["finetune"])["finetune"] for size, modes in table.items()}
    better = [size for size, acc in best.items() if acc > control]
    out = [Claim(
        paper="Sec. 3.2: fine-tuning at a higher resolution than pre-training is beneficial (more tokens, same "
              "patch size, 2-D interpolated position embeddings)",
        measured="best fine-tune at " + ", ".join(f"{size} px {pct(a)}" for size, a in best.items())
                 + f" vs the same steps at 28 px {pct(control)} (pre-trained model at 28 px: {pct(base)})",
        verdict="yes" if len(better) == len(best) else ("partly" if better else "no"),
        numbers={"finetune_28px": control, **{f"best_finetune_{size}px": a for size, a in best.items()}})]
    pairs = [(size, mode, r) for size, modes in table.items() for mode, r in modes.items()]
    recovered = [p for p in pairs if p[2]["finetune"] > p[2]["no_finetune"]]
    drops = [base - r["no_finetune"] for _, _, r in pairs]
    out.append(Claim(
        paper="Sec. 3.2: the resampled position embeddings are a starting point for fine-tuning at the new "
              "resolution (the model is fine-tuned, not only resized)",
        measured=f"without fine-tuning the larger input costs {100 * min(drops):.1f} to {100 * max(drops):.1f} "
                 f"points against 28 px; fine-tuning beats the resized-only model in {len(recovered)} of "
                 f"{len(pairs)} (size, mode) cases",
        verdict="yes" if len(recovered) == len(pairs) else ("partly" if recovered else "no"),
        numbers={"max_drop_without_finetune": max(drops), "min_drop_without_finetune": min(drops)}))
    return out


def tables_and_figures(result: dict[str, Any]) -> tuple[list, list[Section]]:
    from .figures import bar_groups

    table, s = result["table"], result["settings"]
    header = ["size", "pos-embed resize", "resized only (no fine-tuning)", "fine-tuned"]
    rows = [["28 px (pre-training size)", "-", pct(result["pretrained_28px"]), pct(result["finetune_28px"])]]
    groups, no_ft, ft = ["28 px"], [result["pretrained_28px"]], [result["finetune_28px"]]
    for size, modes in table.items():
        for mode, r in modes.items():
            rows.append([f"{size} px", mode, pct(r["no_finetune"]), pct(r["finetune"])])
            groups.append(f"{size} px {mode}")
            no_ft.append(r["no_finetune"])
            ft.append(r["finetune"])
    fig = bar_groups(groups, {"resized only": no_ft, "fine-tuned": ft}, ylabel="test top-1 (%)",
                     title="Fine-tuning at a higher resolution (Sec. 3.2)")
    sec = Section("resolution", "Fine-tuning at a higher resolution (Sec. 3.2)",
                  f"The upstream ViT (28 px, {result['upstream']['steps']} steps) evaluated at each size with its "
                  f"position embeddings resampled, and fine-tuned there for {s['steps']} SGD steps of "
                  f"{s['batch_size']} images; 28 px fine-tuned for the same steps is the control.",
                  png_bytes(fig), {"table": table, "pretrained_28px": result["pretrained_28px"],
                                   "finetune_28px": result["finetune_28px"]})
    return [("Test top-1 on the upstream task (Fashion-MNIST classes 0-5)", header, rows)], [sec]


TITLE = "vitlab reproduce resolution: fine-tuning at a higher resolution (Sec. 3.2)"
