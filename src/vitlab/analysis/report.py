"""The paper's figures as PNG, their numbers as JSON, and one self-contained HTML page.

`analyze(model, images)` computes everything (returning arrays); `write_report(result, out_dir)` draws and
writes it. Figures follow the paper: Fig. 7 left (filters), centre (position-embedding similarity), right
(mean attention distance), Fig. 6 (attention rollout). Files are written atomically and never replace
existing ones unless asked to.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..model import VisionTransformer
from .attention import AttentionAnalysis, analyze_attention, upsample_maps
from .filters import FilterPCA, components_to_images, filter_pca
from .posembed_sim import pos_embed_similarity, position_embedding_grid, similarity_by_distance

# Thresholds of the automatic verdicts, as fractions of the mean distance of uniform attention on the grid.
LOCAL_FRACTION = 0.25  # a head whose mean distance is below this share of uniform attention's is "local"
GLOBAL_FRACTION = 0.75  # above this share it is "global"
POS_GAP = 0.2  # neighbour minus far-pair cosine similarity; a random table gives about 0
GROWTH_FRACTION = 0.05  # last-third minus first-third layer mean distance must exceed this share to count as growth


@dataclass
class AnalysisResult:
    """Everything `vitlab analyze` shows, as arrays.

    Attributes:
        images: (n, H, W, C) the analysed images scaled to [0, 1] for display.
        filters: PCA of the patch embedding.
        pos_similarity: (gh, gw, gh, gw) cosine similarity of position embeddings; None without any.
        attention: Mean attention distance, rollout and per-layer maps.
        config: The model's config as a dict.
        source: Where the model came from (checkpoint path), for the report's title.
    """

    images: np.ndarray
    filters: FilterPCA | None
    pos_similarity: np.ndarray | None
    attention: AttentionAnalysis
    config: dict[str, Any]
    source: str = ""
    findings: dict[str, Any] = field(default_factory=dict)


def display_images(images: torch.Tensor) -> np.ndarray:
    """(n, C, H, W) normalised images -> (n, H, W, C) in [0, 1], each min-max scaled (any normalisation)."""
    x = images.detach().float().cpu()
    lo = x.amin(dim=(1, 2, 3), keepdim=True)
    hi = x.amax(dim=(1, 2, 3), keepdim=True)
    return ((x - lo) / (hi - lo).clamp_min(1e-12)).permute(0, 2, 3, 1).numpy()


def analyze(
    model: VisionTransformer,
    images: torch.Tensor,
    batch_size: int = 16,
    layer_maps: Sequence[int] = (),
    num_components: int = 28,
    source: str = "",
) -> AnalysisResult:
    """Compute every figure's numbers for `model` on (n, C, H, W) normalised `images`."""
    if images.dim() != 4 or images.shape[0] == 0:
        raise ValueError(f"expected a non-empty batch of images (n, C, H, W), got {tuple(images.shape)}")
    pos = None
    if model.cfg.pos_embed != "none":
        pos = pos_embed_similarity(position_embedding_grid(model))
    result = AnalysisResult(
        images=display_images(images),
        # A hybrid's E reads ResNet features, not pixels: it has no image-like filters to show (Fig. 7 is
        # drawn for the plain ViT only).
        filters=filter_pca(model, num_components) if model.patch_embed.backbone is None else None,
        pos_similarity=pos,
        attention=analyze_attention(model, images, batch_size=batch_size, layer_maps=layer_maps),
        config=model.cfg.to_dict(),
        source=source,
    )
    result.findings = findings(result)
    return result


