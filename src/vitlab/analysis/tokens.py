"""What the prefix tokens do, layer by layer: the class / distillation / register tokens against the patches.

Registers (Darcet et al., "Vision Transformers Need Registers", ICLR 2024) are extra learned tokens that no output
reads; large ViTs trained without them repurpose a few low-information *patch* tokens as scratch space, and those
show up as patch tokens whose output norm is many times their neighbours'. With registers the high norms move to
the registers. So, per layer and averaged over images, this module measures:

- attention: the share of the query's attention (heads averaged) that goes to each kind of key: the class token,
  the distillation token (DeiT), the registers, the patches. The query is the class token, or for a model without
  one the mean of the patch queries.
- norms: the mean L2 norm of each kind of token in the block's output (the residual stream, before the final
  LayerNorm), and for the patches the share of "high-norm" tokens: norm above OUTLIER_FACTOR times the median
  patch norm of the same image and layer, and the largest norm over that median.
- entropy: the mean entropy (nats) of the patch queries' attention over all keys; uniform attention gives log T.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..models.config import ViTConfig

OUTLIER_FACTOR = 3.0  # a patch token is "high-norm" when its output norm exceeds this many times the median's
KINDS = ("class", "distillation", "registers", "patches")


def token_layout(cfg: ViTConfig) -> dict[str, slice]:
    """Where each kind of token sits in the sequence [class][distillation][registers][patches] (kinds present)."""
    out: dict[str, slice] = {}
    i = 0
    for kind, n in (("class", int(cfg.class_token)), ("distillation", int(cfg.distilled)),
                    ("registers", cfg.reg_tokens)):
        if n:
            out[kind] = slice(i, i + n)
            i += n
    out["patches"] = slice(i, None)
    return out


def query_row(cfg: ViTConfig) -> int | None:
    """The attention row that stands for the model's output: the class token (0), or None (the mean of the patch
    queries) for a model without one."""
    return 0 if cfg.class_token else None


@torch.no_grad()
def layer_token_stats(x: torch.Tensor, attn: torch.Tensor, cfg: ViTConfig) -> dict[str, torch.Tensor]:
    """One layer's statistics per image.

    Args:
        x: (B, T, D) the block's output.
        attn: (B, heads, T, T) the block's attention weights.
        cfg: The model's config (which prefix tokens it has).

    Returns:
        {"attn_<kind>", "norm_<kind>" for each kind present, "patch_outliers", "patch_max_ratio", "entropy"}: each
        a (B,) float64 tensor.
    """
    layout = token_layout(cfg)
    patches = layout["patches"]
    a = attn.mean(1).double()  # (B, T, T): heads averaged
    row = a[:, 0] if query_row(cfg) == 0 else a[:, patches].mean(1)  # (B, T): the query's attention
    norms = x.double().norm(dim=-1)  # (B, T)
    out = {}
    for kind, where in layout.items():
        out[f"attn_{kind}"] = row[:, where].sum(-1)
        out[f"norm_{kind}"] = norms[:, where].mean(-1)
    p = norms[:, patches]  # (B, N)
    median = p.median(-1).values.clamp_min(1e-12)  # (B,)
    out["patch_outliers"] = (p > OUTLIER_FACTOR * median[:, None]).double().mean(-1)
    out["patch_max_ratio"] = p.amax(-1) / median
    entropy = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
    for h in range(attn.shape[1]):  # one head at a time: float64 copies of (B, N, T), not (B, heads, N, T)
        q = attn[:, h, patches].double()  # the patch queries' rows over every key
        entropy += -(q * q.clamp_min(1e-30).log()).sum(-1).mean(-1)
    out["entropy"] = entropy / attn.shape[1]
    return out


@dataclass
class TokenStats:
    """`layer_token_stats` averaged over images: each array is (L,), one value per layer.

    Attributes:
        query: "class token" or "mean patch query": whose attention `attention` splits.
        attention: kind -> share of the query's attention to that kind of key (the kinds present sum to one).
        norms: kind -> mean output norm of that kind of token.
        outlier_fraction: share of patch tokens with norm > `outlier_factor` x the median patch norm.
        max_norm_ratio: the largest patch norm over the median patch norm.
        entropy: mean attention entropy of the patch queries (nats); `uniform_entropy` = log T is uniform attention's.
        counts: kind -> how many tokens of that kind the sequence has.
    """

    query: str
    attention: dict[str, np.ndarray]
    norms: dict[str, np.ndarray]
    outlier_fraction: np.ndarray
    max_norm_ratio: np.ndarray
    entropy: np.ndarray
    uniform_entropy: float
    outlier_factor: float = OUTLIER_FACTOR
    counts: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready numbers."""
        r = lambda a: np.round(np.asarray(a, dtype=np.float64), 6).tolist()  # noqa: E731
        return {"query": self.query, "counts": self.counts,
                "attention_share": {k: r(v) for k, v in self.attention.items()},
                "mean_norm": {k: r(v) for k, v in self.norms.items()},
                "patch_outlier_fraction": r(self.outlier_fraction), "patch_max_norm_ratio": r(self.max_norm_ratio),
                "outlier_factor": self.outlier_factor, "entropy": r(self.entropy),
                "uniform_entropy": self.uniform_entropy, "shape": "(layers,)"}


def summarize_token_stats(batches: Sequence[dict[str, torch.Tensor]], cfg: ViTConfig,
                          grid: tuple[int, int]) -> TokenStats:
    """Average the per-image (b, L) statistics of every batch into a `TokenStats`."""
    if not batches:
        raise ValueError("no batches to summarise")
    mean = {k: torch.cat([b[k] for b in batches]).mean(0).numpy() for k in batches[0]}
    layout = token_layout(cfg)
    n = grid[0] * grid[1]
    counts = {k: (n if k == "patches" else s.stop - s.start) for k, s in layout.items()}
    return TokenStats(
        query="class token" if query_row(cfg) == 0 else "mean patch query",
        attention={k: mean[f"attn_{k}"] for k in layout},
        norms={k: mean[f"norm_{k}"] for k in layout},
        outlier_fraction=mean["patch_outliers"],
        max_norm_ratio=mean["patch_max_ratio"],
        entropy=mean["entropy"],
        uniform_entropy=math.log(n + cfg.num_prefix_tokens),
        counts=counts,
    )


__all__ = ["KINDS", "OUTLIER_FACTOR", "TokenStats", "layer_token_stats", "query_row", "summarize_token_stats",
           "token_layout"]
