"""The experiments' plots as matplotlib Figures (no pyplot, backend untouched), like `vitlab.analysis.plots`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..utils.extras import needs

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def figure(w: float, h: float) -> Figure:
    with needs("paper", "the figures of the reproduce and demo reports"):
        from matplotlib.figure import Figure

    return Figure(figsize=(w, h), dpi=100, layout="constrained")


Lines = dict[str, tuple]  # line label -> (xs, ys) or (xs, ys, standard errors, [(x, y) of every seed])


def lines_plot(panels: Sequence[tuple[str, Lines]], *, xlabel: str,
               ylabel: str, logx: bool = False, percent: bool = True, suptitle: str = "") -> Figure:
    """Side-by-side panels, each (title, {line label: (xs, ys[, errors, points])}); ys in [0, 1] drawn as
    percentages. With errors, each mean has a bar of one standard error; with points, every seed's value is a dot."""
    fig = figure(4.6 * len(panels), 3.6)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    scale = 100.0 if percent else 1.0
    for ax, (title, lines) in zip(axes, panels):
        for label, line in lines.items():
            xs, ys = line[0], line[1]
            errs = line[2] if len(line) > 2 else None
            ys_ = [scale * y if y is not None else None for y in ys]
            if errs is not None and any(e is not None for e in errs):
                es = [scale * e if e is not None else 0.0 for e in errs]
                drawn = ax.errorbar(list(xs), ys_, yerr=es, marker="o", capsize=3, label=label)
                colour = drawn.lines[0].get_color()
            else:
                colour = ax.plot(list(xs), ys_, marker="o", label=label)[0].get_color()
            pts = line[3] if len(line) > 3 else None
            if pts:
                ax.scatter([x for x, _ in pts], [scale * y for _, y in pts], s=10, color=colour, alpha=0.5)
        if logx:
            ax.set_xscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    return fig


def bar_groups(groups: Sequence[str], series: dict[str, Sequence[float | None]], *, ylabel: str, title: str,
               percent: bool = True, errors: dict[str, Sequence[float | None]] | None = None,
               points: dict[str, Sequence[Sequence[float]]] | None = None) -> Figure:
    """Grouped bars: one group per entry of `groups`, one bar per series (None: no bar); `errors` (per series, per
    group): a bar of one standard error; `points` (per series, per group): every seed's value as a dot."""
    fig = figure(max(5.0, 1.3 * len(groups) * max(1, len(series)) / 2), 3.6)
    ax = fig.subplots()
    n = max(1, len(series))
    width = 0.8 / n
    scale = 100.0 if percent else 1.0
    for i, (label, ys) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        vals = [scale * y if y is not None else 0.0 for y in ys]
        errs = (errors or {}).get(label)
        yerr = [scale * e if e is not None else 0.0 for e in errs] if errs is not None else None
        ax.bar(xs, vals, width=width, label=label, yerr=yerr, capsize=3 if yerr is not None else 0)
        for x, pts in zip(xs, (points or {}).get(label) or []):
            if len(pts) > 1:
                ax.scatter([x] * len(pts), [scale * p for p in pts], s=10, color="black", alpha=0.6, zorder=3)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return fig
