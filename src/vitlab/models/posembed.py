"""Position embeddings: fixed 2-D sin-cos tables and 2-D resampling of learned ones.

The paper (Sec. 3.2, Appendix D.4) fine-tunes at a higher resolution by interpolating the learned
1-D table on the 2-D patch grid. Several resampling modes exist in the ecosystem and give different
numbers, so we name them:

- ``"jax"``: Google's vit_jax, ``scipy.ndimage.zoom(order=1)``, which is bilinear with corners aligned.
- ``"bilinear"``: ``F.interpolate(mode="bilinear", align_corners=False)``.
- ``"bicubic"``: timm's ``resample_abs_pos_embed`` (bicubic, antialiased, corners not aligned); also DINOv2's
  ``interpolate_pos_encoding`` as its register models (``dinov2_vit*14_reg``) are built (antialias, no offset).
- ``"dinov2"``: DINOv2's ``interpolate_pos_encoding`` as its models without registers are built: plain bicubic
  (no antialiasing) with the output size given as a scale factor (n' + 0.1) / n, so the sampling positions are
  those of a grid of n' + 0.1 cells, not n' (the "interpolate_offset" of facebookresearch/dino issue 8).
- ``"hf"``: transformers' ``interpolate_pos_encoding`` (ViT, DINOv2): plain bicubic to the output size, no
  antialiasing (PyTorch's antialiased bicubic uses another kernel, so this differs from "bicubic" even upwards).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .config import RESIZE_MODES

DINOV2_OFFSET = 0.1  # DinoVisionTransformer(interpolate_offset=0.1), the default of its models without registers


def sincos_2d(grid_h: int, grid_w: int, dim: int, temperature: float = 10_000.0) -> torch.Tensor:
    """Fixed 2-D sin-cos position embeddings of big_vision's ``posemb_sincos_2d``.

    Returns:
        (grid_h * grid_w, dim): rows in raster order; columns [sin(x), cos(x), sin(y), cos(y)].
    """
    if dim % 4:
        raise ValueError(f"sincos 2-D embeddings need dim divisible by 4, got {dim}")
    y, x = torch.meshgrid(torch.arange(grid_h, dtype=torch.float32), torch.arange(grid_w, dtype=torch.float32),
                          indexing="ij")
    q = dim // 4
    omega = torch.arange(q, dtype=torch.float32) / max(q - 1, 1)
    omega = 1.0 / temperature**omega  # (D/4,)
    y = y.flatten()[:, None] * omega[None, :]  # (N, D/4)
    x = x.flatten()[:, None] * omega[None, :]
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)  # (N, D)


def infer_grid(num_patches: int) -> tuple[int, int]:
    """The square grid of a table of ``num_patches`` rows (non-square grids must be given explicitly)."""
    side = math.isqrt(num_patches)
    if side * side != num_patches:
        raise ValueError(
            f"position embedding with {num_patches} patch rows is not a square grid; pass its grid size explicitly"
        )
    return (side, side)


def resample_grid(grid: torch.Tensor, new_size: tuple[int, int], mode: str = "bicubic") -> torch.Tensor:
    """Resample a (1, gh, gw, D) or (gh, gw, D) grid of embeddings to ``new_size`` = (gh', gw')."""
    if mode not in RESIZE_MODES:
        raise ValueError(f"unknown position-embedding resize mode {mode!r}; choose from {RESIZE_MODES}")
    squeeze = grid.dim() == 3
    if squeeze:
        grid = grid[None]
    if tuple(grid.shape[1:3]) == tuple(new_size):
        return grid[0] if squeeze else grid
    dtype = grid.dtype
    x = grid.permute(0, 3, 1, 2).float()  # (1, D, gh, gw)
    if mode == "jax":
        # scipy.ndimage.zoom(order=1, grid_mode=False) maps output i to input i*(n_in-1)/(n_out-1):
        # exactly bilinear interpolation with align_corners=True.
        x = F.interpolate(x, size=new_size, mode="bilinear", align_corners=True)
    elif mode == "bilinear":
        x = F.interpolate(x, size=new_size, mode="bilinear", align_corners=False)
    elif mode == "dinov2":
        # the output size is floor(n * (n' + 0.1) / n) = n'; the kernel maps output i to input (i + 0.5) / scale - 0.5
        scale = ((new_size[0] + DINOV2_OFFSET) / x.shape[2], (new_size[1] + DINOV2_OFFSET) / x.shape[3])
        x = F.interpolate(x, scale_factor=scale, mode="bicubic", align_corners=False)
        if tuple(x.shape[2:]) != tuple(new_size):  # cannot happen for grids of sane size; never return a wrong one
            raise ValueError(f"dinov2 resampling gave a {tuple(x.shape[2:])} grid, not {tuple(new_size)}")
    elif mode == "hf":
        x = F.interpolate(x, size=new_size, mode="bicubic", align_corners=False)
    else:
        x = F.interpolate(x, size=new_size, mode="bicubic", align_corners=False, antialias=True)
    x = x.permute(0, 2, 3, 1).to(dtype)  # (1, gh', gw', D)
    return x[0] if squeeze else x


def resample_pos_embed(
    pos_embed: torch.Tensor,
    new_size: tuple[int, int],
    old_size: tuple[int, int] | None = None,
    num_prefix_tokens: int = 1,
    mode: str = "bicubic",
) -> torch.Tensor:
    """Resample a learned (1, prefix + gh*gw, D) table to a new patch grid; the class token's row is kept.

    Args:
        pos_embed: The table, prefix rows (class token) first.
        new_size: Target grid (gh', gw').
        old_size: Source grid; inferred as square when None.
        num_prefix_tokens: Rows that belong to prefix tokens and are copied unchanged.
        mode: One of RESIZE_MODES: "jax", "bilinear", "bicubic", "dinov2", "hf" (see module docstring).
    """
    if pos_embed.dim() == 2:
        pos_embed = pos_embed[None]
    prefix, patches = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    n = patches.shape[1]
    if old_size is None:
        old_size = infer_grid(n)
    if old_size[0] * old_size[1] != n:
        raise ValueError(f"position embedding has {n} patch rows, which does not fit grid {tuple(old_size)}")
    if tuple(old_size) == tuple(new_size):
        return pos_embed
    grid = patches.reshape(1, old_size[0], old_size[1], -1)
    grid = resample_grid(grid, new_size, mode)
    return torch.cat([prefix, grid.reshape(1, new_size[0] * new_size[1], -1)], dim=1)