def findings(result: AnalysisResult) -> dict[str, Any]:
    """The three things the paper reads off these figures, measured, with a yes/no for each.

    - pos_embed_2d: nearby patches have similar embeddings: 1-step neighbours are more similar than the
      farthest quarter of pairs by more than POS_GAP (cosine), and similarity correlates negatively with
      grid distance. (A Pearson threshold alone underrates the row/column cross the paper describes: far
      patches in the same row stay similar.)
    - distance_grows_with_depth: the per-layer mean distance has a rank correlation with depth above 0.5 and
      the last third of layers attends farther than the first third by more than GROWTH_FRACTION of uniform
      attention's distance.
    - early_local_and_global: among the heads of the first third of layers, at least one is local (below
      LOCAL_FRACTION of uniform attention's distance) and one global (above GLOBAL_FRACTION).
    """
    out: dict[str, Any] = {}
    if result.pos_similarity is not None:
        s = similarity_by_distance(result.pos_similarity)
        d, m = np.asarray(s["distance"]), np.asarray(s["mean_similarity"])
        near = float(m[(d > 0) & (d <= 1.0 + 1e-9)].mean()) if ((d > 0) & (d <= 1 + 1e-9)).any() else float("nan")
        far = float(m[d >= np.quantile(d[d > 0], 0.75)].mean()) if (d > 0).any() else float("nan")
        out["pos_embed_2d"] = {
            "yes": bool(s["correlation"] < 0 and near - far > POS_GAP),
            "correlation_with_distance": s["correlation"],
            "neighbour_similarity": near,
            "far_similarity": far,
            "same_row_or_column": s["same_row_or_column"],
            "other": s["other"],
        }
    att = result.attention
    md = att.mean_distance  # (L, heads)
    L = md.shape[0]
    per_layer = md.mean(1)
    third = max(1, L // 3)
    rho = _spearman(np.arange(L), per_layer) if L > 1 else float("nan")
    rise = float(per_layer[-third:].mean() - per_layer[:third].mean())
    out["distance_grows_with_depth"] = {
        "yes": bool(L > 1 and rho > 0.5 and rise > GROWTH_FRACTION * att.uniform_distance),
        "spearman_layer_vs_mean_distance": rho,
        "layer_mean_distance": per_layer.tolist(),
        "first_third_mean": float(per_layer[:third].mean()),
        "last_third_mean": float(per_layer[-third:].mean()),
    }
    early = md[:third].ravel()
    u = att.uniform_distance
    out["early_local_and_global"] = {
        "yes": bool(early.min() < LOCAL_FRACTION * u and early.max() > GLOBAL_FRACTION * u),
        "early_layers": third,
        "min_head_distance": float(early.min()),
        "max_head_distance": float(early.max()),
        "uniform_attention_distance": u,
        "local_below": LOCAL_FRACTION * u,
        "global_above": GLOBAL_FRACTION * u,
    }
    return out


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Rank correlation (average ranks for ties), without scipy at run time."""

    def ranks(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x))
        for v in np.unique(x):  # ties share their mean rank
            r[x == v] = r[x == v].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


# -- figures ---------------------------------------------------------------------------------------------
def _figure(w: float, h: float):
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


def plot_filters(pca: FilterPCA, ncols: int = 7):
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


def plot_pos_similarity(sim: np.ndarray):
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


def plot_attention_distance(mean_distance: np.ndarray, uniform_distance: float | None = None):
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
    from matplotlib import colormaps

    return colormaps[name]


def plot_rollout(images: np.ndarray, maps: np.ndarray, max_images: int = 8, ncols: int = 2):
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


def plot_layer_maps(images: np.ndarray, maps: np.ndarray, layer: int, max_images: int = 4):
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


# -- writing -----------------------------------------------------------------------------------------------
_UMASK = os.umask(0)
os.umask(_UMASK)


def write_atomic(path: Path, data: bytes, overwrite: bool) -> None:
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists; pass --force (overwrite=True) to replace it")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename makes it visible
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def _tolist(x: np.ndarray, decimals: int = 6) -> list:
    return np.round(np.asarray(x, dtype=np.float64), decimals).tolist()


def report_files(result: AnalysisResult) -> list[str]:
    """Names of the files `write_report` writes for `result`."""
    names = ["attention_distance", "attention_rollout"]
    if result.filters is not None:
        names.insert(0, "filters")
    if result.pos_similarity is not None:
        names.insert(1, "posembed_similarity")
    names += [f"attention_layer{i + 1}" for i in sorted(result.attention.layer_maps)]
    return [f"{n}.{ext}" for n in names for ext in ("png", "json")] + ["findings.json", "report.html"]


def write_report(result: AnalysisResult, out_dir: str | Path, overwrite: bool = False) -> list[Path]:
    """Write each figure as PNG, its numbers as JSON, and report.html with the PNGs inlined.

    Raises:
        FileExistsError: one of the files exists and `overwrite` is False (nothing is written then).
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"output {out} exists and is not a directory")
    if not overwrite:
        clash = [n for n in report_files(result) if (out / n).exists()]
        if clash:
            raise FileExistsError(f"{out} already holds {', '.join(clash)}; pass --force to replace them")
    out.mkdir(parents=True, exist_ok=True)
    att = result.attention
    sections: list[tuple[str, str, str, bytes]] = []  # (stem, title, caption, png)

    figs_json: dict[str, dict] = {}
    if result.filters is not None:
        sections.append(("filters", "Patch-embedding filters (Fig. 7 left)",
                         "Top principal components of the patch projection E, each shown as a P x P image.",
                         _png(plot_filters(result.filters))))
        figs_json["filters"] = {
            "components": _tolist(result.filters.components),
            "explained_variance": _tolist(result.filters.explained_variance),
            "explained_variance_ratio": _tolist(result.filters.explained_variance_ratio),
            "shape": "(K, C, P, P)",
        }
    if result.pos_similarity is not None:
        sections.append(("posembed_similarity", "Position-embedding similarity (Fig. 7 centre)",
                         "Tile (row i, column j): cosine similarity of patch (i, j)'s position embedding to "
                         "every patch's, in the grid's layout.", _png(plot_pos_similarity(result.pos_similarity))))
        figs_json["posembed_similarity"] = {
            "similarity": _tolist(result.pos_similarity, 5),
            "shape": "(gh, gw, gh, gw)",
            **similarity_by_distance(result.pos_similarity),
        }
    sections.append(("attention_distance", "Mean attention distance (Fig. 7 right)",
                     f"Attention-weighted mean pixel distance between patch queries and patch keys (class token "
                     f"left out), averaged over {len(result.images)} images; dashed: uniform attention "
                     f"({att.uniform_distance:.1f} px).",
                     _png(plot_attention_distance(att.mean_distance, att.uniform_distance))))
    figs_json["attention_distance"] = {
        "mean_distance": _tolist(att.mean_distance),
        "std_over_images": _tolist(att.distance_per_image.std(0)),
        "shape": "(layers, heads)",
        "units": "pixels of the model input",
        "uniform_attention_distance": att.uniform_distance,
        "patch_size": att.patch_size,
        "grid": list(att.grid),
        "num_images": len(result.images),
    }
    sections.append(("attention_rollout", "Attention rollout (Fig. 6)",
                     "Input, input weighted by the rollout of attention through all layers (heads averaged, "
                     "identity added, rows renormalised), and the rollout map; "
                     + ("from the class token." if result.config.get("class_token") else
                        "mean over the patch queries (no class token)."),
                     _png(plot_rollout(result.images, att.rollout))))
    figs_json["attention_rollout"] = {"maps": _tolist(att.rollout), "shape": "(n, gh, gw)", "grid": list(att.grid)}
    for i in sorted(att.layer_maps):
        stem = f"attention_layer{i + 1}"
        sections.append((stem, f"Layer {i + 1}, each head",
                         "Attention of the class token (or mean patch query) to each patch, per head.",
                         _png(plot_layer_maps(result.images, att.layer_maps[i], i))))
        figs_json[stem] = {"maps": _tolist(att.layer_maps[i]), "shape": "(n, heads, gh, gw)", "layer": i}

    written = []
    for stem, _, _, png in sections:
        write_atomic(out / f"{stem}.png", png, overwrite)
        write_atomic(out / f"{stem}.json", json.dumps(figs_json[stem]).encode(), overwrite)
        written += [out / f"{stem}.png", out / f"{stem}.json"]
    meta = {"source": result.source, "config": result.config, "num_images": len(result.images),
            "findings": result.findings}
    write_atomic(out / "findings.json", json.dumps(meta, indent=2).encode(), overwrite)
    write_atomic(out / "report.html", _html(result, sections).encode(), overwrite)
    return [*written, out / "findings.json", out / "report.html"]


