"""The families page: `vitlab.analysis.families` measurements drawn side by side on one self-contained HTML page (a
summary table, then four figures: mean attention distance by depth, attention entropy per layer, position-embedding
similarity, prefix tokens and patch norms). Axes are made comparable across models of other sizes: depth as a
fraction of the model's, distance as a share of uniform attention's on its grid, entropy as a share of log T."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .families import FamilyInsides
from .page import Section, _png, document
from .plots import _cmap, _figure, similarity_mosaic

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _depth(n: int) -> np.ndarray:
    return np.arange(1, n + 1) / n


def _lines(results: Sequence[FamilyInsides], values: list[np.ndarray], ylabel: str, title: str) -> Figure:
    fig = _figure(7.5, 4.2)
    ax = fig.add_subplot()
    cmap = _cmap("tab10" if len(results) <= 10 else "tab20")
    for i, (r, v) in enumerate(zip(results, values)):
        ax.plot(_depth(len(v)), v, marker="o", ms=3, color=cmap(i % cmap.N), label=r.name,
                ls="-" if r.source == "random init" else "--")
    ax.axhline(1.0, color="grey", lw=1, ls=":")
    ax.set_xlabel("Depth (layer / layers)")
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=6, loc="lower right", ncol=2)
    return fig


def plot_similarities(results: Sequence[FamilyInsides]) -> Figure:
    """One position-embedding similarity mosaic (paper Fig. 7 centre) per model, its correlation with distance."""
    shown = [r for r in results if r.pos_similarity is not None]
    ncols = min(5, max(1, len(shown)))
    nrows = max(1, -(-len(shown) // ncols))
    fig = _figure(2.2 * ncols, 2.3 * nrows)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, r in zip(axes.flat, shown):
        assert r.pos_similarity is not None and r.pos_summary is not None
        ax.imshow(similarity_mosaic(r.pos_similarity), cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
        ax.set_title(f"{r.name}\ncorr {r.pos_summary['correlation']:.2f}", fontsize=7)
    return fig


def plot_norms(results: Sequence[FamilyInsides]) -> Figure:
    """Left: each token kind's mean output norm at the last layer over the patches'. Right: per layer, the largest
    patch norm over the median (the high-norm artifact tokens of Darcet et al. 2024)."""
    fig = _figure(10.0, 4.0)
    left, right = fig.subplots(1, 2)
    kinds = ("class", "distillation", "registers", "patches")
    width = 0.8 / len(kinds)
    x = np.arange(len(results))
    for j, kind in enumerate(kinds):
        vals = [r.tokens.norms[kind][-1] / r.tokens.norms["patches"][-1] if kind in r.tokens.norms else np.nan
                for r in results]
        left.bar(x + (j - 1.5) * width, vals, width, label=kind)
    left.set_xticks(x, [r.name for r in results], rotation=45, ha="right", fontsize=6)
    left.set_ylabel("Last-layer norm / patch norm")
    left.legend(fontsize=6)
    cmap = _cmap("tab10" if len(results) <= 10 else "tab20")
    for i, r in enumerate(results):
        right.plot(_depth(len(r.entropy)), r.tokens.max_norm_ratio, marker="o", ms=3, color=cmap(i % cmap.N),
                   label=r.name)
    right.set_xlabel("Depth (layer / layers)")
    right.set_ylabel("Largest patch norm / median")
    right.legend(fontsize=6, ncol=2)
    return fig


def family_sections(results: Sequence[FamilyInsides]) -> list[Section]:
    """The page's four figures, drawn."""
    dist = [r.distance / r.uniform_distance for r in results]
    ent = [r.entropy / r.uniform_entropy for r in results]
    return [
        Section("distance", "Mean attention distance by depth (paper Fig. 7 right)",
                "Heads averaged, as a share of uniform attention's distance on the model's grid (1: global); patch "
                "queries and patch keys only (prefix tokens left out). Dashed: checkpoints.",
                _png(_lines(results, dist, "Mean distance / uniform", "Mean attention distance")), {}),
        Section("entropy", "Attention entropy per layer",
                "Mean entropy of the patch queries' attention over all keys (heads averaged), as a share of log T "
                "(1: uniform attention).", _png(_lines(results, ent, "Entropy / log T", "Attention entropy")), {}),
        Section("posembed", "Position-embedding similarity (paper Fig. 7 centre)",
                "Cosine similarity of each patch's position embedding to every patch's, in the grid's layout (prefix "
                "rows left out, whether or not the table has them); corr: its correlation with grid distance.",
                _png(plot_similarities(results)), {}),
        Section("norms", "Register and patch-token norms",
                "Mean output norm (before the final LayerNorm) of each kind of token, and the largest patch norm over "
                "the median: patch tokens many times the median are the artifacts registers absorb (Darcet et al., "
                "ICLR 2024).", _png(plot_norms(results)), {}),
    ]


def summary_rows(r: FamilyInsides) -> list[str]:
    """The table's cells for one model, formatted as the page shows them."""
    cfg, t = r.config, r.tokens
    prefix = ", ".join(f"{n} {k}" for k, n in t.counts.items() if k != "patches") or "none"
    pos = "-" if r.pos_summary is None else f"{r.pos_summary['correlation']:.3f}"
    reg = t.attention.get("registers")
    reg_norm = t.norms.get("registers")
    return [r.name, r.source, f"{cfg['depth']} x {cfg['embed_dim']}", prefix,
            f"{r.distance[0] / r.uniform_distance:.3f} -> {r.distance[-1] / r.uniform_distance:.3f}",
            f"{r.entropy[0] / r.uniform_entropy:.3f} -> {r.entropy[-1] / r.uniform_entropy:.3f}", pos,
            f"{t.attention['patches'][-1]:.3f}", "-" if reg is None else f"{reg[-1]:.3f}",
            "-" if reg_norm is None else f"{reg_norm[-1] / t.norms['patches'][-1]:.3f}",
            f"{100 * t.outlier_fraction[-1]:.1f}%", f"{t.max_norm_ratio[-1]:.2f}"]


HEADER = ["model", "source", "depth x width", "prefix tokens", "distance / uniform (first -> last)",
          "entropy / log T (first -> last)", "pos-emb corr with distance", "query -> patches (last)",
          "query -> registers (last)", "register / patch norm (last)", "high-norm patches (last)",
          "max patch norm / median (last)"]


def families_page(results: Sequence[FamilyInsides], skipped: dict[str, str] | None = None,
                  numbers: str = "families.json") -> str:
    """The whole page: what it compares, the summary table, the skipped checkpoints, the four figures."""
    if not results:
        raise ValueError("no models to compare")
    esc = html.escape
    rows = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in summary_rows(r)) + "</tr>" for r in results)
    body = [
        "<h1>vitlab: the ViT families side by side</h1>",
        f"<p>{len(results)} models; the random-init families measured on the same {results[0].num_images} noise "
        "images, checkpoints on their own. Random-init "
        "rows show what an architecture does before training; checkpoint rows what training made of it. 'query' is "
        "the class token, or the mean patch query for a model without one; 'last' is the last layer.</p>",
        "<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in HEADER) + f"</tr>{rows}</table>",
    ]
    if skipped:
        items = "".join(f"<li><code>{esc(k)}</code>: {esc(v)}</li>" for k, v in skipped.items())
        body.append(f"<p>Skipped (not on this machine; nothing is downloaded):</p><ul>{items}</ul>")
    return document("vitlab: ViT families", body, family_sections(results), numbers=numbers)
