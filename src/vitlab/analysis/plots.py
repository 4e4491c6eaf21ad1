"""The paper's figures, drawn from `vitlab.analysis` arrays: Fig. 7 left (filters), centre (position-embedding
similarity), right (mean attention distance), Fig. 6 (attention rollout), per-layer attention maps, and what the
prefix tokens (class, distillation, registers) do per layer.

Each function returns a `matplotlib.figure.Figure` built without pyplot: no global state, no GUI, and
matplotlib's backend is never changed. Save one with `fig.savefig(path)`; show one in a notebook by returning it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..utils.extras import needs
from .attention import upsample_maps
from .filters import FilterPCA, components_to_images
from .tokens import TokenStats

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _figure(w: float, h: float) -> Figure:
    with needs("analysis", "the analysis figures"):
        from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    return Figure(figsize=(w, h), dpi=100, layout="constrained")


def _show(ax, img: np.ndarray, **kw) -> None:
    if img.ndim == 3 and img.shape[-1] == 1:
        ax.imshow(img[..., 0], cmap="gray", vmin=0, vmax=1, **kw)
    elif img.ndim == 3 and img.shape[-1] != 3:
        ax.imshow(img.mean(-1), cmap="gray", vmin=0, vmax=1, **kw)  # other channel counts: their mean
    else:
        ax.imshow(img, **kw)
    ax.set_xticks([])
    ax.set_yticks([])


def plot_filters(pca: FilterPCA, ncols: int = 7) -> Figure:
    """Fig. 7 left: principal components of E as P x P images."""
    imgs = components_to_images(pca.components)  # (K, P, P, C)
    k = len(imgs)
    ncols = min(ncols, k)
    nrows = -(-k // ncols)
    fig = _figure(1.1 * ncols, 1.1 * nrows + 0.4)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i < k:
            _show(ax, imgs[i], interpolation="nearest")
        else:
            ax.axis("off")
    kind = "RGB" if imgs.shape[-1] == 3 else ("greyscale" if imgs.shape[-1] == 1 else f"{imgs.shape[-1]}-channel")
    fig.suptitle(f"{kind} embedding filters (first {k} principal components)", fontsize=10)
    return fig


def similarity_mosaic(sim: np.ndarray, gap: int = 1) -> np.ndarray:
    """(gh, gw, gh, gw) -> one (gh*(gh+gap), gw*(gw+gap)) image of the maps in grid layout, NaN gaps."""
    gh, gw = sim.shape[:2]
    out = np.full((gh * (gh + gap) - gap, gw * (gw + gap) - gap), np.nan)
    for i in range(gh):
        for j in range(gw):
            out[i * (gh + gap) : i * (gh + gap) + gh, j * (gw + gap) : j * (gw + gap) + gw] = sim[i, j]
    return out


def plot_pos_similarity(sim: np.ndarray) -> Figure:
    """Fig. 7 centre: for each patch (in its grid place), its embedding's cosine similarity to all others."""
    gh, gw = sim.shape[:2]
    mosaic = similarity_mosaic(sim)
    side = min(16.0, max(6.0, 1.6 * max(gh, gw) * (max(gh, gw) + 1) / 110))  # >= ~1.6 screen pixels per cell
    fig = _figure(side * min(1.6, max(0.6, gw / gh)) + 1.0, side)
    ax = fig.add_subplot()
    im = ax.imshow(mosaic, cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    ax.set_xticks([j * (gw + 1) + gw / 2 - 0.5 for j in range(gw)], [str(j + 1) for j in range(gw)], fontsize=6)
    ax.set_yticks([i * (gh + 1) + gh / 2 - 0.5 for i in range(gh)], [str(i + 1) for i in range(gh)], fontsize=6)
    ax.set_xlabel("Input patch column")
    ax.set_ylabel("Input patch row")
    ax.set_title("Position embedding similarity", fontsize=10)
    fig.colorbar(im, ax=ax, label="Cosine similarity", shrink=0.8)
    return fig


def plot_attention_distance(mean_distance: np.ndarray, uniform_distance: float | None = None) -> Figure:
    """Fig. 7 right: each head's mean attention distance (pixels) against its layer."""
    L, H = mean_distance.shape
    fig = _figure(5.0, 4.0)
    ax = fig.add_subplot()
    cmap = _cmap("tab20" if H > 10 else "tab10")
    for h in range(H):
        ax.scatter(np.arange(1, L + 1), mean_distance[:, h], s=14, color=cmap(h % cmap.N), label=f"Head {h + 1}")
    if uniform_distance:
        ax.axhline(uniform_distance, color="grey", ls="--", lw=1, label="uniform attention")
    ax.set_xlabel("Network depth (layer)")
    ax.set_ylabel("Mean attention distance (pixels)")
    ax.set_xlim(0.5, L + 0.5)
    ax.set_ylim(bottom=0)
    if H <= 16:
        ax.legend(fontsize=6, ncol=2, loc="lower right")
    return fig


def _cmap(name: str):
    with needs("analysis", "the analysis figures"):
        from matplotlib import colormaps

    return colormaps[name]


def plot_rollout(images: np.ndarray, maps: np.ndarray, max_images: int = 8, ncols: int = 2) -> Figure:
    """Fig. 6: each input, the input weighted by its upsampled rollout map (as in the paper), and the map."""
    n = min(max_images, len(images))
    masks = upsample_maps(maps[:n], images.shape[1:3])  # (n, H, W), max 1
    lo = masks.min(axis=(1, 2), keepdims=True)
    masks = (masks - lo) / np.maximum(1 - lo, 1e-12)  # stretch to [0, 1] so the mask's contrast shows
    ncols = min(ncols, n)
    nrows = -(-n // ncols)
    fig = _figure(3.6 * ncols, 1.3 * nrows + 0.4)
    axes = fig.subplots(nrows, 3 * ncols, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for i in range(n):
        r, c = divmod(i, ncols)
        a_in, a_mask, a_heat = axes[r, 3 * c : 3 * c + 3]
        _show(a_in, images[i])
        _show(a_mask, images[i] * masks[i][..., None])
        _show(a_heat, images[i])
        a_heat.imshow(masks[i], cmap="jet", alpha=0.5, vmin=0, vmax=1)
        for ax in (a_in, a_mask, a_heat):
            ax.axis("on")
        if r == 0:
            a_in.set_title("Input", fontsize=8)
            a_mask.set_title("Attention", fontsize=8)
            a_heat.set_title("Rollout map", fontsize=8)
    fig.suptitle("Attention rollout (Abnar & Zuidema 2020)", fontsize=10)
    return fig


def plot_layer_maps(images: np.ndarray, maps: np.ndarray, layer: int, max_images: int = 4) -> Figure:
    """One layer's per-head maps (class-token row, or mean patch row), overlaid as heatmaps on the inputs."""
    n = min(max_images, len(images))
    H = maps.shape[1]
    fig = _figure(1.3 * (H + 1), 1.3 * n + 0.4)
    axes = fig.subplots(n, H + 1, squeeze=False)
    for i in range(n):
        _show(axes[i, 0], images[i])
        up = upsample_maps(maps[i], images.shape[1:3])  # (H, h, w)
        for h in range(H):
            _show(axes[i, h + 1], images[i])
            axes[i, h + 1].imshow(up[h], cmap="jet", alpha=0.5, vmin=0, vmax=1)
            if i == 0:
                axes[i, h + 1].set_title(f"head {h + 1}", fontsize=7)
    axes[0, 0].set_title("input", fontsize=7)
    fig.suptitle(f"Layer {layer + 1}: attention of each head", fontsize=10)
    return fig


_KIND_COLOURS = {"class": "tab:blue", "distillation": "tab:purple", "registers": "tab:red", "patches": "tab:green"}


def plot_token_stats(stats: TokenStats) -> Figure:
    """What the prefix tokens do per layer (`vitlab.analysis.tokens`): left, how the query's attention splits
    between the class / distillation / register tokens and the patches; right, the mean output norm of each kind
    of token, with the share of high-norm patch tokens (Darcet et al. 2024) on a second axis."""
    fig = _figure(9.0, 3.6)
    left, right = fig.subplots(1, 2)
    L = len(stats.entropy)
    layers = np.arange(1, L + 1)
    bottom = np.zeros(L)
    for kind, share in stats.attention.items():
        left.bar(layers, share, bottom=bottom, color=_KIND_COLOURS[kind], label=f"{kind} ({stats.counts[kind]})")
        bottom = bottom + share
    left.set_xlabel("Layer")
    left.set_ylabel(f"Share of the {stats.query}'s attention")
    left.set_ylim(0, 1)
    left.set_xticks(layers)
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=4)
    for kind, norm in stats.norms.items():
        right.plot(layers, norm, marker="o", ms=3, color=_KIND_COLOURS[kind], label=kind)
    right.set_xlabel("Layer")
    right.set_ylabel("Mean output norm")
    right.set_xticks(layers)
    twin = right.twinx()
    twin.plot(layers, 100 * stats.outlier_fraction, ls="--", color="black", label="high-norm patches")
    twin.set_ylabel(f"% patches > {stats.outlier_factor:g}x median norm (dashed)")
    twin.set_ylim(0, max(5.0, 120 * float(np.max(stats.outlier_fraction))))
    right.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=4)
    fig.suptitle("Prefix tokens and register / patch norms", fontsize=10)
    return fig
