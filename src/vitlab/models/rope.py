"""2-D rotary position embeddings (RoPE) of the patch tokens, as EVA-02 and DINOv3 use them.

RoPE (RoFormer, Su et al. 2021) encodes a token's position by turning pairs of its query and key channels by angles
proportional to the position, so that q . k depends on the offset between the two tokens. The 2-D form splits a
head's d channels in halves, one per axis of the patch grid, each with d/4 frequencies. The two variants differ in
the positions, the frequencies and how the channel pairs are laid out:

    eva02   EVA-02 (Fang et al. 2023; timm's RotaryEmbeddingCat): positions are the patch indices 0..g-1, or with a
            reference grid r, index * r / g (the grid spans r patches at every input size); frequency i of an axis
            is theta^(-i / (d/4)), theta 10000; pairs are adjacent channels (2j, 2j+1).
    dinov3  DINOv3 (Simeoni et al. 2025): positions are the patch centres normalised to [-1, 1] per axis,
            (index + 0.5) / g * 2 - 1; angle 2 pi pos / theta^(i / (d/4)), theta 100; pairs are channels j and
            j + d/2 (the "rotate half" layout).

The angles of an axis are [rows' d/4 | columns' d/4]; each is used for one pair of channels. Prefix tokens (class,
registers) are not turned. One `RoPE` module serves every block of a model: `VisionTransformer.embed` tells it the
patch grid of the images being run (`set_grid`), and each block's attention turns its q and k with the tables of
that grid (so other input sizes work). The tables are computed in float32 once per grid and device; the turned q
and k are cast back to their own dtype.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import ViTConfig


class RoPE(nn.Module):
    """The rotary embedding of a ViTConfig with `rope` set (one per model, shared by the blocks; no tensors of
    its own). Not thread-safe across concurrent forwards of different input sizes: the grid is per call."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        if cfg.rope is None:
            raise ValueError("RoPE needs a ViTConfig with rope set")
        self.kind = cfg.rope
        self.head_dim = cfg.head_dim
        self.theta = cfg.rope_base
        self.ref_grid = cfg.rope_ref_grid
        self.num_prefix_tokens = cfg.num_prefix_tokens
        self.half_layout = cfg.rope == "dinov3"  # DINOv3 pairs channel j with j + d/2; EVA-02 pairs 2j with 2j + 1
        self.grid: tuple[int, int] | None = None
        self._tables: tuple[tuple[int, int], torch.device, torch.Tensor, torch.Tensor] | None = None

    def extra_repr(self) -> str:
        return f"{self.kind}, theta={self.theta:g}, ref_grid={self.ref_grid}, prefix={self.num_prefix_tokens}"

    def set_grid(self, grid: tuple[int, int]) -> None:
        """The (rows, cols) patch grid of the tokens the blocks are about to see."""
        self.grid = (int(grid[0]), int(grid[1]))

    def angles(self, grid: tuple[int, int]) -> torch.Tensor:
        """(rows * cols, d/2) float32 angles, row-major over the grid: [row-axis d/4 | column-axis d/4]."""
        n = self.head_dim // 4
        i = torch.arange(n, dtype=torch.float32)
        assert self.theta is not None
        if self.kind == "eva02":
            freqs = 1.0 / self.theta ** (i / n)  # (n,)
            axes = [torch.arange(g, dtype=torch.float32) for g in grid]
            if self.ref_grid is not None:
                axes = [a / g * r for a, g, r in zip(axes, grid, self.ref_grid, strict=True)]
        else:  # dinov3: a full turn per period theta^(i / (d/4)), positions in [-1, 1]
            freqs = 2 * math.pi / self.theta ** (i / n)
            axes = [(torch.arange(g, dtype=torch.float32) + 0.5) / g * 2 - 1 for g in grid]
        pos = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 2)  # (N, 2): (row, col)
        return (pos[:, :, None] * freqs).reshape(pos.shape[0], 2 * n)  # (N, d/2)

    def tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), each (N, d) float32 on `device`, for the grid last set; cached per grid and device."""
        if self.grid is None:
            raise RuntimeError("RoPE: no patch grid set; run the blocks after VisionTransformer.embed (it sets it)")
        cached = self._tables
        if cached is not None and cached[0] == self.grid and cached[1] == device:
            return cached[2], cached[3]
        a = self.angles(self.grid)
        a = torch.cat([a, a], dim=-1) if self.half_layout else a.repeat_interleave(2, dim=-1)  # (N, d): pair layout
        cos, sin = a.cos().to(device), a.sin().to(device)
        self._tables = (self.grid, device, cos, sin)
        return cos, sin

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Turn the patch tokens of q and k, each (B, heads, prefix + N, d); the prefix tokens pass unchanged."""
        cos, sin = self.tables(q.device)
        p = self.num_prefix_tokens
        if q.shape[-2] - p != cos.shape[0]:
            raise RuntimeError(f"RoPE: {q.shape[-2]} tokens with {p} prefix tokens, but the grid set is "
                               f"{self.grid} ({cos.shape[0]} patches); run the blocks on VisionTransformer.embed's "
                               "output")
        return self._turn(q, cos, sin, p), self._turn(k, cos, sin, p)

    def _turn(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, p: int) -> torch.Tensor:
        patches = x[..., p:, :]
        if self.half_layout:  # (x1, x2) -> (-x2, x1) over the two halves
            x1, x2 = patches.chunk(2, dim=-1)
            partner = torch.cat([-x2, x1], dim=-1)
        else:  # (x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)
            partner = torch.stack([-patches[..., 1::2], patches[..., 0::2]], dim=-1).flatten(-2)
        turned = (patches * cos + partner * sin).to(x.dtype)
        return torch.cat([x[..., :p, :], turned], dim=-2) if p else turned
