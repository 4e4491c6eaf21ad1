"""`vitlab demo` (what `make demo` runs): pre-train a ViT on Fashion-MNIST on the CPU, fine-tune it at a higher
resolution with interpolated position embeddings (paper Sec. 3.2), evaluate both, write one report.

The two steps are the shipped recipes configs/fmnist_pretrain.yaml and configs/fmnist_finetune.yaml, run through
the same `train()` as `vitlab train`; sized for ~10 minutes on 2 idle CPU cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from .checkpoint import atomic_write
from .loop import train
from .recipe import load_recipe

CONFIG_DIR = Path(__file__).resolve().parents[3] / "configs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", default=None, help="demo directory (default: runs/demo-<date-time>)")
    p.add_argument("--configs", default=str(CONFIG_DIR), help="folder holding fmnist_pretrain/finetune.yaml")
    p.add_argument("--data-root", default=None, help="Fashion-MNIST IDX folder (default: Debian's location)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="SECTION.KEY=VALUE",
                   help="override both recipes, e.g. --set train.steps=20 for a quick look (one or more; repeatable)")
    p.add_argument("--no-progress", action="store_true")


def run_demo(out: Path, configs: Path, overrides: list[str], data_root: str | None = None,
             progress: bool = True) -> dict[str, Any]:
    """Pre-train, fine-tune, and write `out/report.md`; returns the summary written to `out/demo.json`."""
    for name in ("fmnist_pretrain.yaml", "fmnist_finetune.yaml"):
        if not (configs / name).is_file():
            raise FileNotFoundError(f"{configs / name} not found; pass --configs pointing at the repo's configs/")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} already exists and is not empty; choose another -o")
    extra = list(overrides) + ([f"data.root={data_root}"] if data_root else [])
    t0 = time.perf_counter()
    print(f"[1/2] pre-training on Fashion-MNIST at 28 px -> {out / 'pretrain'}", flush=True)
    pre = train(load_recipe(configs / "fmnist_pretrain.yaml", extra), out / "pretrain", progress=progress)
    _check(pre)
    print(f"      test top-1 {100 * pre['eval']['top1']:.2f}%", flush=True)
    ft_recipe = load_recipe(configs / "fmnist_finetune.yaml", [*extra, f"init.checkpoint={pre['model']}"])
    size = ft_recipe.model.overrides.get("img_size")
    print(f"[2/2] fine-tuning at {size} px, position embeddings resampled "
          f"({ft_recipe.init.pos_embed_resize}) -> {out / 'finetune'}", flush=True)
    ft = train(ft_recipe, out / "finetune", progress=progress)
    _check(ft)
    print(f"      test top-1 {100 * ft['eval']['top1']:.2f}%", flush=True)
    summary = {"pretrain": _brief(pre), "finetune": _brief(ft), "wall_time_s": time.perf_counter() - t0,
               "threads": torch.get_num_threads()}
    atomic_write(out / "demo.json", lambda p: p.write_text(json.dumps(summary, indent=2) + "\n"))
    atomic_write(out / "report.md", lambda p: p.write_text(_markdown(summary, pre, ft), encoding="utf-8"))
    return summary


def _check(s: dict[str, Any]) -> None:
    if not s["status"].startswith("completed"):
        raise RuntimeError(f"demo step stopped: {s['status']} at step {s['step']}")


def _brief(s: dict[str, Any]) -> dict[str, Any]:
    return {"top1": s["eval"]["top1"], "top5": s["eval"]["top5"], "steps": s["step"], "images": s["images_seen"],
            "train_time_s": s["train_time_s"], "model": s["model"], "report": s["report"]}


def _markdown(summary: dict[str, Any], pre: dict[str, Any], ft: dict[str, Any]) -> str:
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


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.output or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S"))
    try:
        summary = run_demo(out, Path(args.configs), args.overrides, args.data_root, progress=not args.no_progress)
    except (FileNotFoundError, FileExistsError, ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"\npre-train {100 * summary['pretrain']['top1']:.2f}% -> fine-tune "
          f"{100 * summary['finetune']['top1']:.2f}% test top-1 in {summary['wall_time_s'] / 60:.1f} min")
    print(f"report: {out / 'report.md'}")
    return 0
