"""The run report: training curves as PNG (matplotlib, no display needed) and the final numbers as JSON and
Markdown, all read back from metrics.jsonl so a resumed run's report covers the whole run."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any, TextIO

from ..utils.extras import needs
from ..utils.io import write_atomic

logger = logging.getLogger("vitlab.train")


def open_metrics(path: str | Path, resumed_at: int | None = None, *, again_at_step: Collection[str] = ()) -> TextIO:
    """metrics.jsonl opened for appending.

    A run that goes on from its checkpoint of step `resumed_at` logs the steps after it again: the rows an earlier
    process wrote for them (after that checkpoint, before it was stopped) are dropped first, as TensorBoard's
    `purge_step` drops their events, so that each step's row is in the file once, in order. Rows at `resumed_at`
    itself were written before its checkpoint and stay, except those of the splits `again_at_step` (a run resumed
    at its last step evaluates again). A line that is not a JSON row (torn by a kill mid-write) goes too.
    A torn row left at the end otherwise is ended first, so that the next row starts a line of its own.
    """
    p = Path(path)
    if resumed_at is not None and p.is_file():
        _drop_replayed(p, resumed_at, set(again_at_step))
    torn = False
    if p.is_file() and p.stat().st_size:
        with open(p, "rb") as tail:
            tail.seek(-1, os.SEEK_END)
            torn = tail.read(1) != b"\n"
    f = open(p, "a", encoding="utf-8")  # noqa: SIM115 (the caller closes it)
    if torn:
        f.write("\n")
    return f


def _drop_replayed(path: Path, resumed_at: int, again_at_step: set[str]) -> None:
    """Rewrite metrics.jsonl (atomically) without the rows a run resumed at step `resumed_at` writes again."""

    def replayed(line: str) -> bool:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            return True  # a row torn by a kill mid-write: the last one written, after the checkpoint
        if not isinstance(row, dict) or not isinstance(row.get("step"), int) or isinstance(row["step"], bool):
            return False
        step = row["step"]
        return step > resumed_at or (step == resumed_at and str(row.get("split", "train")) in again_at_step)

    lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    kept = [line for line in lines if not replayed(line)]
    if len(kept) < len(lines):
        write_atomic(path, "".join(line + "\n" for line in kept), overwrite=True)
        logger.info("%s: dropped %d rows logged after the checkpoint of step %d (this run logs them again)", path,
                    len(lines) - len(kept), resumed_at)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a run's metrics.jsonl as every reader should see them (the report, the curves, `train`'s
    result): one row per (split, step), in step order.

    A resumed run replays the steps after its checkpoint and appends their rows again (`open_metrics` drops the
    earlier ones first; in a file from before it did, or a copy merged by hand): the row written last wins.
    A line torn by a kill mid-write (or anything else that is not a JSON object with an integer step) is skipped.
    """
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    p = Path(path)
    if not p.is_file():
        return []
    for line in p.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(row, dict) or not isinstance(row.get("step"), int) or isinstance(row["step"], bool):
            continue
        row.setdefault("split", "train")
        rows[(str(row["split"]), row["step"])] = row
    return sorted(rows.values(), key=lambda r: (r["step"], str(r["split"])))


