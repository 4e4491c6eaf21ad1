"""The architecture of a checkpoint from its tensor shapes, for checkpoints that come without a config.

What the tensors fix exactly: width D and patch size P and input channels C (patch projection (D, C, P, P)),
depth (the highest block index), MLP size (fc1 (M, D)), class token (present or not), position-embedding grid
(rows of pos_embed, square unless a config says otherwise), classes (head (K, F)), pre-logits width, q/k/v
biases. What they do not: the number of heads (q, k, v are stored fused, D x D either way), which we take from
the named variant of that width (vitlab.models.config._WIDTHS) unless the format stores it (vit_jax's .npz does).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from ..models.config import _WIDTHS, VARIANTS, ViTConfig, pixels_per_token, to_hw
from ..models.posembed import infer_grid
from . import bit
from .report import WeightsError

_BLOCK_RE = re.compile(r"blocks\.(\d+)\.")
# Tensors whose shapes infer_config reads -> the numbers of dimensions they may have.
_RANKS = {"patch_embed.proj.weight": (4,), "blocks.0.mlp.fc1.weight": (2,), "head.weight": (2,),
          "pre_logits.fc.weight": (2,), "pos_embed": (3, 2), "patch_embed.backbone.stem.conv.weight": (4,),
          "patch_embed.backbone.conv.weight": (4,)}
_STAGE_RE = re.compile(r"patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.")


def _hybrid_fields(state: dict[str, torch.Tensor], source: str) -> dict[str, Any]:
    """hybrid_layers / hybrid_width / in_chans of a hybrid's ResNet (timm's ResNetV2 names), or {} for a plain ViT."""
    if not any(k.startswith("patch_embed.backbone.") for k in state):
        return {}
    stem = next((state[k] for k in ("patch_embed.backbone.stem.conv.weight", "patch_embed.backbone.conv.weight")
                 if k in state), None)
    if stem is None:
        raise WeightsError(f"{source}: a hybrid backbone without a stem convolution (patch_embed.backbone."
                           "stem.conv.weight); only BiT-style ResNet hybrids are supported")
    depth: dict[int, int] = {}
    for k in state:
        if m := _STAGE_RE.match(k):
            i, j = int(m.group(1)), int(m.group(2))
            depth[i] = max(depth.get(i, 0), j + 1)
    if sorted(depth) != list(range(len(depth))):
        raise WeightsError(f"{source}: hybrid backbone stages {sorted(depth)} are not numbered 0..n-1")
    return dict(hybrid_layers=tuple(depth[i] for i in range(len(depth))), hybrid_width=int(stem.shape[0]),
                in_chans=int(stem.shape[1]))


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
        (config, inferred fields -> value, messages on guesses the shapes cannot settle); for a BiT ResNet's
        tensors the config is a `ResNetConfig` (`vitlab.weights.bit.infer_config`).
    """
    if bit.matches_state(state):
        return bit.infer_config(state, known, source)  # type: ignore[return-value]
    known = dict(known or {})
    blocks = _check_tensors(state, source)
    D, C, ph, _ = state["patch_embed.proj.weight"].shape
    hybrid = _hybrid_fields(state, source)
    inferred: dict[str, Any] = dict(
        embed_dim=int(D), in_chans=int(C), patch_size=int(ph), depth=max(blocks) + 1,
        mlp_dim=int(state["blocks.0.mlp.fc1.weight"].shape[0]),
        class_token="cls_token" in state,
        qkv_bias="blocks.0.attn.qkv.bias" in state,
        num_classes=int(state["head.weight"].shape[0]) if "head.weight" in state else 0,
        representation_size=int(state["pre_logits.fc.weight"].shape[0]) if "pre_logits.fc.weight" in state else None,
    )
    inferred.update(hybrid)
    inferred["pool"] = "token" if inferred["class_token"] else "gap"
    # pixels per token: P, or the hybrid ResNet's stride x P
    pixel = pixels_per_token(int(ph), hybrid.get("hybrid_layers"))
    notes: list[str] = []
    if "pos_embed" in state:
        inferred["pos_embed"] = "learned"
        n = state["pos_embed"].shape[-2] - int(inferred["class_token"])
        if grid is None and "img_size" in known:
            grid = _grid(known["img_size"], pixel)
        if grid is None:
            try:
                grid = infer_grid(n)
            except ValueError:
                hint = _grid(img_size_hint, pixel) if img_size_hint is not None else None
                if hint is not None and hint[0] * hint[1] == n:
                    grid = hint
                else:
                    raise WeightsError(
                        f"{source}: position embedding has {n} patch rows, not a square grid; "
                        "pass img_size=(H, W) to load_model"
                    ) from None
        inferred["img_size"] = grid[0] * pixel if grid[0] == grid[1] else (grid[0] * pixel, grid[1] * pixel)
    elif "pos_embed" not in known:
        inferred["pos_embed"] = "none"
        notes.append("no position-embedding tensor: built with pos_embed='none' (pass pos_embed='sincos2d' if the "
                     "model used fixed sin-cos embeddings)")
    elif "img_size" not in known and img_size_hint is None:  # e.g. big_vision's posemb="sincos2d"
        notes.append(f"pos_embed={known['pos_embed']!r} stores no table, so the file does not fix the input size: "
                     "img_size=224 assumed (pass img_size=... if it was trained at another)")
    if "num_heads" not in known:
        inferred["num_heads"], why = _guess_num_heads(int(D), source)
        notes.append(f"num_heads={inferred['num_heads']} taken from {why}: the tensors do not store it; pass "
                     "num_heads=... if the checkpoint was trained with another")
    fields = {**inferred, **{k: v for k, v in known.items() if k != "class_names"}}
    shown = {k: v for k, v in inferred.items() if k not in known}
    fields["name"] = _variant_name(fields)
    try:
        cfg = ViTConfig.from_dict(fields)
    except (ValueError, TypeError) as e:  # e.g. a zero-sized tensor gives mlp_dim=0
        raise WeightsError(f"{source}: the tensor shapes give no valid ViT: {e}") from e
    return cfg, shown, notes


