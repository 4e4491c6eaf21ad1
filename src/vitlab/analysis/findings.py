"""The numbers behind the paper's Sec. 4.5 figures, and the statements the paper reads off them, measured.

`analyze(model, images)` computes everything one report shows (arrays in an `AnalysisResult`); `findings(result)`
turns it into three yes/no statements with the numbers behind each. Nothing here draws or writes: see
`vitlab.analysis.plots` and `vitlab.analysis.report`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..models.vit import VisionTransformer
from .attention import AttentionAnalysis, analyze_attention
from .filters import FilterPCA, filter_pca
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