def _median(values: list[float]) -> float | None:
    return sorted(values)[len(values) // 2] if values else None


def speed_and_evaluators(rows: list[dict[str, Any]]) -> tuple[float | None, float | None, dict[str, dict[str, Any]]]:
    """(median images/s, median MFU, the last row of each evaluator by name) of a run's metrics rows. The first
    training row is left out of the medians when there are others (it carries the warm-up)."""
    train = [r for r in rows if r.get("split") == "train"]
    train = train[1:] or train
    evaluators: dict[str, dict[str, Any]] = {}
    for r in rows:
        split = str(r.get("split", ""))
        if split != "train" and not split.startswith("eval"):
            evaluators[split] = r  # rows are in step order: the last one wins
    return (_median([r["images_per_s"] for r in train if "images_per_s" in r]),
            _median([r["mfu"] for r in train if "mfu" in r]), evaluators)


def plot_curves(rows: list[dict[str, Any]], out: Path, title: str = "") -> Path:
    """Loss, learning rate and evaluation accuracy against steps, in one PNG."""
    with needs("train", "the training curves (curves.png)"):
        from matplotlib.figure import Figure  # no pyplot: matplotlib's backend and global state stay the caller's

    train = [r for r in rows if r.get("split") == "train"]
    evals = [r for r in rows if str(r.get("split", "")).startswith("eval")]
    fig = Figure(figsize=(15, 4))
    axes = fig.subplots(1, 3)
    axes[0].plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss")
    if evals:
        axes[0].plot([r["step"] for r in evals], [r["loss"] for r in evals], "o-", label=evals[0]["split"] + " loss")
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("cross-entropy")
    axes[0].legend()
    axes[1].plot([r["step"] for r in train], [r["lr"] for r in train])
    axes[1].set_xlabel("step")
    axes[1].set_ylabel("learning rate")
    if evals:
        axes[2].plot([r["step"] for r in evals], [100 * r["top1"] for r in evals], "o-", label="top-1")
        if any("top1_raw" in r for r in evals):
            axes[2].plot([r["step"] for r in evals], [100 * r.get("top1_raw", float("nan")) for r in evals], "x--",
                         label="top-1 (raw weights; EMA above)")
    for name, last in speed_and_evaluators(rows)[2].items():  # the few-shot probe's accuracy beside top-1
        ev_rows = [r for r in rows if r.get("split") == name]
        for k in (k for k in last if k.endswith("shot")):
            axes[2].plot([r["step"] for r in ev_rows], [100 * r.get(k, float("nan")) for r in ev_rows], "s:",
                         label=f"{name} {k[:-4]}-shot")
    if axes[2].lines:
        axes[2].legend()
    axes[2].set_xlabel("step")
    axes[2].set_ylabel(f"{evals[0]['split'] if evals else 'eval'} accuracy (%)")
    for ax in axes:
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    write_atomic(out, lambda tmp: fig.savefig(tmp, format="png", dpi=100), overwrite=True)
    return out


def early_stop_lines(es: dict[str, Any] | None) -> list[str]:
    """report.md's early-stopping section: the rule, the val split and its standard error, whether and where the run
    stopped, and the curve (every val evaluation, the chosen best and the stop point marked)."""
    if not es:
        return []
    se = es.get("val_top1_standard_error")
    se_s = f", one standard error of a top-1 there {100 * se:.2f} points" if se is not None else ""
    if es.get("stopped_early"):
        verdict = (f"**stopped early** at step {es['stopped_at']} of {es['total_steps']}: no better {es['rule']} "
                   f"in {es['patience_epochs']:g} epochs")
    else:
        verdict = f"ran to its last step ({es['total_steps']})"
    best = es.get("best_val_top1")
    lines = ["", "## Early stopping", "",
             f"Judged on the {es['rule']} over {es['val_images']:,} held-out val images{se_s}; the run {verdict}, and "
             f"ends with the weights of step {es['best_step']} (epoch {es['best_epoch']:.2f}"
             + (f", val top-1 {100 * best:.2f}%" if best is not None else "") + ").", "",
             "| step | epoch | val loss | val top-1 | judged | |", "|---|---|---|---|---|---|"]
    for r in es.get("curve", []):
        mark = ("best" if r["step"] == es["best_step"] else "") + (
            " stop" if es.get("stopped_early") and r["step"] == es.get("stopped_at") else "")
        lines.append(f"| {r['step']} | {r['epoch']:.2f} | {r['loss']:.4f} | {100 * r['top1']:.2f}% | "
                     f"{r['judged']:.4f} | {mark.strip()} |")
    return lines


def write_report(run_dir: str | Path, summary: dict[str, Any], recipe: Any = None) -> Path:
    """report.json, report.md and curves.png in `run_dir`; returns the path of report.md."""
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir / "metrics.jsonl")
    name = recipe.model.name if recipe is not None else ""
    curves = plot_curves(rows, run_dir / "curves.png", title=f"{name} {run_dir.name}".strip())
    report = {k: v for k, v in summary.items() if k != "eval"}
    ev = summary.get("eval") or {}
    report["final"] = {k: ev[k] for k in ("top1", "top5", "loss", "num_samples", "per_class") if k in ev}
    report["curves"] = str(curves)
    ips, mfu, evaluators = speed_and_evaluators(rows)
    if ips is not None:
        report["median_images_per_s"] = ips
    if mfu is not None:
        report["median_mfu"] = mfu
    if evaluators:
        report["evaluators"] = evaluators
    write_atomic(run_dir / "report.json", json.dumps(report, indent=2) + "\n", overwrite=True)
    lines = [f"# Run report: {run_dir}", ""]
    if recipe is not None:
        cfg = recipe.model.model_config(num_classes=len(ev.get("classes", [])) or 1)
        size = f"{cfg.seq_len} tokens" if hasattr(cfg, "seq_len") else f"{cfg.num_features}-d features"
        lines += [f"Model: {recipe.model.name} {recipe.model.overrides}  ({size})", ""]
    lines += [
        f"- status: {summary.get('status')}",
        f"- steps: {summary.get('step')} / {summary.get('total_steps')} (skipped non-finite: "
        f"{summary.get('skipped_steps')})",
        f"- images seen: {summary.get('images_seen')}",
        f"- precision: {summary.get('precision', '-')}",
        f"- training time: {summary.get('train_time_s', 0) / 60:.1f} min",
        f"- median throughput: {report.get('median_images_per_s', 0):.0f} images/s"
        + (f", MFU {100 * mfu:.1f}% (of a measured matmul peak)" if mfu is not None else ""),
    ]
    for name, row in evaluators.items():
        shots = ", ".join(f"{k[:-4]}-shot {100 * v:.2f}% (± {100 * row.get(k + '_std', 0):.2f})"
                          for k, v in row.items() if k.endswith("shot") and isinstance(v, int | float))
        lines.append(f"- {name} at step {row['step']}: {shots or row}")
    if ev:
        split = summary.get("eval_split", "eval")
        lines += [f"- {split} top-1: {100 * ev['top1']:.2f}%  top-5: {100 * ev['top5']:.2f}%  "
                  f"loss: {ev['loss']:.4f}  ({ev['num_samples']} images)", "", "| class | accuracy |", "|---|---|"]
        lines += [f"| {c} | {100 * a:.1f}% |" for c, a in ev.get("per_class", {}).items()]
    lines += early_stop_lines(summary.get("early_stop"))
    lines += ["", f"Weights: {summary.get('model', '-')}", "", "![curves](curves.png)", ""]
    md = run_dir / "report.md"
    write_atomic(md, "\n".join(lines), overwrite=True)
    return md
