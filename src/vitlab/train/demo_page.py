"""The demo's one self-contained HTML page: the headline numbers, the eval curve along pre-training and
fine-tuning, the transfer result against training from scratch, per-class accuracy, and the analysis figures
(`vitlab.analysis.page.sections`), every PNG inlined, no script. `write_page(path, summary, analysis)`.

`summary` is what `vitlab.train.demo.run_demo` writes to demo.json; the figures are drawn from it alone.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

from ..analysis.page import sections
from ..utils.extras import needs
from ..utils.io import write_atomic

TARGET = 0.90  # the demo's goal line on the curve: 90% Fashion-MNIST test top-1

STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:auto;padding:1em;line-height:1.4}img{max-width:100%}"
         "table{border-collapse:collapse;margin:0.5em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}"
         "td.n{text-align:right}code{background:#f4f4f4;padding:0 3px}.small{color:#555;font-size:90%}")


def _figure(w: float, h: float) -> Any:
    with needs("train", "the demo's figures"):
        from matplotlib.figure import Figure  # no pyplot: matplotlib's global state stays the caller's
    return Figure(figsize=(w, h))


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def curve_figure(summary: dict[str, Any]) -> Any:
    """Test top-1 against training images seen: pre-training's points, then fine-tuning's (its images counted
    after pre-training's), each stage's final model on the whole test set as a star, and the 90% line."""
    fig = _figure(9, 4.2)
    ax = fig.subplots()
    pre, ft = summary["pretrain"], summary["finetune"]
    offset = pre["images"]
    stages = [(pre, 0, "tab:blue", f"pre-train, {pre['img_size']} px"),
              (ft, offset, "tab:orange", f"fine-tune, {ft['img_size']} px")]
    if "same_resolution" in summary:
        same = summary["same_resolution"]
        stages.append((same, offset, "tab:grey", f"control: same steps at {same['img_size']} px"))
    for stage, shift, colour, label in stages:
        pts = stage["curve"]
        n = stage.get("curve_samples")
        sub = _subset(n)
        ax.plot([(shift + p["images"]) / 1e3 for p in pts], [100 * p["top1"] for p in pts], "o-", color=colour,
                label=f"{label} ({sub})")
        ax.plot([(shift + stage["images"]) / 1e3], [100 * stage["top1"]], "*", color=colour, markersize=15,
                markeredgecolor="black", label=f"{label}: all {stage['test_images']:,} test images, "
                                              f"{_pct(stage['top1'])}")
    ax.axhline(100 * TARGET, color="grey", linestyle="--", linewidth=1)
    ax.axvline(offset / 1e3, color="grey", linestyle=":", linewidth=1)
    tops = [100 * p["top1"] for s, *_ in stages for p in s["curve"]] + [100 * s["top1"] for s, *_ in stages]
    ax.set_ylim(max(0.0, min(tops[len(tops) // 4:] or tops) - 5), 100)
    ax.set_xlabel("training images seen (thousands)")
    ax.set_ylabel(f"{summary['dataset']} test top-1 (%)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def transfer_figure(transfer: dict[str, Any]) -> Any:
    """Digits test top-1 along the transfer runs: pre-trained (solid) and from scratch (dashed), per label budget."""
    runs = transfer["runs"]
    fig = _figure(4.5 * len(runs), 3.8)
    axes = fig.subplots(1, len(runs), squeeze=False)[0]
    for ax, run in zip(axes, runs, strict=True):
        for kind, style, label in (("pretrained", "o-", "from the pre-trained model"),
                                   ("scratch", "s--", "from scratch")):
            pts = run[kind]["curve"]
            ax.plot([p["step"] for p in pts], [100 * p["top1"] for p in pts], style,
                    label=f"{label}: {_pct(run[kind]['top1'])}")
        ax.set_title(f"{run['labels_per_class']} labels per class ({run['train_images']:,} images)", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel(f"{transfer['dataset']} test top-1 (%)")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def _subset(n: int | None) -> str:
    return f"the first {n:,} test images" if n else "the test set"


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _stage_rows(summary: dict[str, Any]) -> list[str]:
    rows = []
    stages = [("pre-train", summary["pretrain"]), ("fine-tune", summary["finetune"])]
    if "same_resolution" in summary:
        stages.append(("control: the fine-tuning at the pre-training's resolution", summary["same_resolution"]))
    for name, s in stages:
        g = s["grid"]
        rows.append(
            f"<tr><td>{name}</td><td class=n>{s['img_size']} px</td><td class=n>{g[0]}x{g[1]} = {s['tokens']}</td>"
            f"<td>{html.escape(s['optimizer'])}, lr {s['lr']:g}</td><td class=n>{s['steps']:,} x {s['batch_size']}</td>"
            f"<td class=n>{s['images']:,}</td><td class=n>{s['train_time_s'] / 60:.1f} min</td>"
            f"<td>{html.escape(s['precision'])}</td><td class=n><b>{_pct(s['top1'])}</b></td>"
            f"<td class=n>{_pct(s['top5'])}</td></tr>")
    return rows


def _transfer_html(transfer: dict[str, Any]) -> list[str]:
    if "skipped" in transfer:
        return [f"<p>Skipped: {html.escape(transfer['skipped'])}</p>"]
    rows = []
    for run in transfer["runs"]:
        p, s = run["pretrained"], run["scratch"]
        rows.append(f"<tr><td class=n>{run['labels_per_class']}</td><td class=n>{run['train_images']:,}</td>"
                    f"<td class=n>{p['steps']}</td><td class=n><b>{_pct(p['top1'])}</b></td>"
                    f"<td class=n>{_pct(s['top1'])}</td><td class=n>{100 * (p['top1'] - s['top1']):+.2f}</td></tr>")
    first = transfer["runs"][0]
    return [
        f"<p>The pre-trained model fine-tuned on <code>{html.escape(str(transfer['dataset']))}</code> "
        f"(scikit-learn's 8x8 handwritten digits, upsampled; {first['test_images']} test images) with a "
        f"zero-initialised head and the paper's SGD recipe ({html.escape(first['pretrained']['optimizer'])}, lr "
        f"{first['pretrained']['lr']:g}), against the same model trained from scratch with the pre-training's "
        f"optimiser ({html.escape(first['scratch']['optimizer'])}, lr {first['scratch']['lr']:g}): same steps, "
        "same images.</p>",
        "<table><tr><th>labels per class</th><th>training images</th><th>steps</th><th>pre-trained</th>"
        "<th>from scratch</th><th>difference (points)</th></tr>", *rows, "</table>",
        f"<p>{_transfer_verdict(transfer)}</p>",
        _img(_png(transfer_figure(transfer)), "transfer: pre-trained vs scratch"),
    ]


def _transfer_verdict(transfer: dict[str, Any]) -> str:
    """One sentence on who won, from the numbers; where scratch wins, what the paper says the gain needs."""
    runs = transfer["runs"]
    lost = [str(r["labels_per_class"]) for r in runs if r["pretrained"]["top1"] < r["scratch"]["top1"]]
    if not lost:
        return f"The pre-trained model is ahead at every label budget ({len(runs)} of {len(runs)})."
    return (f"Training from scratch is ahead with {', '.join(lost)} labels per class. The paper's transfer gains "
            "come from large and varied upstream data (ImageNet-21k, JFT-300M; Sec. 4.2-4.3): 60,000 low-resolution "
            "clothing images are neither, and this hybrid's convolutions already give a model trained from scratch "
            "the bias that small data needs. <code>vitlab reproduce transfer</code> tests the claim where the "
            "upstream data is related (Fashion-MNIST classes held out of pre-training) and with a plain ViT.")


def seed_spread_html(spread: dict[str, Any] | None) -> list[str]:
    """The two headline differences over the seeds (`vitlab demo --seeds N`): every seed's, the mean ± standard
    error and the verdict; nothing with one seed."""
    if not spread:
        return []

    def row(name: str, d: dict[str, Any]) -> str:
        each = ", ".join(f"{100 * v:+.2f}" for v in d["values"])
        return (f"<tr><td>{html.escape(name)}</td><td class=n>{each}</td><td class=n><b>{100 * d['mean']:+.2f} ± "
                f"{100 * d['se']:.2f}</b></td><td><b>{html.escape(d['verdict'])}</b></td></tr>")

    rows = [row("fine-tune at the native resolution minus the control (same steps at the pre-training's)",
                spread["resolution_gain"])]
    rows += [row(f"transfer: pre-trained minus scratch, {labels} labels per class", d)
             for labels, d in spread["transfer"].items()]
    return [f"<h2>Seed spread of the headline differences ({spread['seeds']} seeds)</h2>",
            "<p>Each comparison run again with the recipes' seed + 1, + 2, ... (head, data order, augmentation) from "
            "the one pre-trained model; each seed's difference in points (seed k against seed k), their mean ± one "
            "standard error (the seeds' standard deviation / sqrt(N)), and the verdict: <i>yes</i> when the mean is "
            "at least 2 standard errors above zero, <i>no</i> 2 below, otherwise <i>within noise</i>.</p>",
            "<table><tr><th>difference</th><th>each seed (points)</th><th>mean ± standard error</th>"
            "<th>verdict</th></tr>", *rows, "</table>"]


def _per_class(summary: dict[str, Any]) -> list[str]:
    pre, ft = summary["pretrain"]["per_class"], summary["finetune"]["per_class"]
    rows = [f"<tr><td>{html.escape(c)}</td><td class=n>{_pct(pre.get(c, float('nan')))}</td>"
            f"<td class=n>{_pct(a)}</td></tr>" for c, a in ft.items()]
    return ["<table><tr><th>class</th><th>pre-train</th><th>fine-tune</th></tr>", *rows, "</table>"]


def _findings(findings: dict[str, Any]) -> list[str]:
    rows = []
    for name, f in findings.items():
        nums = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in f.items()
                         if k != "yes" and not isinstance(v, list))
        rows.append(f"<tr><td>{html.escape(name)}</td><td><b>{'yes' if f['yes'] else 'no'}</b></td>"
                    f"<td class=small>{html.escape(nums)}</td></tr>")
    return ["<table><tr><th>what the paper describes</th><th>seen here</th><th>numbers</th></tr>", *rows, "</table>"]


def page_html(summary: dict[str, Any], analysis: Any) -> str:
    """The page for a demo `summary` and its `vitlab.analysis` result (figures drawn here)."""
    pre, ft = summary["pretrain"], summary["finetune"]
    same = summary.get("same_resolution")
    esc = html.escape
    gain = 100 * (ft["top1"] - pre["top1"])
    control = (f"; the same fine-tuning steps kept at {same['img_size']} px reach {_pct(same['top1'])}, so the higher "
               f"resolution is worth <b>{100 * (ft['top1'] - same['top1']):+.2f} points</b>") if same else ""
    body = [
        f"<h1>vitlab demo: a ViT on {esc(summary['dataset'])}, pre-trained below its native resolution, fine-tuned "
        "at it, transferred</h1>",
        f"<p>{esc(summary['dataset'])} test top-1 (all {ft['test_images']:,} test images): "
        f"<b>{_pct(pre['top1'])}</b> after pre-training at {pre['img_size']} px, <b>{_pct(ft['top1'])}</b> after "
        f"fine-tuning at {ft['img_size']} px ({gain:+.2f} points){control}. "
        f"Wall time {summary['wall_time_s'] / 60:.1f} min on {summary['threads']} threads "
        f"({esc(summary['machine'])}).</p>",
        "<h2>Pre-training and higher-resolution fine-tuning (paper Sec. 3.1-3.2)</h2>",
        f"<p>The model: {esc(summary.get('model', 'a hybrid ViT'))}. Pre-trained at {pre['img_size']} px "
        f"({pre['tokens']} tokens: the 28 px images downsampled, so with less detail), then fine-tuned at "
        f"{ft['img_size']} px ({ft['tokens']} tokens) with the same patch size, a longer sequence and its learned "
        "position embeddings interpolated on the 2-D grid (the paper's resolution change), head kept (same classes). "
        "The control runs the fine-tuning's recipe and steps at the pre-training's resolution: the difference is "
        "what the resolution adds, not what more steps add.</p>",
        "<table><tr><th>stage</th><th>resolution</th><th>tokens</th><th>optimiser</th><th>steps x batch</th>"
        "<th>images</th><th>training time</th><th>precision</th><th>test top-1</th><th>test top-5</th></tr>",
        *_stage_rows(summary), "</table>",
        "<h3>Eval curve</h3>",
        f"<p>Points along training: {_subset(pre.get('curve_samples'))} every few steps (cheap); stars: each "
        "stage's final model on the whole test set.</p>",
        _img(_png(curve_figure(summary)), "eval curve"),
        "<h2>Transfer to another data set vs training from scratch (paper Sec. 4.2)</h2>",
        *_transfer_html(summary["transfer"]),
        *seed_spread_html(summary.get("seed_spread")),
        "<h2>Inside the fine-tuned model (paper Sec. 4.5)</h2>",
        *_findings(summary["findings"]),
    ]
    for sec in sections(analysis):
        body += [f"<h3>{esc(sec.title)}</h3><p class=small>{esc(sec.caption)}</p>", _img(sec.png, sec.title)]
    body += ["<h2>Per-class test accuracy</h2>", *_per_class(summary)]
    for name, s in (("pre-training", pre), ("fine-tuning", ft)):
        curves = Path(s["run_dir"]) / "curves.png"
        if curves.is_file():
            body += [f"<h3>Training curves, {name}</h3>", _img(curves.read_bytes(), f"training curves, {name}")]
    walls = ", ".join(f"{k} {v:.0f} s" for k, v in summary["stages_wall_s"].items())
    cpus = ", ".join(f"{k} {v:.0f} s" for k, v in summary.get("stages_cpu_s", {}).items())
    body.append(
        f"<p class=small>Machine: {esc(summary['machine'])}; {summary['threads']} threads. Wall time per step: "
        f"{esc(walls)}; CPU time of this process (all threads): {esc(cpus)}. Load average (1, 5, 15 min) at the start: "
        f"{', '.join(f'{x:.2f}' for x in summary['load_average_start'])}; at the end: "
        f"{', '.join(f'{x:.2f}' for x in summary['load_average_end'])}. Numbers: <code>demo.json</code>; runs: "
        "<code>pretrain/</code>, <code>finetune/</code>, <code>transfer/</code>.</p>")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>vitlab demo</title>"
            f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>")


def write_page(path: Path, summary: dict[str, Any], analysis: Any) -> Path:
    """Write the page atomically (replacing an earlier version of it); returns `path`."""
    text = page_html(summary, analysis)
    write_atomic(path, lambda p: p.write_text(text, encoding="utf-8"), overwrite=True)
    return path
