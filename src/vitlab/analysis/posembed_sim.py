"""Cosine similarity of position embeddings (paper Fig. 7 centre).

For every patch position, the cosine similarity of its embedding to the embedding of every other patch,
kept in the grid's own layout: `sim[i, j]` is a (gh, gw) map for the patch in row i, column j. The paper
reads two things off it: nearby patches have similar embeddings, and a row/column structure appears. The
summary numbers below measure both, so a report can say whether a model learned the 2-D grid.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..models.posembed import sincos_2d
from ..models.vit import VisionTransformer


def position_embedding_grid(model: VisionTransformer) -> np.ndarray:
    """The patch rows of a model's position embeddings as a (gh, gw, D) grid.

    Learned tables drop their prefix-token rows (class, distillation, registers), if the table has any: a
    `no_embed_class` table (DeiT-III, DINOv2 with registers) has patch rows only. sincos2d tables are computed
    (they are not parameters).
    """
    gh, gw = model.cfg.grid_size
    if model.pos_embed is not None:  # learned
        table = model.pos_embed.detach()[0, model.cfg.pos_prefix_rows :]  # (N, D)
    elif model.cfg.pos_embed == "sincos2d":
        table = sincos_2d(gh, gw, model.cfg.embed_dim)  # (N, D)
    else:
        raise ValueError(f"model has no position embeddings (pos_embed={model.cfg.pos_embed!r})")
    return table.float().cpu().numpy().reshape(gh, gw, -1)


def pos_embed_similarity(table: np.ndarray | torch.Tensor) -> np.ndarray:
    """Cosine similarity of every patch's embedding to every other.

    Args:
        table: (gh, gw, D) embeddings on their grid.

    Returns:
        (gh, gw, gh, gw): `sim[i, j]` is the map of patch (i, j) against all patches.
    """
    t = np.asarray(table.detach().cpu() if isinstance(table, torch.Tensor) else table, dtype=np.float64)
    if t.ndim != 3:
        raise ValueError(f"expected a (gh, gw, D) grid of embeddings, got shape {t.shape}")
    gh, gw, d = t.shape
    x = t.reshape(gh * gw, d)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return (x @ x.T).reshape(gh, gw, gh, gw)


def similarity_by_distance(sim: np.ndarray) -> dict[str, Any]:
    """Summaries of a similarity grid that say whether it encodes 2-D position.

    Returns:
        A dict with `distance` (distinct Euclidean grid distances, 0 first), `mean_similarity` (mean over
        all pairs at that distance), `correlation` (Pearson correlation of similarity and distance over all
        pairs of distinct patches; strongly negative when nearby patches are similar), `same_row_or_column`
        and `other` (mean similarity of distinct pairs sharing a row or column vs the rest).
    """
    gh, gw = sim.shape[:2]
    ys, xs = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
    pos = np.stack([ys.ravel(), xs.ravel()], 1).astype(np.float64)  # (N, 2)
    dist = np.sqrt(((pos[:, None] - pos[None]) ** 2).sum(-1))  # (N, N)
    s = sim.reshape(gh * gw, gh * gw)
    key = np.round(dist, 6)
    distances = np.unique(key)
    means = [float(s[key == d].mean()) for d in distances]
    off = ~np.eye(gh * gw, dtype=bool)
    corr = float(np.corrcoef(s[off], dist[off])[0, 1]) if off.any() and np.ptp(dist[off]) > 0 else float("nan")
    aligned = (pos[:, None, 0] == pos[None, :, 0]) | (pos[:, None, 1] == pos[None, :, 1])
    same = s[aligned & off]
    other = s[~aligned]
    return {
        "distance": [float(d) for d in distances],
        "mean_similarity": means,
        "correlation": corr,
        "same_row_or_column": float(same.mean()) if same.size else float("nan"),
        "other": float(other.mean()) if other.size else float("nan"),
    }
