"""Principal components of the patch embedding E (paper Fig. 7 left).

E maps each flattened C x P x P patch to D dimensions; its D rows are D filters. PCA over those filters
(each filter one sample, centred) gives directions in patch space, shown as P x P images: the paper finds
"plausible basis functions for a low-dimensional representation of the fine structure within each patch".
numpy's SVD does the work; a component's sign is arbitrary, so we fix it by making its largest-magnitude
entry positive.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..models.vit import VisionTransformer


@dataclass
class FilterPCA:
    """Top principal components of the patch-embedding filters.

    Attributes:
        components: (K, C, P, P) unit-norm directions in patch space, largest variance first.
        explained_variance: (K,) variance of the filters along each component (ddof=1).
        explained_variance_ratio: (K,) share of the filters' total variance.
    """

    components: np.ndarray
    explained_variance: np.ndarray
    explained_variance_ratio: np.ndarray


def patch_embedding_filters(model: VisionTransformer) -> np.ndarray:
    """E of a model as (D, C, P, P) filters (the stride-P convolution's kernel)."""
    if model.patch_embed.backbone is not None:
        raise ValueError("a hybrid's patch embedding reads ResNet feature maps, not pixels: it has no image "
                         "filters (Fig. 7 left is for the plain ViT)")
    return model.patch_embed.proj.weight.detach().float().cpu().numpy()


def filter_pca(filters: np.ndarray | torch.Tensor | VisionTransformer, num_components: int = 28) -> FilterPCA:
    """PCA of the patch-embedding filters.

    Args:
        filters: (D, C, P, P) filters (or a model, whose E is used).
        num_components: K, how many components to keep (the paper shows 28); capped at the rank available.
    """
    if isinstance(filters, VisionTransformer):
        filters = patch_embedding_filters(filters)
    w = np.asarray(filters.detach().cpu() if isinstance(filters, torch.Tensor) else filters, dtype=np.float64)
    if w.ndim != 4:
        raise ValueError(f"expected filters of shape (D, C, P, P), got {w.shape}")
    if num_components < 1:
        raise ValueError(f"num_components must be at least 1, got {num_components}")
    d = w.shape[0]
    if d < 2:
        raise ValueError("PCA needs at least two filters")
    x = w.reshape(d, -1)  # (D, C*P*P): one filter per row
    x = x - x.mean(axis=0, keepdims=True)
    _, s, vt = np.linalg.svd(x, full_matrices=False)  # vt: (min(D, CPP), CPP)
    k = min(num_components, vt.shape[0])
    comps = vt[:k]  # (K, C*P*P)
    signs = np.sign(comps[np.arange(k), np.abs(comps).argmax(axis=1)])
    comps = comps * signs[:, None]
    var = s**2 / (d - 1)
    return FilterPCA(
        components=comps.reshape(k, *w.shape[1:]),
        explained_variance=var[:k],
        explained_variance_ratio=var[:k] / var.sum(),
    )


def components_to_images(components: np.ndarray) -> np.ndarray:
    """(K, C, P, P) components -> (K, P, P, C) images in [0, 1], each scaled on its own (C is 1 or 3)."""
    img = np.moveaxis(np.asarray(components, dtype=np.float64), 1, -1)  # (K, P, P, C)
    lo = img.min(axis=(1, 2, 3), keepdims=True)
    hi = img.max(axis=(1, 2, 3), keepdims=True)
    return (img - lo) / np.maximum(hi - lo, 1e-12)
