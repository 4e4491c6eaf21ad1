"""`vitlab demo` (what `make demo` runs): the paper's story in miniature on a CPU, in minutes.

1. Pre-train a hybrid ViT (paper Sec. 3.1) on Fashion-MNIST BELOW its native resolution (16 px: the 28 px images
   downsampled, so cheap steps and less detail), with a point of the eval curve per epoch on a fixed test subset.
2. Fine-tune it at the native 28 px (real added detail), same patch, longer sequence, the position embeddings
   interpolated on the 2-D grid (Sec. 3.2); and, as the control, the same fine-tuning steps kept at 16 px, so the
   resolution's gain is measured against spending the same steps without it.
3. Transfer it to another data set (scikit-learn's handwritten digits) with a zero head, against the same model
   trained from scratch on the same images and steps, with 10 labels per class and with all of them (Sec. 4.2).
4. Look inside the fine-tuned model with `vitlab.analysis` (Sec. 4.5: position-embedding similarity, mean
   attention distance, attention rollout).

Each training step is a shipped recipe (configs/demo_pretrain.yaml, demo_finetune.yaml, demo_transfer.yaml) run
through the same `train()` as `vitlab train`; the final models are evaluated on the whole test set. Everything
lands on one self-contained HTML page (`report.html`, `vitlab.train.demo_page`) and in `demo.json`.

With `seeds` > 1 the two headline comparisons, fine-tuning at 28 px against the same steps at 16 px and transfer
against scratch, are run again with the recipes' train.seed + 1, + 2, ... (head, data order, augmentation) from the
one pre-trained model, in `finetune-seed{k}/`, `same_resolution-seed{k}/` and `transfer/*-seed{k}/`; the page shows
each seed's difference, their mean ± standard error and the verdict (`vitlab.utils.stats`). The default, one
seed, runs exactly what it ran before.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..analysis.findings import analyze
from ..data import build_eval_data, build_train_stream
from ..inference.evaluate import EvalResult, evaluate
from ..models.config import pixels_per_token
from ..models.vit import VisionTransformer
from ..perf.autotune import machine_key
from ..utils.extras import MissingExtraError
from ..utils.io import write_atomic
from ..utils.stats import arm, verdict
from ..weights import load_model
from . import recipes
from .build import data_config_with_init
from .demo_page import write_page
from .loop import TrainResult, train
from .recipe import Recipe, load_recipe
from .report import read_metrics

CONFIG_DIR = recipes.directory()  # the shipped recipes: package data, linked as configs/ in a checkout
RECIPES = {"pretrain": "demo_pretrain.yaml", "finetune": "demo_finetune.yaml", "transfer": "demo_transfer.yaml"}
TRANSFER_LABELS: tuple[int | None, ...] = (10, None)  # digits labels per class of the transfer runs (None: all)
# Training from scratch on the transfer task: step 1's optimiser (AdamW, its lr and weight decay), not the
# fine-tuning SGD, which is tuned for weights that are already good.
SCRATCH_OVERRIDES = ("init.checkpoint=null", "optim.name=adamw", "optim.lr=3e-3", "optim.weight_decay=0.05")
ANALYSIS_IMAGES = 8
DATASET_NAMES = {"fashion_mnist": "Fashion-MNIST", "digits": "digits"}  # as the page and the CLI name them

log = logging.getLogger(__name__)


def run_demo(out: Path, configs: Path | None = None, overrides: Sequence[str] = (), data_root: str | None = None,
             progress: bool = True, seeds: int = 1) -> dict[str, Any]:
    """Pre-train, fine-tune, transfer, analyse, and write `out/report.html`; returns what `out/demo.json` holds.

    Args:
        out: A new (or empty) folder for the runs, demo.json and report.html.
        configs: Folder holding demo_pretrain.yaml, demo_finetune.yaml and demo_transfer.yaml (default: the
            shipped recipes).
        overrides: `section.key=value` overrides applied to every recipe (e.g. `train.steps=20` for a quick look).
        data_root: Fashion-MNIST IDX folder (default: the recipes' data.root).
        progress: tqdm bars during training.
        seeds: Runs of the two headline comparisons (fine-tune vs control, transfer vs scratch), each with the
            recipes' seed + 0 .. seeds - 1; the pre-training is shared.

    Raises:
        FileNotFoundError: A recipe is missing.
        FileExistsError: `out` exists and is not empty.
        RuntimeError: A training step stopped before completing.
    """
    configs = Path(configs) if configs is not None else CONFIG_DIR
    for name in RECIPES.values():
        if not (configs / name).is_file():
            raise FileNotFoundError(f"{configs / name} not found; pass --configs pointing at a folder holding "
                                    f"{', '.join(RECIPES.values())}")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} already exists and is not empty; choose another -o")
    user = list(overrides)
    fmnist = [*user, *([f"data.root={data_root}"] if data_root else [])]
    t0 = time.perf_counter()
    summary: dict[str, Any] = {"machine": _machine(), "threads": torch.get_num_threads(),
                               "load_average_start": list(os.getloadavg()), "stages_wall_s": {}, "stages_cpu_s": {}}

    pre_recipe = load_recipe(configs / RECIPES["pretrain"], fmnist)
    log.info("[1/4] pre-training at %s px -> %s", pre_recipe.model.overrides.get("img_size"), out / "pretrain")
    pre, pre_test = _stage(pre_recipe, out / "pretrain", progress, summary, "pretrain")
    log.info("      test top-1 %.2f%% (all %d test images)", 100 * pre_test.top1, pre_test.num_samples)

    ft_recipe = load_recipe(configs / RECIPES["finetune"], [*fmnist, f"init.checkpoint={pre['model']}"])
    log.info("[2/4] fine-tuning at %s px, position embeddings resampled (%s) -> %s",
             ft_recipe.model.overrides.get("img_size"), ft_recipe.init.pos_embed_resize, out / "finetune")
    ft, ft_test = _stage(ft_recipe, out / "finetune", progress, summary, "finetune")
    log.info("      test top-1 %.2f%% (all %d test images)", 100 * ft_test.top1, ft_test.num_samples)
    # The control: the same fine-tuning steps, optimiser and data at the pre-training's resolution, so the gain of
    # the higher resolution is measured against spending the same steps without it, not only against step 1.
    low = pre_recipe.model.overrides.get("img_size")
    same_recipe = load_recipe(configs / RECIPES["finetune"],
                              [*fmnist, f"init.checkpoint={pre['model']}", f"model.img_size={low}"])
    log.info("      control: the same %s steps at %s px -> %s", ft["step"], low, out / "same_resolution")
    same, same_test = _stage(same_recipe, out / "same_resolution", progress, summary, "same_resolution")
    log.info("      control test top-1 %.2f%%; higher resolution %+.2f points", 100 * same_test.top1,
             100 * (ft_test.top1 - same_test.top1))

    gains = [ft_test.top1 - same_test.top1]
    for k in range(1, seeds):
        extra = [f"train.seed={ft_recipe.train.seed + k}"]
        _, ft_k = _stage(load_recipe(configs / RECIPES["finetune"], [*fmnist, f"init.checkpoint={pre['model']}",
                                                                     *extra]), out / f"finetune-seed{k}", progress,
                         summary, f"finetune-seed{k}")
        _, same_k = _stage(load_recipe(configs / RECIPES["finetune"], [*fmnist, f"init.checkpoint={pre['model']}",
                                                                       f"model.img_size={low}", *extra]),
                           out / f"same_resolution-seed{k}", progress, summary, f"same_resolution-seed{k}")
        gains.append(ft_k.top1 - same_k.top1)
        log.info("      seed +%d: fine-tune %.2f%% vs control %.2f%% (%+.2f points)", k, 100 * ft_k.top1,
                 100 * same_k.top1, 100 * gains[-1])

    log.info("[3/4] transfer to digits: pre-trained vs from scratch -> %s", out / "transfer")
    t, c = time.perf_counter(), time.process_time()
    transfer = run_transfer(configs / RECIPES["transfer"], user, str(pre["model"]), out / "transfer", progress,
                            seeds=seeds)
    _timed(summary, "transfer", t, c)

    log.info("[4/4] analysis of the fine-tuned model, report")
    t, c = time.perf_counter(), time.process_time()
    model = load_model(str(ft["model"]))
    if not isinstance(model, VisionTransformer):
        raise RuntimeError(f"the demo's fine-tuned model is a {type(model).__name__}, not a VisionTransformer")
    images = _first_images(ft_recipe, model, ANALYSIS_IMAGES)
    analysis = analyze(model, images, batch_size=ANALYSIS_IMAGES, layer_maps=[0], source="vitlab demo")
    summary.update(dataset=DATASET_NAMES.get(str(pre_recipe.data.get("dataset")), str(pre_recipe.data.get("dataset"))),
                   pretrain=_brief(pre, pre_test, pre_recipe), finetune=_brief(ft, ft_test, ft_recipe),
                   same_resolution=_brief(same, same_test, same_recipe), model=_model_words(model.cfg),
                   resolution_gain={"over_pretrain": ft_test.top1 - pre_test.top1,
                                    "over_same_steps_at_low_resolution": ft_test.top1 - same_test.top1},
                   transfer=transfer, findings=analysis.findings,
                   seed_spread=seed_spread(gains, transfer, seeds))
    summary["load_average_end"] = list(os.getloadavg())
    summary["report"] = str(out / "report.html")
    _timed(summary, "analysis", t, c)
    summary["wall_time_s"] = time.perf_counter() - t0  # up to the page (drawing and writing it: ~2 s more)
    write_page(out / "report.html", summary, analysis)
    write_atomic(out / "demo.json", lambda p: p.write_text(json.dumps(summary, indent=2) + "\n"), overwrite=True)
    return summary


def _stage(recipe: Recipe, run_dir: Path, progress: bool, summary: dict[str, Any],
           name: str) -> tuple[TrainResult, EvalResult]:
    """Train one recipe, then evaluate its final model on the whole eval split (the run's own evaluations may
    use a subset: `train.eval_max_samples`)."""
    t, c = time.perf_counter(), time.process_time()
    result = train(recipe, run_dir, progress=progress)
    _check(result)
    test = full_evaluation(recipe, result)
    _timed(summary, name, t, c)
    return result, test


def _timed(summary: dict[str, Any], name: str, wall0: float, cpu0: float) -> None:
    """Record a step's wall time and this process's CPU time (all threads): on a busy machine the CPU time is
    close to what the step costs, the wall time is not."""
    summary["stages_wall_s"][name] = time.perf_counter() - wall0
    summary["stages_cpu_s"][name] = time.process_time() - cpu0


def full_evaluation(recipe: Recipe, result: TrainResult) -> EvalResult:
    """The run's final model on every image of its eval split, prepared as the run prepared them."""
    model = load_model(str(result["model"]))
    data = build_eval_data(data_config_with_init(recipe), recipe.train.eval_split, img_size=model.cfg.img_size,
                           in_chans=model.cfg.in_chans, batch_size=recipe.train.eval_batch_size or 500)
    return evaluate(model, data, model.cfg.num_classes, precision=recipe.train.precision,
                    class_names=list(data.classes))


def run_transfer(recipe_path: Path, overrides: Sequence[str], checkpoint: str, out: Path,
                 progress: bool, seeds: int = 1) -> dict[str, Any]:
    """The transfer recipe from `checkpoint` and from scratch, for each label budget of `TRANSFER_LABELS`; with
    `seeds` > 1 each again with the recipe's seed + 1, + 2, ... (`*-seed{k}/`; their top-1 in "seeds").

    Returns:
        {"dataset", "runs": [{"labels_per_class", "train_images", "pretrained": {..., "seeds": [top-1 per seed]},
        "scratch": {...}}]}, or {"skipped": why} when the transfer data set needs an extra that is not installed.
    """
    runs = []
    dataset = None
    try:
        for labels in TRANSFER_LABELS:
            budget = [f"data.labels_per_class={labels}"] if labels else []
            row: dict[str, Any] = {"labels_per_class": labels or "all"}
            for kind, extra in (("pretrained", [f"init.checkpoint={checkpoint}"]), ("scratch", SCRATCH_OVERRIDES)):
                recipe = load_recipe(recipe_path, [*overrides, *budget, *extra])
                dataset = recipe.data.get("dataset")
                result = train(recipe, out / f"{kind}_{labels or 'all'}", progress=progress)
                _check(result)
                ev = result["eval"]
                row[kind] = {"top1": ev["top1"], "steps": result["step"], "optimizer": recipe.optim.name,
                             "lr": recipe.optim.lr, "curve": _curve(result, recipe.train.batch_size),
                             "seeds": [ev["top1"]]}
                for k in range(1, seeds):
                    again = load_recipe(recipe_path, [*overrides, *budget, *extra,
                                                      f"train.seed={recipe.train.seed + k}"])
                    r_k = train(again, out / f"{kind}_{labels or 'all'}-seed{k}", progress=progress)
                    _check(r_k)
                    row[kind]["seeds"].append(r_k["eval"]["top1"])
                row["train_images"] = _train_size(recipe)
                row["test_images"] = ev["num_samples"]
                log.info("      %s, %s labels per class: %s %s", dataset, labels or "all", kind,
                         " / ".join(f"{100 * x:.2f}%" for x in row[kind]["seeds"]))
            runs.append(row)
    except MissingExtraError as e:
        log.warning("transfer step skipped: %s", e)
        return {"skipped": str(e)}
    return {"dataset": dataset, "runs": runs}


def seed_spread(gains: list[float], transfer: dict[str, Any], seeds: int) -> dict[str, Any] | None:
    """The two headline differences over the seeds (None with one seed): each seed's difference (fine-tune minus
    the control at the pre-training's resolution; pre-trained minus scratch per label budget, seed k against seed k),
    their mean, the standard error of the mean (`vitlab.utils.stats.arm`) and the verdict ("yes" when the mean is 2
    standard errors above zero, "no" 2 below, else "within noise")."""
    if seeds < 2:
        return None

    def one(diffs: list[float]) -> dict[str, Any]:
        e = arm(diffs)
        return {"values": diffs, "mean": e.mean, "se": e.se, "verdict": verdict(e.mean, e.se)}

    out: dict[str, Any] = {"seeds": seeds, "resolution_gain": one(gains), "transfer": {}}
    for row in transfer.get("runs", []):
        p, s = row["pretrained"]["seeds"], row["scratch"]["seeds"]
        out["transfer"][str(row["labels_per_class"])] = one([a - b for a, b in zip(p, s)])
    return out


def _train_size(recipe: Recipe) -> int:
    """Training images the recipe's data set gives (after class / label-budget selection)."""
    stream = build_train_stream(data_config_with_init(recipe), img_size=8, in_chans=1, batch_size=1, seed=0)
    return int(stream.epoch_size)


def _first_images(recipe: Recipe, model: VisionTransformer, n: int) -> torch.Tensor:
    """The first `n` eval images (normalised, at the model's size): the analysis's inputs."""
    cfg = model.cfg
    data = build_eval_data(data_config_with_init(recipe), recipe.train.eval_split, img_size=cfg.img_size,
                           in_chans=cfg.in_chans, batch_size=n)
    x, _ = next(iter(data))
    return x[:n]


def _check(s: TrainResult) -> None:
    if not s["status"].startswith("completed"):
        raise RuntimeError(f"demo step stopped: {s['status']} at step {s['step']}")


def _curve(result: TrainResult, batch_size: int) -> list[dict[str, Any]]:
    """The run's evaluations along training: step, images seen, top-1, and how many test images each used."""
    rows = read_metrics(Path(result["run_dir"]) / "metrics.jsonl")
    split = f"eval_{result['eval_split'] or 'test'}"
    return [{"step": r["step"], "images": r["step"] * batch_size, "top1": r["top1"]}
            for r in rows if r.get("split") == split]


def _brief(s: TrainResult, test: EvalResult, recipe: Recipe) -> dict[str, Any]:
    cfg = recipe.model.vit_config(num_classes=len(test.classes) or 10)
    grid = cfg.grid_size
    return {"top1": test.top1, "top5": test.top5, "test_images": test.num_samples,
            "per_class": dict(test.per_class), "steps": s["step"], "batch_size": recipe.train.batch_size,
            "images": s["images_seen"], "train_time_s": s["train_time_s"], "status": s["status"],
            "precision": s["precision"], "images_per_s": s["images_per_s"], "img_size": cfg.img_size,
            "tokens": grid[0] * grid[1], "grid": list(grid), "optimizer": recipe.optim.name, "lr": recipe.optim.lr,
            "curve": _curve(s, recipe.train.batch_size), "curve_samples": recipe.train.eval_max_samples,
            "model": s["model"], "run_dir": s["run_dir"]}


def _machine() -> str:
    """The CPU (or GPU) this ran on, as `vitlab.perf.autotune` keys its measurements."""
    return machine_key()


def _model_words(cfg: Any) -> str:
    """One sentence naming the demo's model from its config (the page describes what ran, not what was planned)."""
    body = (f"a {cfg.depth}-block Transformer (D={cfg.embed_dim}, {cfg.num_heads} heads, MLP {cfg.mlp_dim}, "
            f"{'global average pooling' if cfg.pool == 'gap' else 'class token'})")
    if cfg.hybrid_layers is None:
        return f"a ViT on {cfg.patch_size}x{cfg.patch_size} pixel patches and {body}"
    stages = len(cfg.hybrid_layers)
    stride = pixels_per_token(cfg.patch_size, cfg.hybrid_layers)
    return (f"a hybrid ViT (paper Sec. 3.1): a {stages}-stage BiT ResNet (weight-standardised convolutions, GroupNorm, "
            f"stem width {cfg.hybrid_width}) whose stride-{stride} feature map gives one token per {stride}x{stride} "
            f"pixels to {body}")