def _html(result: AnalysisResult, sections: list[tuple[str, str, str, bytes]]) -> str:
    esc = html.escape
    rows = []
    for name, f in result.findings.items():
        nums = ", ".join(f"{k}={_fmt(v)}" for k, v in f.items() if k != "yes" and not isinstance(v, list))
        rows.append(f"<tr><td>{esc(name)}</td><td><b>{'yes' if f['yes'] else 'no'}</b></td><td>{esc(nums)}</td></tr>")
    cfg = result.config
    body = [
        f"<h1>vitlab analyze: {esc(result.source or cfg.get('name') or 'model')}</h1>",
        f"<p>{esc(str(cfg.get('name') or ''))} img_size={esc(str(cfg['img_size']))} patch={cfg['patch_size']} "
        f"D={cfg['embed_dim']} depth={cfg['depth']} heads={cfg['num_heads']} pos_embed={esc(cfg['pos_embed'])} "
        f"pool={esc(cfg['pool'])}; {len(result.images)} images.</p>",
        "<h2>What the paper describes (Sec. 4.5)</h2><table><tr><th>finding</th><th>holds</th><th>numbers</th></tr>",
        *rows,
        "</table>",
    ]
    for stem, title, caption, png in sections:
        b64 = base64.b64encode(png).decode()
        body.append(f'<h2 id="{stem}">{esc(title)}</h2><p>{esc(caption)} Numbers: <code>{stem}.json</code>.</p>'
                    f'<img alt="{esc(title)}" src="data:image/png;base64,{b64}">')
    style = ("body{font-family:sans-serif;max-width:1100px;margin:auto;padding:1em}img{max-width:100%}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>vitlab analyze</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>")


def _fmt(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)
