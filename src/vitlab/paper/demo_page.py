"""What `vitlab demo`'s page shows, written by the reproduce report's writer (`vitlab.paper.report.write_report`):
the paper's claims beside the demo's measurements (higher-resolution fine-tuning against the same steps at the
pre-training's resolution, transfer against scratch, what the analysis finds), the stages, the transfer, the seed
spread and per-class tables, and the figures (the eval curve along pre-training and fine-tuning, the transfer runs,
`vitlab.analysis`'s figures of the fine-tuned model, each run's training curves). `write(out, summary, analysis)`.

`summary` is what `vitlab.paper.demo.run_demo` returns (demo.json holds it, with the claims); the figures are drawn
from it alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..analysis.findings import AnalysisResult
from ..analysis.page import sections
from ..models.config import pixels_per_token
from .figures import figure, lines_plot
from .inside import FINDINGS
from .report import Claim, Section, png_bytes, write_report
from .stats import Estimate, arm, combine, difference, points, verdict

TITLE = "vitlab demo: a ViT on {dataset}, pre-trained below its native resolution, fine-tuned at it, transferred"
TARGET = 0.90  # the demo's goal line on the curve: 90% Fashion-MNIST test top-1


def write(out: Path, summary: dict[str, Any], analysis: AnalysisResult) -> Path:
    """report.html, demo.json (`summary` and the claims) and each figure's PNG and JSON in `out`; returns the page."""
    return write_report(out, title=TITLE.format(dataset=summary["dataset"]), intro=intro(summary),
                        claims=claims(summary), tables=tables(summary), parts=figures(summary, analysis),
                        result=summary, result_name="demo.json")


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _threads(summary: dict[str, Any]) -> str:
    n = summary["threads"]
    return f"{n} thread{'' if n == 1 else 's'}"


def model_words(cfg: Any) -> str:
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


def intro(summary: dict[str, Any]) -> str:
    """The headline numbers, what ran, and where."""
    pre, ft, same = summary["pretrain"], summary["finetune"], summary["same_resolution"]
    return (f"{summary['dataset']} test top-1 (all {ft['test_images']:,} test images): {_pct(pre['top1'])} after "
            f"pre-training at {pre['img_size']} px, {_pct(ft['top1'])} after fine-tuning at {ft['img_size']} px "
            f"({100 * (ft['top1'] - pre['top1']):+.2f} points); the same fine-tuning steps kept at {same['img_size']} "
            f"px reach {_pct(same['top1'])}, so the higher resolution is worth "
            f"{100 * (ft['top1'] - same['top1']):+.2f} points. The model: {summary['model']}. Pre-trained at "
            f"{pre['img_size']} px ({pre['tokens']} tokens: the 28 px images downsampled, so with less detail), then "
            f"fine-tuned at {ft['img_size']} px ({ft['tokens']} tokens) with the same patch size, a longer sequence "
            "and its learned position embeddings interpolated on the 2-D grid (the paper's resolution change), head "
            "kept (same classes). The control runs the fine-tuning's recipe and steps at the pre-training's "
            "resolution: the difference is what the resolution adds, not what more steps add. Wall time "
            f"{summary['wall_time_s'] / 60:.1f} min on {_threads(summary)}; machine: "
            f"{summary['machine']['summary']}. Numbers: demo.json; runs: pretrain/, finetune/, same_resolution/, "
            "transfer/.")


# -- the claims -----------------------------------------------------------------------------------------------------


def _gap(a: float, b: float, n: int | None, spread: dict[str, Any] | None) -> Estimate:
    """a minus b: over the seeds (`spread`, the seed-by-seed differences) when there are several, else with the
    test images' standard error alone (one seed)."""
    if spread:
        return arm(spread["values"])
    return difference(arm([a], n), arm([b], n))


def _noise(spread: dict[str, Any] | None) -> str:
    return (f"{spread['seeds']} seeds, ± one standard error of the seed-by-seed difference" if spread else
            "one seed, ± the test images' standard error alone; --seeds N adds the seeds' spread")


