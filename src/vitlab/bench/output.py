"""What `vitlab bench` hands back: the results as a fixed-width table, a bar chart and files.

`write_outputs(out, folder)` writes bench.json (everything, every round's seconds), bench.txt (the table) and
bench.png (images/s with min-max whiskers). The chart is a `matplotlib.figure.Figure`: no pyplot, so nothing here
changes matplotlib's backend or global state.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..utils.extras import needs
from ..utils.io import atomic_write

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def format_table(out: dict) -> str:
    """The results as a fixed-width table: one row per candidate and setting."""
    m = out["machine"]
    peaks = ", ".join(f"{k} {v:.0f}" for k, v in out["matmul_peak_gflops"].items())
    vit = out["config"]["vit"]
    lines = [
        f"{out['config']['model']} at {vit['img_size']} px (depth {vit['depth']}, width {vit['embed_dim']}); "
        f"host class {m.get('host_class', '?')}{_emulation(m)}: {m['cpu']}, {m['torch_threads']} threads, "
        f"torch {m['torch']}; load {m['loadavg_start']} -> {m.get('loadavg_end')}",
        f"matmul peak GFLOP/s: {peaks}",
    ]
    head = (f"{'host':<13}{'task':<6}{'batch':>6} {'candidate':<22}{'dtype':<6}{'img/s':>9}{'(min-max)':>18}"
            f"{'lat ms':>10}{'GFLOP/s':>9}{'MFU':>7}{'mem MiB':>9}{'agree':>8}{'max|d|':>9}  ratio (peer time / ours)")
    lines += [head, "-" * len(head)]
    for r in out["results"]:
        ratios = " ".join(f"{k} {v:.2f}x" for k, v in r["ratio_vs"].items())
        mem = f"{r['peak_memory_bytes'] / 2**20:.0f}" if r["peak_memory_bytes"] is not None else "-"
        mfu = f"{100 * r['mfu']:.0f}%" if r["mfu"] is not None else "-"
        rng = f"({r['images_per_s_min']:.1f}-{r['images_per_s_max']:.1f})"
        agree = f"{100 * r['agreement']:.1f}%" if r.get("agreement") is not None else "-"
        diff = f"{r['max_logit_diff']:.2g}" if r.get("max_logit_diff") is not None else "-"
        lines.append(
            f"{r.get('host_class', m.get('host_class', '?')):<13}"
            f"{r['task']:<6}{r['batch']:>6} {r['name']:<22}{r['dtype']:<6}{r['images_per_s']:>9.1f}{rng:>18}"
            f"{r['latency_ms']:>10.1f}{r['gflops_per_s']:>9.1f}{mfu:>7}{mem:>9}{agree:>8}{diff:>9}  {ratios}"
        )
    lines.append("MFU: achieved FLOP/s (count_flops, attention included) / measured matmul peak in the same dtype; "
                 "ratios are medians of per-round pairs, >1 means ours is faster.")
    notes = sorted({r["note"] for r in out["results"] if r.get("note")})
    lines.append("agree / max|d|: top-1 agreement with / largest logit difference from our fp32 model"
                 + (f" ({'; '.join(notes)})" if notes else ""))
    chose = sorted({r["mode"] for r in out["results"] if r["name"] == "ours[auto]" and r.get("mode")})
    if chose:
        lines.append(f"ours[auto] ran the mode it chose: {', '.join(chose)}")
    for k, v in out.get("skipped", {}).items():
        lines.append(f"skipped {k}: {v}")
    return "\n".join(lines)


def _emulation(machine: dict) -> str:
    """", kernels as ISA=..." when the run forced lesser kernels through the environment (`timing.EMULATION_VARS`)."""
    emu = machine.get("emulation")
    return f" (kernels emulated: {' '.join(f'{k}={v}' for k, v in emu.items())})" if emu else ""


def plot_results(out: dict) -> Figure:
    """A bar chart of images/s (median, min-max whiskers): one panel per setting, one bar per candidate."""
    with needs("bench", "the benchmark plot"):
        from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    def panel(r: dict) -> tuple[str, str, int]:  # speed modes ran beside the fp32 eager candidates
        mode = r["task"] == "infer" and r["name"].startswith("ours[")
        return r["task"], "fp32" if mode else r["dtype"], r["batch"]

    settings = sorted({panel(r) for r in out["results"]})
    fig = Figure(figsize=(3.2 * len(settings), 4.2), layout="tight")
    axes = fig.subplots(1, len(settings), squeeze=False)
    for ax, setting in zip(axes[0], settings):
        task, dname, b = setting
        rows = [r for r in out["results"] if panel(r) == setting]
        names = [r["name"] for r in rows]
        vals = [r["images_per_s"] for r in rows]
        err = [[v - r["images_per_s_min"] for v, r in zip(vals, rows)],
               [r["images_per_s_max"] - v for v, r in zip(vals, rows)]]
        colors = ["tab:blue" if n.startswith("ours") else "tab:gray" for n in names]
        ax.bar(range(len(rows)), vals, yerr=err, color=colors, capsize=3)
        ax.set_xticks(range(len(rows)), names, rotation=60, ha="right", fontsize=7)
        ax.set_title(f"{task} {dname} b={b}", fontsize=9)
        ax.set_ylabel("images/s" if ax is axes[0][0] else "")
    fig.suptitle(f"{out['config']['model']} @ {out['config']['img_size']} px on {out['machine']['cpu']} "
                 f"({out['machine'].get('host_class', '?')}{_emulation(out['machine'])})", fontsize=9)
    return fig


def write_outputs(out: dict, out_dir: Path, png: bool = True) -> list[Path]:
    """bench.json, bench.txt (the table) and bench.png in `out_dir` (results of a benchmark: replaced)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "bench.json", out_dir / "bench.txt"]
    with atomic_write(paths[0], overwrite=True) as tmp, open(tmp, "w") as f:
        json.dump(out, f, indent=1, default=_json_default)
    with atomic_write(paths[1], overwrite=True) as tmp, open(tmp, "w") as f:
        f.write(format_table(out) + "\n")
    if png:
        fig = plot_results(out)
        with atomic_write(out_dir / "bench.png", overwrite=True) as tmp:
            fig.savefig(tmp, format="png", dpi=110)
        paths.append(out_dir / "bench.png")
    return paths


def _json_default(o):
    if isinstance(o, torch.dtype):
        return str(o)
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)
