"""The experiments' plots as matplotlib Figures (no pyplot, backend untouched), like `vitlab.analysis.plots`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..utils.extras import needs

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def figure(w: float, h: float) -> Figure:
    with needs("paper", "the reproduce report's figures"):
        from matplotlib.figure import Figure

    return Figure(figsize=(w, h), dpi=100, layout="constrained")


Lines = dict[str, tuple[list[float], list[float]]]  # line label -> (xs, ys)


def lines_plot(panels: Sequence[tuple[str, Lines]], *, xlabel: str,
               ylabel: str, logx: bool = False, percent: bool = True, suptitle: str = "") -> Figure:
    """Side-by-side panels, each (title, {line label: (xs, ys)}); ys in [0, 1] drawn as percentages."""
    fig = figure(4.6 * len(panels), 3.6)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (title, lines) in zip(axes, panels):
        for label, (xs, ys) in lines.items():
            ys_ = [100 * y if percent and y is not None else y for y in ys]
            ax.plot(list(xs), ys_, marker="o", label=label)
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
               percent: bool = True) -> Figure:
    """Grouped bars: one group per entry of `groups`, one bar per series (None: no bar)."""
    fig = figure(max(5.0, 1.3 * len(groups) * max(1, len(series)) / 2), 3.6)
    ax = fig.subplots()
    n = max(1, len(series))
    width = 0.8 / n
    for i, (label, ys) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        vals = [(100 * y if percent else y) if y is not None else 0.0 for y in ys]
        ax.bar(xs, vals, width=width, label=label)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return fig