def _check_tensors(state: dict[str, torch.Tensor], source: str) -> set[int]:
    """Refuse a state dict whose tensors cannot be read as a ViT; returns its block indices."""
    if "patch_embed.proj.weight" not in state:
        raise WeightsError(f"{source}: no patch embedding tensor, cannot infer the architecture")
    for name, ndim in _RANKS.items():  # the shapes read below: a damaged file must not reach them as IndexError
        if name in state and state[name].dim() not in ndim:
            raise WeightsError(f"{source}: {name} has shape {tuple(state[name].shape)}; a ViT's has {ndim[0]} "
                               "dimensions")
    _, _, ph, pw = state["patch_embed.proj.weight"].shape
    if ph != pw:
        raise WeightsError(f"{source}: non-square patches {ph}x{pw} are not supported")
    blocks = {int(m.group(1)) for k in state if (m := _BLOCK_RE.match(k))}
    if not blocks:
        raise WeightsError(f"{source}: no Transformer blocks found")
    if "blocks.0.mlp.fc1.weight" not in state:
        raise WeightsError(f"{source}: no blocks.0.mlp.fc1.weight (the first block's MLP), cannot infer the "
                           "architecture")
    return blocks


def _guess_num_heads(width: int, source: str) -> tuple[int, str]:
    """num_heads for a width the tensors do not settle, and where it came from."""
    row = next((name for name, r in _WIDTHS.items() if r["embed_dim"] == width), None)
    if row is not None:
        return _WIDTHS[row]["num_heads"], f"the ViT-{row} row of the variant table"
    if width % 64 == 0:
        return width // 64, "head width 64, as in every named variant"
    raise WeightsError(f"{source}: cannot infer num_heads for width {width}; pass num_heads=... to load_model")


def _grid(img_size: int | tuple[int, int], patch: int) -> tuple[int, int]:
    h, w = to_hw(img_size)
    return (h // patch, w // patch)


def _variant_name(fields: dict[str, Any]) -> str | None:
    """The named variant these fields are, if any (ignoring image size and head)."""
    arch = ("embed_dim", "depth", "mlp_dim", "num_heads", "patch_size")
    for name, row in VARIANTS.items():
        if all(fields.get(k) == row[k] for k in arch) and fields.get("hybrid_layers") == row.get("hybrid_layers") \
                and fields.get("hybrid_width", 64) == row.get("hybrid_width", 64):
            return name
    return None