def claims(summary: dict[str, Any]) -> list[Claim]:
    """Higher-resolution fine-tuning vs the control (Sec. 3.2), transfer vs scratch (Sec. 4.2), and each of the
    analysis findings (Sec. 4.5); "yes" / "no" only 2 standard errors from zero (`vitlab.paper.stats`)."""
    ft, same, spread = summary["finetune"], summary["same_resolution"], summary.get("seed_spread")
    g = _gap(ft["top1"], same["top1"], ft["test_images"], spread and spread["resolution_gain"])
    out = [Claim(
        paper="Sec. 3.2: fine-tuning at a higher resolution than pre-training is beneficial (the same patch size, "
              "more tokens, 2-D interpolated position embeddings)",
        measured=f"fine-tuned at {ft['img_size']} px {_pct(ft['top1'])} vs the same steps at {same['img_size']} px "
                 f"{_pct(same['top1'])}: {points(g, 2)} points ({_noise(spread)})",
        verdict=verdict(g.mean, g.se),
        numbers={"finetune": ft["top1"], "control": same["top1"], "gain": g.mean, "gain_se": g.se})]
    transfer = summary["transfer"]
    if "runs" in transfer:
        gaps = {str(r["labels_per_class"]): _gap(r["pretrained"]["top1"], r["scratch"]["top1"], r["test_images"],
                                                 spread and spread["transfer"].get(str(r["labels_per_class"])))
                for r in transfer["runs"]}
        verdicts = {k: verdict(e.mean, e.se) for k, e in gaps.items()}
        out.append(Claim(
            paper="Sec. 4.2: pre-training, then fine-tuning, beats training on the downstream task alone",
            measured=f"{transfer['dataset']}: pre-trained minus scratch " + ", ".join(
                f"{k}/class {points(e, 2)} points ({verdicts[k]})" for k, e in gaps.items())
                     + f" ({_noise(spread)}). {_transfer_words(transfer)}",
            verdict=combine(verdicts.values()),
            numbers={**{f"gap_{k}": e.mean for k, e in gaps.items()},
                     **{f"gap_se_{k}": e.se for k, e in gaps.items()}}))
    for name, f in summary["findings"].items():
        nums = {k: v for k, v in f.items() if k != "yes" and not isinstance(v, list)}
        out.append(Claim(paper=FINDINGS.get(name, name), measured=f"{name}: " + ", ".join(
            f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in nums.items()),
            verdict="yes" if f["yes"] else "no", numbers=nums))
    return out


def _transfer_words(transfer: dict[str, Any]) -> str:
    """Who is ahead, from the numbers; where scratch is, what the paper says the gain needs."""
    runs = transfer["runs"]
    lost = [str(r["labels_per_class"]) for r in runs if r["pretrained"]["top1"] < r["scratch"]["top1"]]
    if not lost:
        return f"The pre-trained model is ahead at every label budget ({len(runs)} of {len(runs)})."
    return (f"Training from scratch is ahead with {', '.join(lost)} labels per class. The paper's transfer gains "
            "come from large and varied upstream data (ImageNet-21k, JFT-300M; Sec. 4.2-4.3): 60,000 low-resolution "
            "clothing images are neither, and this hybrid's convolutions already give a model trained from scratch "
            "the bias that small data needs. `vitlab reproduce transfer` tests the claim where the upstream data is "
            "related (Fashion-MNIST classes held out of pre-training) and with a plain ViT.")


# -- the tables -----------------------------------------------------------------------------------------------------

Table = tuple[str, list[str], list[list[str]]]


def tables(summary: dict[str, Any]) -> list[Table]:
    """The stages, the transfer, the seed spread (with several seeds), per-class accuracy, and the time per step."""
    stages = [("pre-train", summary["pretrain"]), ("fine-tune", summary["finetune"]),
              ("control: the fine-tuning at the pre-training's resolution", summary["same_resolution"])]
    out = [("Pre-training and higher-resolution fine-tuning (paper Sec. 3.1-3.2)",
            ["stage", "resolution", "tokens", "optimiser", "steps x batch", "images", "training time", "precision",
             "test top-1", "test top-5"],
            [[name, f"{s['img_size']} px", f"{s['grid'][0]}x{s['grid'][1]} = {s['tokens']}",
              f"{s['optimizer']}, lr {s['lr']:g}", f"{s['steps']:,} x {s['batch_size']}", f"{s['images']:,}",
              f"{s['train_time_s'] / 60:.1f} min", s["precision"], _pct(s["top1"]), _pct(s["top5"])]
             for name, s in stages])]
    transfer = summary["transfer"]
    caption = f"Transfer to {transfer.get('dataset', 'another data set')} vs training from scratch (paper Sec. 4.2)"
    if "runs" in transfer:
        out.append((caption, ["labels per class", "training images", "steps", "pre-trained", "from scratch",
                              "difference (points)"],
                    [[str(r["labels_per_class"]), f"{r['train_images']:,}", str(r["pretrained"]["steps"]),
                      _pct(r["pretrained"]["top1"]), _pct(r["scratch"]["top1"]),
                      f"{100 * (r['pretrained']['top1'] - r['scratch']['top1']):+.2f}"] for r in transfer["runs"]]))
    else:
        out.append((caption, ["skipped"], [[transfer["skipped"]]]))
    spread = summary.get("seed_spread")
    if spread:
        out.append(_spread_table(spread))
    pre, ft = summary["pretrain"]["per_class"], summary["finetune"]["per_class"]
    out.append(("Per-class test accuracy", ["class", "pre-train", "fine-tune"],
                [[c, _pct(pre.get(c, float("nan"))), _pct(a)] for c, a in ft.items()]))
    cpu = summary.get("stages_cpu_s", {})
    load = [", ".join(f"{x:.2f}" for x in summary[k] or []) for k in ("load_average_start", "load_average_end")]
    out.append((f"Time per step ({_threads(summary)}; load average (1, 5, 15 min) {load[0]} at the start, "
                f"{load[1]} at the end)", ["step", "wall time", "CPU time of this process (all threads)"],
                [[k, f"{v:.0f} s", f"{cpu.get(k, float('nan')):.0f} s"] for k, v in summary["stages_wall_s"].items()]))
    return out


