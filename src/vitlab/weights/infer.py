"""The architecture of a checkpoint from its tensor shapes, for checkpoints that come without a config.

What the tensors fix exactly: width D and patch size P and input channels C (patch projection (D, C, P, P)),
depth (the highest block index), MLP size (fc1 (M, D)), class token (present or not), position-embedding grid
(rows of pos_embed, square unless a config says otherwise), classes (head (K, F)), pre-logits width, q/k/v
biases. What they do not: the number of heads (q, k, v are stored fused, D x D either way), which we take from
the named variant of that width (vitlab.config._WIDTHS) unless the format stores it (vit_jax's .npz does).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from ..config import _WIDTHS, VARIANTS, ViTConfig
from ..posembed import infer_grid
from .report import WeightsError

_BLOCK_RE = re.compile(r"blocks\.(\d+)\.")


def infer_config(
    state: dict[str, torch.Tensor],
    known: dict[str, Any] | None = None,
    grid: tuple[int, int] | None = None,
    source: str = "checkpoint",
    img_size_hint: int | tuple[int, int] | None = None,
) -> tuple[ViTConfig, dict[str, Any], list[str]]:
    """Build the ViTConfig a state dict (our names) was made with.

    Args:
        state: Tensors in our (timm's) names.
        known: Fields the file states outright (from its config, or heads from a .npz); they win over guesses.
        grid: The position-embedding grid, when the file's config gives it (non-square grids).
        source: Name used in messages.
        img_size_hint: The image size the caller asked for; taken as the checkpoint's own when its table is not
            a square grid but fits this size (a non-square checkpoint without a config).

    Returns:
        (config, inferred fields -> value, messages on guesses the shapes cannot settle).
    """
    known = dict(known or {})
    if "patch_embed.proj.weight" not in state:
        raise WeightsError(f"{source}: no patch embedding tensor, cannot infer the architecture")
    D, C, ph, pw = state["patch_embed.proj.weight"].shape
    if ph != pw:
        raise WeightsError(f"{source}: non-square patches {ph}x{pw} are not supported")
    blocks = {int(m.group(1)) for k in state if (m := _BLOCK_RE.match(k))}
    if not blocks:
        raise WeightsError(f"{source}: no Transformer blocks found")
    inferred: dict[str, Any] = dict(
        embed_dim=int(D), in_chans=int(C), patch_size=int(ph), depth=max(blocks) + 1,
        mlp_dim=int(state["blocks.0.mlp.fc1.weight"].shape[0]),
        class_token="cls_token" in state,
        qkv_bias="blocks.0.attn.qkv.bias" in state,
        num_classes=int(state["head.weight"].shape[0]) if "head.weight" in state else 0,
        representation_size=int(state["pre_logits.fc.weight"].shape[0]) if "pre_logits.fc.weight" in state else None,
    )
    inferred["pool"] = "token" if inferred["class_token"] else "gap"
    notes: list[str] = []
    if "pos_embed" in state:
        inferred["pos_embed"] = "learned"
        n = state["pos_embed"].shape[-2] - int(inferred["class_token"])
        if grid is None and "img_size" in known:
            grid = _grid(known["img_size"], int(ph))
        if grid is None:
            try:
                grid = infer_grid(n)
            except ValueError:
                hint = _grid(img_size_hint, int(ph)) if img_size_hint is not None else None
                if hint is not None and hint[0] * hint[1] == n:
                    grid = hint
                else:
                    raise WeightsError(
                        f"{source}: position embedding has {n} patch rows, not a square grid; "
                        "pass img_size=(H, W) to load_model"
                    ) from None
        inferred["img_size"] = grid[0] * int(ph) if grid[0] == grid[1] else (grid[0] * int(ph), grid[1] * int(ph))
    elif "pos_embed" not in known:
        inferred["pos_embed"] = "none"
        notes.append("no position-embedding tensor: built with pos_embed='none' (pass pos_embed='sincos2d' if the "
                     "model used fixed sin-cos embeddings)")
    if "num_heads" not in known:
        row = next((name for name, r in _WIDTHS.items() if r["embed_dim"] == D), None)
        if row is not None:
            inferred["num_heads"] = _WIDTHS[row]["num_heads"]
            why = f"the ViT-{row} row of the variant table"
        elif D % 64 == 0:
            inferred["num_heads"] = int(D) // 64
            why = "head width 64, as in every named variant"
        else:
            raise WeightsError(f"{source}: cannot infer num_heads for width {D}; pass num_heads=... to load_model")
        notes.append(f"num_heads={inferred['num_heads']} taken from {why}: the tensors do not store it; pass "
                     "num_heads=... if the checkpoint was trained with another")
    fields = {**inferred, **{k: v for k, v in known.items() if k != "class_names"}}
    shown = {k: v for k, v in inferred.items() if k not in known}
    fields["name"] = _variant_name(fields)
    cfg = ViTConfig.from_dict(fields)
    return cfg, shown, notes


def _grid(img_size: int | tuple[int, int], patch: int) -> tuple[int, int]:
    h, w = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    return (h // patch, w // patch)


def _variant_name(fields: dict[str, Any]) -> str | None:
    """The named variant these fields are, if any (ignoring image size and head)."""
    arch = ("embed_dim", "depth", "mlp_dim", "num_heads", "patch_size")
    for name, row in VARIANTS.items():
        if all(fields.get(k) == row[k] for k in arch):
            return name
    return None
