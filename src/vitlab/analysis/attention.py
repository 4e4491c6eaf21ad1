"""Attention maps, mean attention distance (paper Fig. 7 right) and attention rollout (Fig. 6).

Memory stays bounded: `analyze_attention` walks the encoder block by block over a batch of images, asks
each block for its attention weights, reduces them at once (distance per head, one rollout product) and
drops them before the next block. At most one layer's (b, heads, T, T) maps and one (b, T, T) rollout
product are alive, so the cost grows with the batch size, not with the number of images or layers.

Choices, stated:
- Mean attention distance uses patch queries and patch keys only (the class token has no position in the
  image); each query's weights over the patch keys are renormalised to sum to one, so the number is the
  attention-weighted mean pixel distance between a query patch and the patches it reads from. Distances are
  Euclidean between patch centres, in pixels of the model's input (grid steps times P).
- Rollout (Abnar & Zuidema 2020): average the heads, add the identity for the residual, renormalise each
  row, multiply the layers from the first to the last. The map of an image is the class token's row over
  the patches, or for models without a class token the mean of the patch queries' rows; a distilled model
  (DeiT) also gets the distillation token's row.
- Prefix tokens ([class][distillation][registers], `model.num_prefix_tokens` of them) are never patches: the
  distance and the maps read the patch columns only, whatever the count; what the prefix tokens do is
  measured on its own (`vitlab.analysis.tokens`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from ..models.vit import VisionTransformer
from .tokens import TokenStats, layer_token_stats, query_row, summarize_token_stats


# -- closed-form pieces --------------------------------------------------------------------------------
def patch_distances(grid: tuple[int, int], patch_size: int) -> torch.Tensor:
    """Euclidean distance in pixels between the centres of every pair of patches.

    Returns:
        (N, N) with N = gh * gw, patches in raster order (row by row), as the model flattens them.
    """
    gh, gw = grid
    ys, xs = torch.meshgrid(torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64),
                            indexing="ij")
    pos = torch.stack([ys.flatten(), xs.flatten()], dim=1) * patch_size  # (N, 2) pixel coordinates
    return torch.cdist(pos, pos)  # (N, N)


def mean_attention_distance(
    attn: torch.Tensor, grid: tuple[int, int], patch_size: int, num_prefix_tokens: int = 1
) -> torch.Tensor:
    """Attention-weighted mean pixel distance between each patch query and the patch keys it attends to.

    Args:
        attn: (B, heads, T, T) attention weights of one layer, rows summing to one, T = prefix + gh * gw.
        grid: (gh, gw) patch grid.
        patch_size: P, pixels per grid step.
        num_prefix_tokens: Leading tokens without a position (the class token), left out.

    Returns:
        (B, heads): the distance averaged over the patch queries of each image.
    """
    n = grid[0] * grid[1]
    if attn.dim() != 4 or attn.shape[-1] != attn.shape[-2] or attn.shape[-1] != n + num_prefix_tokens:
        raise ValueError(
            f"expected attention of shape (B, heads, T, T) with T = {num_prefix_tokens} + {grid[0]}*{grid[1]}, "
            f"got {tuple(attn.shape)}"
        )
    dist = patch_distances(grid, patch_size).to(attn.device)  # (N, N)
    per_query = torch.empty((*attn.shape[:2], n), dtype=torch.float64, device=attn.device)  # (B, heads, N)
    for h in range(attn.shape[1]):  # one head at a time: float64 copies of (B, N, N), not (B, heads, N, N)
        a = attn[:, h, num_prefix_tokens:, num_prefix_tokens:].double()  # (B, N, N): patches only
        a = a / a.sum(-1, keepdim=True).clamp_min(1e-12)  # renormalise over the patch keys
        per_query[:, h] = (a * dist).sum(-1)
    return per_query.mean(-1)  # (B, heads)


def rollout_step(rollout: torch.Tensor | None, attn: torch.Tensor) -> torch.Tensor:
    """Fold one more layer into an attention rollout.

    Args:
        rollout: (B, T, T) product of the layers so far, or None before the first layer.
        attn: (B, heads, T, T) this layer's attention weights.

    Returns:
        (B, T, T): A_l @ rollout with A_l = rownorm(mean_heads(attn) + I).
    """
    a = attn.mean(1).double()  # (B, T, T): heads averaged
    a = a + torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)  # the residual connection
    a = a / a.sum(-1, keepdim=True)  # rows sum to one again
    return a if rollout is None else a @ rollout


def attention_rollout(attns: Iterable[torch.Tensor]) -> torch.Tensor:
    """Rollout of a stack of layers, first layer first: each (B, heads, T, T) -> (B, T, T)."""
    result = None
    for attn in attns:
        result = rollout_step(result, attn)
    if result is None:
        raise ValueError("attention_rollout needs at least one layer")
    return result


def token_maps(rows: torch.Tensor, grid: tuple[int, int], num_prefix_tokens: int,
               query: int | None = 0) -> torch.Tensor:
    """What the model's output reads from each patch, as images over the grid.

    Args:
        rows: (..., T, T) attention or rollout matrices.
        grid: (gh, gw).
        num_prefix_tokens: Tokens before the patches (class, distillation, registers).
        query: The row to read (0: the class token, 1: a DeiT model's distillation token), or None for the mean
            of the patch queries' rows (models without a class token). Without prefix tokens it is always the
            mean of the patch rows.

    Returns:
        (..., gh, gw): weights on the patch keys (not renormalised).
    """
    if num_prefix_tokens and query is not None:
        q = rows[..., query, :]  # (..., T)
    else:
        q = rows[..., num_prefix_tokens:, :].mean(-2)  # (..., T): mean of the patch queries
    return q[..., num_prefix_tokens:].reshape(*q.shape[:-1], *grid)


# -- walking a model one layer at a time -----------------------------------------------------------------
def iter_blocks(model: VisionTransformer, images: torch.Tensor
                ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """Run the encoder on `images`, yielding (layer index, (B, T, D) block output, (B, heads, T, T) attention)
    one block at a time (the block output is the residual stream, before the final LayerNorm)."""
    x, _ = model.embed(images)  # (B, prefix + N, D): Eq. 1
    for i, block in enumerate(model.blocks):
        x, attn = block(x, return_attn=True)
        assert attn is not None
        yield i, x, attn


def iter_attention(model: VisionTransformer, images: torch.Tensor) -> Iterator[tuple[int, torch.Tensor]]:
    """Run the encoder on `images`, yielding (layer index, (B, heads, T, T) attention) one block at a time.

    Every block takes the explicit softmax path here (all layers are wanted); the caller should reduce each
    map before asking for the next so that only one layer is held. Uses the model's own blocks, so the result
    equals `model.forward_attention(images)`'s maps.
    """
    for i, _, attn in iter_blocks(model, images):
        yield i, attn


class BatchReduction(NamedTuple):
    """What `reduce_batch` keeps of one batch (CPU tensors owning their memory).

    Attributes:
        distance: (b, L, heads) mean attention distance.
        rollout: (b, gh, gw) rollout maps of the class token (mean patch query without one).
        layer_maps: {layer: (b, heads, gh, gw)} single-layer maps of the kept layers.
        rollout_dist: (b, gh, gw) rollout maps of the distillation token (DeiT), else None.
        tokens: Per-layer token statistics (`vitlab.analysis.tokens.layer_token_stats`), each (b, L).
    """

    distance: torch.Tensor
    rollout: torch.Tensor
    layer_maps: dict[int, torch.Tensor]
    rollout_dist: torch.Tensor | None
    tokens: dict[str, torch.Tensor]


@torch.no_grad()
def reduce_batch(
    model: VisionTransformer, batch: torch.Tensor, grid: tuple[int, int], keep_layers: Iterable[int] = ()
) -> BatchReduction:
    """One batch through the encoder, each layer's attention reduced as soon as it exists (see `BatchReduction`)."""
    prefix, P = model.num_prefix_tokens, model.patch_embed.pixel_patch
    query = query_row(model.cfg)
    keep = set(keep_layers)
    per_layer = torch.empty(batch.shape[0], len(model.blocks), model.cfg.num_heads, dtype=torch.float64)
    rollout, kept = None, {}
    stats: dict[str, list[torch.Tensor]] = {}
    for i, x, attn in iter_blocks(model, batch):
        per_layer[:, i] = mean_attention_distance(attn, grid, P, prefix).cpu()
        rollout = rollout_step(rollout, attn)  # (b, T, T)
        for name, value in layer_token_stats(x, attn, model.cfg).items():
            stats.setdefault(name, []).append(value.cpu())
        if i in keep:
            # clone: a view would keep this layer's whole (b, heads, T, T) tensor alive
            kept[i] = token_maps(attn, grid, prefix, query).float().cpu().clone()  # (b, heads, gh, gw)
        del attn, x  # one layer at a time
    if rollout is None:
        raise ValueError("the model has no layers")
    dist = token_maps(rollout, grid, prefix, 1).float().cpu().clone() if model.cfg.distilled else None
    return BatchReduction(per_layer, token_maps(rollout, grid, prefix, query).float().cpu().clone(), kept, dist,
                          {k: torch.stack(v, 1) for k, v in stats.items()})


@dataclass
class AttentionAnalysis:
    """What `analyze_attention` measures over a set of images (numpy arrays, ready to plot or save).

    Attributes:
        mean_distance: (L, heads) mean attention distance in pixels, averaged over images and patch queries.
        distance_per_image: (n, L, heads) the same before averaging over images.
        rollout: (n, gh, gw) rollout map of each image (class-token row, or mean patch row for gap models).
        rollout_dist: (n, gh, gw) the distillation token's rollout map of a DeiT model, else None.
        tokens: What the prefix tokens do, per layer: the query's attention to class / distillation / registers /
            patches, token norms and high-norm patch tokens, attention entropy (`vitlab.analysis.tokens`).
        layer_maps: layer -> (n, heads, gh, gw) single-layer, single-head maps of the asked-for layers.
        grid: (gh, gw) patch grid of the analysed images.
        patch_size: P.
        uniform_distance: mean distance of uniform attention on this grid: the "global" reference.
    """

    mean_distance: np.ndarray
    distance_per_image: np.ndarray
    rollout: np.ndarray
    grid: tuple[int, int]
    patch_size: int
    uniform_distance: float
    layer_maps: dict[int, np.ndarray] = field(default_factory=dict)
    rollout_dist: np.ndarray | None = None
    tokens: TokenStats | None = None


@torch.no_grad()
def analyze_attention(
    model: VisionTransformer,
    images: torch.Tensor | Iterable[torch.Tensor],
    batch_size: int = 16,
    layer_maps: Sequence[int] = (),
    device: torch.device | str | None = None,
) -> AttentionAnalysis:
    """Mean attention distance per layer and head, rollout maps and optional per-layer maps, memory-bounded.

    Args:
        model: A vitlab ViT (put in eval mode here; restored afterwards).
        images: (n, C, H, W) normalised images, or an iterable of such batches.
        batch_size: Images per forward pass when `images` is a tensor; bounds the memory.
        layer_maps: Layers (negative counts from the end) whose per-head maps to keep.
        device: Where to run; defaults to the model's device.
    """
    device = torch.device(device) if device is not None else next(model.parameters()).device
    wanted = sorted(model.layer_indices(layer_maps))
    P = model.patch_embed.pixel_patch
    batches = images.split(batch_size) if isinstance(images, torch.Tensor) else images
    was_training = model.training
    model.eval()
    dists, rolls, dist_rolls, stats = [], [], [], []
    maps: dict[int, list[torch.Tensor]] = {i: [] for i in wanted}
    grid: tuple[int, int] | None = None
    try:
        for batch in batches:
            batch = batch.to(device)
            if batch.dim() != 4:
                raise ValueError(f"expected images of shape (n, C, H, W), got {tuple(batch.shape)}")
            this_grid = (batch.shape[-2] // P, batch.shape[-1] // P)
            if grid is not None and this_grid != grid:
                raise ValueError(f"all images must share one size; got grids {grid} and {this_grid}")
            grid = this_grid
            r = reduce_batch(model, batch, grid, wanted)
            dists.append(r.distance)
            rolls.append(r.rollout)
            if r.rollout_dist is not None:
                dist_rolls.append(r.rollout_dist)
            stats.append(r.tokens)
            for i in wanted:
                maps[i].append(r.layer_maps[i])
    finally:
        model.train(was_training)
    if grid is None:
        raise ValueError("analyze_attention got no images")
    per_image = torch.cat(dists).numpy()  # (n, L, heads)
    uniform = float(patch_distances(grid, P).mean())
    return AttentionAnalysis(
        mean_distance=per_image.mean(0),
        distance_per_image=per_image,
        rollout=torch.cat(rolls).numpy(),
        layer_maps={i: torch.cat(m).numpy() for i, m in maps.items()},
        grid=grid,
        patch_size=P,
        uniform_distance=uniform,
        rollout_dist=torch.cat(dist_rolls).numpy() if dist_rolls else None,
        tokens=summarize_token_stats(stats, model.cfg, grid),
    )


def upsample_maps(maps: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(n, gh, gw) non-negative patch maps -> (n, H, W) bilinear upsampling, each divided by its maximum."""
    t = torch.as_tensor(maps, dtype=torch.float32)[:, None]  # (n, 1, gh, gw)
    up = torch.nn.functional.interpolate(t, size=size, mode="bilinear", align_corners=False)[:, 0]
    return (up / up.amax(dim=(-2, -1), keepdim=True).clamp_min(1e-12)).numpy()