def _spread_table(spread: dict[str, Any]) -> Table:
    """The two headline differences over the seeds (`vitlab demo --seeds N`): every seed's (seed k against seed k),
    the mean ± one standard error (the seeds' standard deviation / sqrt(N)) and the verdict: yes when the mean is 2
    standard errors above zero, no 2 below, else within noise."""
    diffs = [("fine-tune at the native resolution minus the control (same steps at the pre-training's)",
              spread["resolution_gain"])]
    diffs += [(f"transfer: pre-trained minus scratch, {labels} labels per class", d)
              for labels, d in spread["transfer"].items()]
    return (f"Seed spread of the headline differences ({spread['seeds']} seeds)",
            ["difference", "each seed (points)", "mean ± standard error", "verdict"],
            [[name, ", ".join(f"{100 * v:+.2f}" for v in d["values"]),
              f"{100 * d['mean']:+.2f} ± {100 * d['se']:.2f}", d["verdict"]] for name, d in diffs])


# -- the figures ----------------------------------------------------------------------------------------------------


def _subset(n: int | None) -> str:
    return f"the first {n:,} test images" if n else "the test set"


def curve_figure(summary: dict[str, Any]) -> Any:
    """Test top-1 against training images seen: pre-training's points, then fine-tuning's and the control's (their
    images counted after pre-training's), each stage's final model on the whole test set as a star, the 90% line."""
    fig = figure(9, 4.2)
    ax = fig.subplots()
    pre, ft, same = summary["pretrain"], summary["finetune"], summary["same_resolution"]
    offset = pre["images"]
    stages = [(pre, 0, "tab:blue", f"pre-train, {pre['img_size']} px"),
              (ft, offset, "tab:orange", f"fine-tune, {ft['img_size']} px"),
              (same, offset, "tab:grey", f"control: same steps at {same['img_size']} px")]
    for stage, shift, colour, label in stages:
        pts = stage["curve"]
        ax.plot([(shift + p["images"]) / 1e3 for p in pts], [100 * p["top1"] for p in pts], "o-", color=colour,
                label=f"{label} ({_subset(stage.get('curve_samples'))})")
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
    return fig


def transfer_figure(transfer: dict[str, Any]) -> Any:
    """Test top-1 along the transfer runs, pre-trained and from scratch, one panel per label budget."""
    panels = []
    for r in transfer["runs"]:
        lines = {f"{label}: {_pct(r[how]['top1'])}": ([p["step"] for p in r[how]["curve"]],
                                                     [p["top1"] for p in r[how]["curve"]])
                 for how, label in (("pretrained", "from the pre-trained model"), ("scratch", "from scratch"))}
        panels.append((f"{r['labels_per_class']} labels per class ({r['train_images']:,} images)", lines))
    return lines_plot(panels, xlabel="step", ylabel=f"{transfer['dataset']} test top-1 (%)")


def figures(summary: dict[str, Any], analysis: AnalysisResult) -> list[Section]:
    """The eval curve, the transfer runs, the analysis's figures, and each Fashion-MNIST run's training curves."""
    pre = summary["pretrain"]
    out = [Section("eval_curve", "Eval curve: pre-training, then fine-tuning and the control",
                   f"Points along training: {_subset(pre.get('curve_samples'))} every few steps (cheap); stars: each "
                   f"stage's final model on the whole test set; dashed: {100 * TARGET:.0f}%.",
                   png_bytes(curve_figure(summary)),
                   {k: summary[k]["curve"] for k in ("pretrain", "finetune", "same_resolution")})]
    transfer = summary["transfer"]
    if "runs" in transfer:
        first = transfer["runs"][0]
        p, s = first["pretrained"], first["scratch"]
        out.append(Section(
            "transfer", f"Transfer to {transfer['dataset']}: pre-trained vs from scratch (Sec. 4.2)",
            f"The pre-trained model fine-tuned on {transfer['dataset']} (scikit-learn's 8x8 handwritten digits, "
            f"upsampled; {first['test_images']} test images) with a zero-initialised head and the paper's SGD recipe "
            f"({p['optimizer']}, lr {p['lr']:g}), against the same model trained from scratch with the "
            f"pre-training's optimiser ({s['optimizer']}, lr {s['lr']:g}): same steps, same images; test top-1 "
            "along the runs.", png_bytes(transfer_figure(transfer)), {"runs": transfer["runs"]}))
    out += sections(analysis)
    for key, name in (("pretrain", "pre-training"), ("finetune", "fine-tuning")):
        curves = Path(summary[key]["run_dir"]) / "curves.png"
        if curves.is_file():
            out.append(Section(f"curves_{key}", f"Training curves, {name}",
                               f"The run's loss, learning rate and evaluations ({summary[key]['run_dir']}).",
                               curves.read_bytes(), {"run_dir": summary[key]["run_dir"]}))
    return out
