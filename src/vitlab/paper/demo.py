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

It runs through the same code as `vitlab reproduce`: each training step is a shipped recipe (configs/
demo_pretrain.yaml, demo_finetune.yaml, demo_transfer.yaml) trained as a sub-run (`vitlab.paper.subrun`: a `vitlab
train` run directory), the transfer is the transfer experiment's task (`vitlab.paper.transfer.finetune_vs_scratch`)
and the page is its report (`vitlab.paper.report.write_report`: report.html, the numbers in demo.json, a PNG and JSON
per figure; the page's content is `vitlab.paper.demo_page`). The final models of steps 1-2 are evaluated on the whole
test set.

With `seeds` > 1 the two headline comparisons, fine-tuning at 28 px against the same steps at 16 px and transfer
against scratch, are run again with the recipes' train.seed + 1, + 2, ... (head, data order, augmentation) from the
one pre-trained model, in `finetune-seed{k}/`, `same_resolution-seed{k}/` and `transfer/*-seed{k}/`; the page shows
each seed's difference, their mean ± standard error and the verdict (`vitlab.paper.stats`). The default, one seed,
runs exactly what it ran before.

    from vitlab.paper.demo import run_demo
    summary = run_demo(Path("runs/demo"))   # runs/demo/report.html, runs/demo/demo.json
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from ..analysis.findings import AnalysisResult, analyze
from ..data import build_eval_data, build_train_stream
from ..inference.evaluate import EvalResult, evaluate
from ..models.vit import VisionTransformer
from ..perf.cpu import machine_summary
from ..train import recipes
from ..train.build import data_config_with_init
from ..train.recipe import Recipe, load_recipe
from ..train.report import read_metrics
from ..utils.extras import MissingExtraError
from ..weights import load_model
from . import demo_page
from .stats import arm, seed_name, verdict
from .subrun import SubRunResult, run_or_resume
from .transfer import finetune_vs_scratch, label_name

__all__ = ["run_demo"]

CONFIG_DIR = recipes.directory()  # the shipped recipes: package data, linked as configs/ in a checkout
RECIPES = {"pretrain": "demo_pretrain.yaml", "finetune": "demo_finetune.yaml", "transfer": "demo_transfer.yaml"}
TRANSFER_LABELS: tuple[int | None, ...] = (10, None)  # digits labels per class of the transfer runs (None: all)
TRANSFER_DIRS = {"finetune": "pretrained", "scratch": "scratch"}  # `transfer.ARMS` as the demo's folders name them
# Training from scratch on the transfer task: step 1's optimiser (AdamW, its lr and weight decay), not the
# fine-tuning SGD, which is tuned for weights that are already good.
SCRATCH_OVERRIDES = ("init.checkpoint=null", "optim.name=adamw", "optim.lr=3e-3", "optim.weight_decay=0.05")
ANALYSIS_IMAGES = 8
DATASET_NAMES = {"fashion_mnist": "Fashion-MNIST", "digits": "digits"}  # as the page and the CLI name them

log = logging.getLogger(__name__)


class _Demo:
    """The demo's folder, recipes and overrides, and the time each step took (wall and this process's CPU)."""

    def __init__(self, out: Path, configs: Path, overrides: list[str], data_root: str | None,
                 progress: bool) -> None:
        self.out, self.configs, self.user, self.progress = out, configs, overrides, progress
        self.fmnist = [*overrides, *([f"data.root={data_root}"] if data_root else [])]  # steps 1-2's data
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    def recipe(self, name: str, *extra: str) -> Recipe:
        """A Fashion-MNIST recipe (pretrain, finetune) with the user's overrides, then `extra`."""
        return load_recipe(self.configs / RECIPES[name], [*self.fmnist, *extra])

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Record a step's wall time and this process's CPU time (all threads): on a busy machine the CPU time is
        close to what the step costs, the wall time is not."""
        wall, cpu = time.perf_counter(), time.process_time()
        yield
        self.wall[name], self.cpu[name] = time.perf_counter() - wall, time.process_time() - cpu

    def stage(self, name: str, recipe: Recipe) -> tuple[SubRunResult, EvalResult]:
        """Train one recipe as the sub-run `name`, then evaluate its final model on the whole eval split (the run's
        own evaluations may use a subset: the classification evaluator's max_samples)."""
        with self.timed(name):
            run = run_or_resume(name, recipe, self.out / name, progress=self.progress)
            return run, full_evaluation(recipe, run.model)


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
        KeyboardInterrupt: A training step stopped before completing (Ctrl-C, SIGTERM).
    """
    t0 = time.perf_counter()
    demo = _Demo(out, _recipe_folder(configs), list(overrides), data_root, progress)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} already exists and is not empty; choose another -o")
    machine = machine_summary()
    start = {"machine": machine, "threads": torch.get_num_threads(), "load_average_start": machine["loadavg_start"]}

    pre_recipe = demo.recipe("pretrain")
    low = pre_recipe.model.overrides.get("img_size")
    log.info("[1/4] pre-training at %s px -> %s", low, out / "pretrain")
    pre, pre_test = demo.stage("pretrain", pre_recipe)
    log.info("      test top-1 %.2f%% (all %d test images)", 100 * pre_test.top1, pre_test.num_samples)

    ft_recipe = demo.recipe("finetune", f"init.checkpoint={pre.model}")
    log.info("[2/4] fine-tuning at %s px, position embeddings resampled (%s) -> %s",
             ft_recipe.model.overrides.get("img_size"), ft_recipe.init.pos_embed_resize, out / "finetune")
    ft, ft_test = demo.stage("finetune", ft_recipe)
    log.info("      test top-1 %.2f%% (all %d test images)", 100 * ft_test.top1, ft_test.num_samples)
    # The control: the same fine-tuning steps, optimiser and data at the pre-training's resolution, so the gain of
    # the higher resolution is measured against spending the same steps without it, not only against step 1.
    same_recipe = demo.recipe("finetune", f"init.checkpoint={pre.model}", f"model.img_size={low}")
    log.info("      control: the same %s steps at %s px -> %s", ft.steps, low, out / "same_resolution")
    same, same_test = demo.stage("same_resolution", same_recipe)
    log.info("      control test top-1 %.2f%%; higher resolution %+.2f points", 100 * same_test.top1,
             100 * (ft_test.top1 - same_test.top1))
    gains = [ft_test.top1 - same_test.top1, *_resolution_seeds(demo, pre.model, low, ft_recipe.train.seed, seeds)]

    log.info("[3/4] transfer to digits: pre-trained vs from scratch -> %s", out / "transfer")
    with demo.timed("transfer"):
        transfer = run_transfer(demo.configs / RECIPES["transfer"], demo.user, pre.model, out / "transfer",
                                progress, seeds=seeds)

    log.info("[4/4] analysis of the fine-tuned model, report")
    with demo.timed("analysis"):
        model, analysis = _analysis(ft.model, ft_recipe)
    dataset = str(pre_recipe.data.get("dataset"))
    summary = {**start, "stages_wall_s": demo.wall, "stages_cpu_s": demo.cpu,
               "dataset": DATASET_NAMES.get(dataset, dataset), "pretrain": _brief(pre, pre_test, pre_recipe),
               "finetune": _brief(ft, ft_test, ft_recipe), "same_resolution": _brief(same, same_test, same_recipe),
               "model": demo_page.model_words(model.cfg),
               "resolution_gain": {"over_pretrain": ft_test.top1 - pre_test.top1,
                                   "over_same_steps_at_low_resolution": ft_test.top1 - same_test.top1},
               "transfer": transfer, "findings": analysis.findings, "seed_spread": seed_spread(gains, transfer, seeds),
               "load_average_end": list(os.getloadavg()), "report": str(out / "report.html"),
               "wall_time_s": time.perf_counter() - t0}  # up to the page (drawing and writing it: ~2 s more)
    demo_page.write(out, summary, analysis)
    return summary


def _recipe_folder(configs: Path | None) -> Path:
    folder = Path(configs) if configs is not None else CONFIG_DIR
    for name in RECIPES.values():
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder / name} not found; pass --configs pointing at a folder holding "
                                    f"{', '.join(RECIPES.values())}")
    return folder


def _resolution_seeds(demo: _Demo, pretrained: str, low: Any, seed: int, seeds: int) -> list[float]:
    """Fine-tuning minus the control again with the recipe's seed + 1 .. seeds - 1 (both on the whole test set)."""
    gains = []
    for k in range(1, seeds):
        extra = (f"init.checkpoint={pretrained}", f"train.seed={seed + k}")
        _, ft = demo.stage(seed_name("finetune", k), demo.recipe("finetune", *extra))
        _, same = demo.stage(seed_name("same_resolution", k), demo.recipe("finetune", *extra, f"model.img_size={low}"))
        gains.append(ft.top1 - same.top1)
        log.info("      seed +%d: fine-tune %.2f%% vs control %.2f%% (%+.2f points)", k, 100 * ft.top1,
                 100 * same.top1, 100 * gains[-1])
    return gains


def full_evaluation(recipe: Recipe, model_path: str) -> EvalResult:
    """The run's final model on every image of its eval split, prepared as the run prepared them."""
    model = load_model(model_path)
    ev = recipe.train.evaluation
    data = build_eval_data(data_config_with_init(recipe), ev.split, img_size=model.cfg.img_size,
                           in_chans=model.cfg.in_chans, batch_size=ev.batch_size or 500)
    return evaluate(model, data, model.cfg.num_classes, precision=recipe.train.precision,
                    class_names=list(data.classes))


def run_transfer(recipe_path: Path, overrides: Sequence[str], checkpoint: str, out: Path,
                 progress: bool, seeds: int = 1) -> dict[str, Any]:
    """The transfer recipe from `checkpoint` and from scratch (`transfer.finetune_vs_scratch`), for each label budget
    of `TRANSFER_LABELS`, in `out/{pretrained,scratch}_{labels}`; with `seeds` > 1 each again with the recipe's
    seed + 1, + 2, ... (`*-seed{k}/`; their top-1 in "seeds").

    Returns:
        {"dataset", "runs": [{"labels_per_class", "train_images", "test_images", "pretrained": {"top1", "steps",
        "optimizer", "lr", "curve", "seeds": [top-1 per seed]}, "scratch": {...}}]}, or {"skipped": why} when the
        transfer data set needs an extra that is not installed.
    """
    runs = []
    dataset = None
    try:
        for labels in TRANSFER_LABELS:
            recipe = _transfer_recipes(recipe_path, overrides, checkpoint, labels)
            got = finetune_vs_scratch(out, _transfer_dir(labels), recipe, seeds, progress=progress)
            row: dict[str, Any] = {"labels_per_class": labels or "all"}
            for how, results in got.items():
                first = recipe(how, 0)
                dataset = first.data.get("dataset")
                row[TRANSFER_DIRS[how]] = {"top1": results[0].top1, "steps": results[0].steps,
                                           "optimizer": first.optim.name, "lr": first.optim.lr,
                                           "curve": _curve(results[0], first), "seeds": [r.top1 for r in results]}
                row.update(train_images=_train_size(first), test_images=results[0].test_images)
                log.info("      %s, %s labels per class: %s %s", dataset, labels or "all", TRANSFER_DIRS[how],
                         " / ".join(f"{100 * r.top1:.2f}%" for r in results))
            runs.append(row)
    except MissingExtraError as e:
        log.warning("transfer step skipped: %s", e)
        return {"skipped": str(e)}
    return {"dataset": dataset, "runs": runs}


def _transfer_dir(labels: int | None) -> Callable[[str], str]:
    """The sub-run folder of an arm at a label budget: "pretrained_10", "scratch_all" (`TRANSFER_DIRS`)."""
    return lambda how: f"{TRANSFER_DIRS[how]}_{label_name(labels)}"


def _transfer_recipes(path: Path, overrides: Sequence[str], checkpoint: str,
                      labels: int | None) -> Callable[[str, int], Recipe]:
    """The transfer recipe of an arm ("finetune": from `checkpoint`; "scratch": step 1's optimiser,
    `SCRATCH_OVERRIDES`) and a seed (k > 0: the recipe's train.seed + k) at `labels` labels per class (None: all)."""
    budget = [f"data.labels_per_class={labels}"] if labels else []
    arms = {"finetune": [f"init.checkpoint={checkpoint}"], "scratch": list(SCRATCH_OVERRIDES)}

    def recipe(how: str, seed: int) -> Recipe:
        r = load_recipe(path, [*overrides, *budget, *arms[how]])
        return load_recipe(path, [*overrides, *budget, *arms[how], f"train.seed={r.train.seed + seed}"]) if seed else r

    return recipe


def seed_spread(gains: list[float], transfer: dict[str, Any], seeds: int) -> dict[str, Any] | None:
    """The two headline differences over the seeds (None with one seed): each seed's difference (fine-tune minus
    the control at the pre-training's resolution; pre-trained minus scratch per label budget, seed k against seed k),
    their mean, the standard error of the mean (`vitlab.paper.stats.arm`) and the verdict ("yes" when the mean is 2
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


def _analysis(model_path: str, recipe: Recipe) -> tuple[VisionTransformer, AnalysisResult]:
    """`vitlab.analysis` of the fine-tuned model on the first `ANALYSIS_IMAGES` eval images."""
    model = load_model(model_path)
    if not isinstance(model, VisionTransformer):
        raise RuntimeError(f"the demo's fine-tuned model is a {type(model).__name__}, not a VisionTransformer")
    cfg = model.cfg
    data = build_eval_data(data_config_with_init(recipe), recipe.train.evaluation.split, img_size=cfg.img_size,
                           in_chans=cfg.in_chans, batch_size=ANALYSIS_IMAGES)
    images = next(iter(data))[0][:ANALYSIS_IMAGES]
    return model, analyze(model, images, batch_size=ANALYSIS_IMAGES, layer_maps=[0], source="vitlab demo")


def _train_size(recipe: Recipe) -> int:
    """Training images the recipe's data set gives (after class / label-budget selection)."""
    stream = build_train_stream(data_config_with_init(recipe), img_size=8, in_chans=1, batch_size=1, seed=0)
    return int(stream.epoch_size)


def _curve(run: SubRunResult, recipe: Recipe) -> list[dict[str, Any]]:
    """The run's evaluations along training: step, images seen and top-1 (on the evaluator's max_samples)."""
    rows = read_metrics(Path(run.run_dir) / "metrics.jsonl")
    split = recipe.train.evaluation.row_split
    return [{"step": r["step"], "images": r["step"] * recipe.train.batch_size, "top1": r["top1"]}
            for r in rows if r.get("split") == split]


def _brief(run: SubRunResult, test: EvalResult, recipe: Recipe) -> dict[str, Any]:
    """A Fashion-MNIST stage as demo.json and the page give it: its final model on the whole test set, its recipe
    and its eval curve."""
    cfg = load_model(run.model).cfg
    grid = cfg.grid_size
    return {"top1": test.top1, "top5": test.top5, "test_images": test.num_samples,
            "per_class": dict(test.per_class), "steps": run.steps, "batch_size": recipe.train.batch_size,
            "images": run.images_seen, "train_time_s": run.train_time_s, "status": run.status,
            "precision": run.precision, "images_per_s": run.images_per_s, "img_size": cfg.img_size,
            "tokens": grid[0] * grid[1], "grid": list(grid), "optimizer": recipe.optim.name, "lr": recipe.optim.lr,
            "curve": _curve(run, recipe), "curve_samples": recipe.train.evaluation.max_samples,
            "model": run.model, "run_dir": run.run_dir}
