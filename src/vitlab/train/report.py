"""The run report: training curves as PNG (matplotlib, no display needed) and the final numbers as JSON and
Markdown, all read back from metrics.jsonl so a resumed run's report covers the whole run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .checkpoint import atomic_write


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a metrics.jsonl; a torn last line (a kill mid-write) is ignored, and a resumed run's replayed
    steps keep only their latest row."""
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    p = Path(path)
    if not p.is_file():
        return []
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        rows[(row.get("split", "train"), int(row.get("step", 0)))] = row
    return sorted(rows.values(), key=lambda r: (r["step"], r.get("split", "")))


def plot_curves(rows: list[dict[str, Any]], out: Path, title: str = "") -> Path:
    """Loss, learning rate and evaluation accuracy against steps, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in rows if r.get("split") == "train"]
    evals = [r for r in rows if str(r.get("split", "")).startswith("eval")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
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
        axes[2].legend()
    axes[2].set_xlabel("step")
    axes[2].set_ylabel(f"{evals[0]['split'] if evals else 'eval'} accuracy (%)")
    for ax in axes:
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    atomic_write(out, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)
    return out


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
    train_rows = [r for r in rows if r.get("split") == "train"]
    if train_rows:
        ips = [r["images_per_s"] for r in train_rows[1:]] or [train_rows[0]["images_per_s"]]
        report["median_images_per_s"] = sorted(ips)[len(ips) // 2]
    atomic_write(run_dir / "report.json", lambda tmp: tmp.write_text(json.dumps(report, indent=2) + "\n"))
    lines = [f"# Run report: {run_dir}", ""]
    if recipe is not None:
        cfg = recipe.model.vit_config(num_classes=len(ev.get("classes", [])) or 1)
        lines += [f"Model: {recipe.model.name} {recipe.model.overrides}  ({cfg.seq_len} tokens)", ""]
    lines += [
        f"- status: {summary.get('status')}",
        f"- steps: {summary.get('step')} / {summary.get('total_steps')} (skipped non-finite: "
        f"{summary.get('skipped_steps')})",
        f"- images seen: {summary.get('images_seen')}",
        f"- precision: {summary.get('precision', '-')}",
        f"- training time: {summary.get('train_time_s', 0) / 60:.1f} min",
        f"- median throughput: {report.get('median_images_per_s', 0):.0f} images/s",
    ]
    if ev:
        split = summary.get("eval_split", "eval")
        lines += [f"- {split} top-1: {100 * ev['top1']:.2f}%  top-5: {100 * ev['top5']:.2f}%  "
                  f"loss: {ev['loss']:.4f}  ({ev['num_samples']} images)", "", "| class | accuracy |", "|---|---|"]
        lines += [f"| {c} | {100 * a:.1f}% |" for c, a in ev.get("per_class", {}).items()]
    lines += ["", f"Weights: {summary.get('model', '-')}", "", "![curves](curves.png)", ""]
    md = run_dir / "report.md"
    atomic_write(md, lambda tmp: tmp.write_text("\n".join(lines), encoding="utf-8"))
    return md
