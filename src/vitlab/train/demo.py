"""`vitlab demo` (what `make demo` runs): pre-train a ViT on Fashion-MNIST on the CPU, fine-tune it at a higher
resolution with interpolated position embeddings (paper Sec. 3.2), evaluate both, write one report.

The two steps are the shipped recipes configs/fmnist_pretrain.yaml and configs/fmnist_finetune.yaml, run through
the same `train()` as `vitlab train`; sized for ~10 minutes on 2 idle CPU cores.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .. import recipes
from .checkpoint import atomic_write
from .loop import TrainResult, train
from .recipe import load_recipe

CONFIG_DIR = recipes.directory()  # the shipped recipes: package data, linked as configs/ in a checkout

log = logging.getLogger(__name__)


def run_demo(out: Path, configs: Path | None = None, overrides: Sequence[str] = (), data_root: str | None = None,
             progress: bool = True) -> dict[str, Any]:
    """Pre-train, fine-tune, and write `out/report.md`; returns the summary written to `out/demo.json`.

    Args:
        out: A new (or empty) folder for both runs, demo.json and report.md.
        configs: Folder holding fmnist_pretrain.yaml and fmnist_finetune.yaml (default: the shipped recipes).
        overrides: `section.key=value` overrides applied to both recipes.
        data_root: Fashion-MNIST IDX folder (default: the recipes' data.root).
        progress: tqdm bars during training.

    Raises:
        FileNotFoundError: A recipe is missing.
        FileExistsError: `out` exists and is not empty.
        RuntimeError: A training step stopped before completing.
    """
    configs = Path(configs) if configs is not None else CONFIG_DIR
    for name in ("fmnist_pretrain.yaml", "fmnist_finetune.yaml"):
        if not (configs / name).is_file():
            raise FileNotFoundError(f"{configs / name} not found; pass --configs pointing at a folder holding both")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} already exists and is not empty; choose another -o")
    extra = list(overrides) + ([f"data.root={data_root}"] if data_root else [])
    t0 = time.perf_counter()
    log.info("[1/2] pre-training on Fashion-MNIST at 28 px -> %s", out / "pretrain")
    pre = train(load_recipe(configs / "fmnist_pretrain.yaml", extra), out / "pretrain", progress=progress)
    _check(pre)
    log.info("      test top-1 %.2f%%", 100 * pre["eval"]["top1"])
    ft_recipe = load_recipe(configs / "fmnist_finetune.yaml", [*extra, f"init.checkpoint={pre['model']}"])
    size = ft_recipe.model.overrides.get("img_size")
    log.info("[2/2] fine-tuning at %s px, position embeddings resampled (%s) -> %s", size,
             ft_recipe.init.pos_embed_resize, out / "finetune")
    ft = train(ft_recipe, out / "finetune", progress=progress)
    _check(ft)
    log.info("      test top-1 %.2f%%", 100 * ft["eval"]["top1"])
    summary = {"pretrain": _brief(pre), "finetune": _brief(ft), "wall_time_s": time.perf_counter() - t0,
               "threads": torch.get_num_threads()}
    atomic_write(out / "demo.json", lambda p: p.write_text(json.dumps(summary, indent=2) + "\n"))
    atomic_write(out / "report.md", lambda p: p.write_text(_markdown(summary, pre, ft), encoding="utf-8"))
    return summary


def _check(s: TrainResult) -> None:
    if not s["status"].startswith("completed"):
        raise RuntimeError(f"demo step stopped: {s['status']} at step {s['step']}")


def _brief(s: TrainResult) -> dict[str, Any]:
    return {"top1": s["eval"]["top1"], "top5": s["eval"]["top5"], "steps": s["step"], "images": s["images_seen"],
            "train_time_s": s["train_time_s"], "model": s["model"], "report": s["report"]}


def _markdown(summary: dict[str, Any], pre: TrainResult, ft: TrainResult) -> str:
    p, f = summary["pretrain"], summary["finetune"]
    rows = [("pre-train, 28 px (7x7 patches)", p), ("fine-tune, 40 px (10x10 patches)", f)]
    lines = ["# vitlab demo: Fashion-MNIST pre-training and higher-resolution fine-tuning", "",
             "| stage | test top-1 | test top-5 | steps | images | training time |", "|---|---|---|---|---|---|"]
    lines += [f"| {name} | {100 * s['top1']:.2f}% | {100 * s['top5']:.2f}% | {s['steps']} | {s['images']} | "
              f"{s['train_time_s'] / 60:.1f} min |" for name, s in rows]
    lines += ["", f"Total wall time {summary['wall_time_s'] / 60:.1f} min on {summary['threads']} threads.", "",
              "Per-class test accuracy after fine-tuning:", "", "| class | pre-train | fine-tune |", "|---|---|---|"]
    for c, a in ft["eval"]["per_class"].items():
        lines.append(f"| {c} | {100 * pre['eval']['per_class'].get(c, float('nan')):.1f}% | {100 * a:.1f}% |")
    lines += ["", "Curves: [pre-train](pretrain/curves.png), [fine-tune](finetune/curves.png). Details: "
              "[pre-train report](pretrain/report.md), [fine-tune report](finetune/report.md).", "",
              "![pre-train](pretrain/curves.png)", "", "![fine-tune](finetune/curves.png)", ""]
    return "\n".join(lines)

