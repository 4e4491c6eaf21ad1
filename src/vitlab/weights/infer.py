"""The architecture of a checkpoint from its tensor shapes, for checkpoints that come without a config.

What the tensors fix exactly: width D and patch size P and input channels C (patch projection (D, C, P, P)),
depth (the highest block index), MLP size and kind (fc1 (M, D), fc2 (D, M) or SwiGLU's (D, M/2)), the tokens
(class, distillation, registers), the position table's layout and grid (rows with or without the prefix tokens,
square unless a config says otherwise), classes (head (K, F)), pre-logits width, biases, LayerScale, norm_pre,
fc_norm, the MAP head. What they do not: the number of heads (q, k, v are stored fused, D x D either way), the
MLP's activation and the LayerNorm eps. Those come from the file's config; else from the variant table (heads of a
class-token ViT whose width is a named variant's) or the one convention every ViT with these tensors follows; where
ViTs in use disagree, the loader refuses and names the argument (`infer_config`).
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch

from ..models.config import _WIDTHS, VARIANTS, ViTConfig, pixels_per_token, to_hw
from . import bit
from .converted import Unfixed
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
    sources: dict[str, str] | None = None,
) -> tuple[ViTConfig, dict[str, Any], list[str]]:
    """Build the ViTConfig a state dict (our names) was made with.

    Each field comes from `known` (what the file's own config states), else from the tensor shapes where they
    decide it, else from the convention of the only layout that has these tensors (timm's defaults: exact GELU,
    LayerNorm eps 1e-6); where the ViTs that have such tensors disagree (the activation of a CLIP, SigLIP or
    class-token-free file; the heads of a width outside the variant table, or of a file without a class token),
    WeightsError names the field and the `load_model` argument that sets it. Nothing is guessed silently.

    Args:
        state: Tensors in our (timm's) names.
        known: Fields the file states outright (from its config, or heads from a .npz); they win over the shapes.
        grid: The position-embedding grid, when the file's config gives it (non-square grids).
        source: Name used in messages.
        img_size_hint: The image size the caller asked for; taken as the checkpoint's own when its table is not
            a square grid but fits this size (a non-square checkpoint without a config).
        sources: Filled with field -> where its value came from, for the fields decided here.

    Returns:
        (config, inferred fields -> value, notes on conventions taken); for a BiT ResNet's tensors the config is
        a `ResNetConfig` (`vitlab.weights.bit.infer_config`).
    """
    if bit.matches_state(state):
        return bit.infer_config(state, known, source)  # type: ignore[return-value]
    known = dict(known or {})
    for name, value in known.items():  # a field the file's layout leaves open (vitlab.weights.converted.Unfixed)
        if isinstance(value, Unfixed):
            raise WeightsError(f"{source}: the file does not fix {name} ({value.why}); pass {name}=... to load_model")
    why: dict[str, str] = {} if sources is None else sources
    inferred = _shape_fields(state, source, why)
    # pixels per token: P, or the hybrid ResNet's stride x P
    pixel = pixels_per_token(inferred["patch_size"], inferred.get("hybrid_layers"))
    notes: list[str] = []
    _position_fields(state, inferred, known, grid, img_size_hint, pixel, source, why, notes)
    if "num_heads" not in known:
        inferred["num_heads"], why["num_heads"] = _num_heads(inferred["embed_dim"], inferred["class_token"], source)
        notes.append(f"num_heads={inferred['num_heads']} from {why['num_heads']}: the tensors do not store it; pass "
                     "num_heads=... if the checkpoint was trained with another")
    for name, value, note in _conventions({**inferred, **known}, source):
        if name not in known:
            inferred[name], why[name] = value, note
    fields = {**inferred, **{k: v for k, v in known.items() if k != "class_names"}}
    shown = {k: v for k, v in inferred.items() if k not in known}
    fields["name"] = _variant_name(fields)
    try:
        cfg = ViTConfig.from_dict(fields)
    except (ValueError, TypeError) as e:  # e.g. a zero-sized tensor gives mlp_dim=0
        raise WeightsError(f"{source}: the tensor shapes give no valid ViT: {e}") from e
    for k in known:
        why.pop(k, None)
    return cfg, shown, notes


def _shape_fields(state: dict[str, torch.Tensor], source: str, why: dict[str, str]) -> dict[str, Any]:
    """The fields the tensor shapes fix (width, patch, depth, MLP, tokens, head, norms, biases, the hybrid's ResNet)
    and the pooling they imply; `why` gets where each came from."""
    blocks = _check_tensors(state, source)
    D, C, ph, _ = state["patch_embed.proj.weight"].shape
    hybrid = _hybrid_fields(state, source)
    fc1, fc2 = state["blocks.0.mlp.fc1.weight"], state.get("blocks.0.mlp.fc2.weight")
    inferred: dict[str, Any] = dict(
        embed_dim=int(D), in_chans=int(C), patch_size=int(ph), depth=max(blocks) + 1,
        mlp_dim=int(fc1.shape[0]),
        class_token="cls_token" in state,
        qkv_bias="blocks.0.attn.qkv.bias" in state,
        num_classes=int(state["head.weight"].shape[0]) if "head.weight" in state else 0,
        representation_size=int(state["pre_logits.fc.weight"].shape[0]) if "pre_logits.fc.weight" in state else None,
        patch_bias="patch_embed.proj.bias" in state,
        pre_norm="norm_pre.weight" in state,
        fc_norm="fc_norm.weight" in state,
        layer_scale=1e-5 if "blocks.0.ls1.gamma" in state else None,  # the init value; the loaded gammas replace it
        reg_tokens=int(state["reg_token"].shape[1]) if "reg_token" in state else 0,
        distilled="dist_token" in state,
        mlp_norm="blocks.0.mlp.norm.weight" in state,
        mlp="swiglu" if fc2 is not None and fc2.dim() == 2 and 2 * fc2.shape[1] == fc1.shape[0] else "mlp",
    )
    inferred.update(hybrid)
    for k in inferred:
        why[k] = "tensor shapes"
    if "attn_pool.latent" in state:
        inferred["pool"], why["pool"] = "map", "tensor shapes (attn_pool)"
    elif inferred["fc_norm"] or not inferred["class_token"]:
        inferred["pool"], why["pool"] = "gap", "tensor shapes (" + ("fc_norm" if inferred["fc_norm"] else
                                                                    "no class token") + ")"
    else:
        inferred["pool"], why["pool"] = "token", "timm's default for a class token without fc_norm"
    return inferred


def _position_fields(state: dict[str, torch.Tensor], inferred: dict[str, Any], known: dict[str, Any],
                     grid: tuple[int, int] | None, img_size_hint: Any, pixel: int, source: str, why: dict[str, str],
                     notes: list[str]) -> None:
    """Into `inferred`: the position embedding, its table's layout (no_embed_class) and the input size its grid
    gives; `notes` say what was assumed where the file stores no table."""
    if "pos_embed" in state:
        inferred["pos_embed"] = "learned"
        prefix = int(inferred["class_token"]) + int(inferred["distilled"]) + inferred["reg_tokens"]
        rows = state["pos_embed"].shape[-2]
        if grid is None and "img_size" in known:
            grid = _grid(known["img_size"], pixel)
        # a table without prefix rows is read only where timm uses one (DeiT-III, registers: LayerScale or registers)
        either = inferred["layer_scale"] is not None or inferred["reg_tokens"] > 0
        try:
            inferred["no_embed_class"], grid = _table_layout(rows, prefix, grid, img_size_hint, pixel,
                                                             known if either else {"no_embed_class": False, **known},
                                                             source)
        except WeightsError:
            if either or "no_embed_class" in known or not prefix:
                raise
            # the table fits the patches alone (else this raises the first error's kind): FlexiViT's layout
            _, g = _table_layout(rows, prefix, grid, img_size_hint, pixel, {"no_embed_class": True}, source)
            raise WeightsError(f"{source}: the position table's {rows} rows fit a {g[0]}x{g[1]} grid without the "
                               f"{prefix} prefix row(s), or another grid with them; the file does not fix "
                               "no_embed_class: pass no_embed_class=True (FlexiViT, DeiT-III layout) or img_size=(H, "
                               "W) to load_model") from None
        why["no_embed_class"] = why["img_size"] = "tensor shapes (position table rows)"
        inferred["img_size"] = grid[0] * pixel if grid[0] == grid[1] else (grid[0] * pixel, grid[1] * pixel)
    elif "pos_embed" not in known:
        inferred["pos_embed"] = "none"
        notes.append("no position-embedding tensor: built with pos_embed='none' (pass pos_embed='sincos2d' if the "
                     "model used fixed sin-cos embeddings)")
    elif "img_size" not in known and img_size_hint is None:  # e.g. big_vision's posemb="sincos2d"
        notes.append(f"pos_embed={known['pos_embed']!r} stores no table, so the file does not fix the input size: "
                     "img_size=224 assumed (pass img_size=... if it was trained at another)")


def _table_layout(rows: int, prefix: int, grid: tuple[int, int] | None, hint: Any, pixel: int,
                  known: dict[str, Any], source: str) -> tuple[bool, tuple[int, int]]:
    """(no_embed_class, grid) of a position table with `rows` rows for a model with `prefix` prefix tokens: the
    table covers the patches only (DeiT-III, DINOv2 with registers in timm) or the prefix tokens too."""
    if "no_embed_class" in known:
        layouts = [bool(known["no_embed_class"])]
    else:
        layouts = [False, True] if prefix else [False]
    fits: list[tuple[bool, tuple[int, int]]] = []
    if grid is None and hint is not None:  # the size asked for, where the table fits it (non-square checkpoints)
        g = _grid(hint, pixel)
        fits = [(e, g) for e in layouts if g[0] * g[1] == rows - (0 if e else prefix)]
    for no_embed in layouts if not fits else ():
        n = rows - (0 if no_embed else prefix)
        if grid is not None:
            if grid[0] * grid[1] == n:
                fits.append((no_embed, grid))
            continue
        side = math.isqrt(max(n, 0))
        if n > 0 and side * side == n:
            fits.append((no_embed, (side, side)))
    if len(fits) == 1:
        return fits[0]
    if len(fits) > 1:
        raise WeightsError(f"{source}: a position table of {rows} rows fits {fits[0][1]} patches with the {prefix} "
                           f"prefix rows and {fits[1][1]} without; pass no_embed_class=... (or img_size=...)")
    if grid is not None:
        raise WeightsError(f"{source}: the position table has {rows} rows, which fits neither the {grid[0]}x{grid[1]} "
                           f"grid of the stated image size nor it plus {prefix} prefix rows")
    raise WeightsError(f"{source}: position embedding has {rows} rows ({prefix} prefix tokens), not a square grid of "
                       "patches; pass img_size=(H, W) to load_model (and no_embed_class=True if the table has no "
                       "prefix rows)")


def _conventions(fields: dict[str, Any], source: str) -> list[tuple[str, Any, str]]:
    """The fields no tensor stores, where every ViT with these tensors agrees; WeightsError where they do not."""
    out: list[tuple[str, Any, str]] = []
    if fields.get("rope") == "eva02" and "rope_ref_grid" not in fields:
        raise WeightsError(f"{source}: the file does not fix rope_ref_grid (EVA-02's RoPE spans its pre-training grid "
                           "at every input size, timm's ref_feat_shape: (16, 16) for the eva02_*_patch14 models); pass "
                           "rope_ref_grid=(rows, cols), or None for plain patch indices, to load_model")
    if "act" not in fields:
        if fields.get("mlp") == "swiglu":
            out.append(("act", "silu", "SwiGLU's SiLU (every published SwiGLU ViT)"))
        else:
            family = ("a CLIP (norm_pre): OpenAI's use quick_gelu, LAION's gelu" if fields.get("pre_norm") else
                      "a MAP head (SigLIP: gelu, SigLIP2: gelu_tanh)" if fields.get("pool") == "map" else
                      "no class token (timm's *_gap: gelu, SigLIP-GAP: gelu_tanh)" if not fields.get("class_token")
                      else None)
            if family is not None:
                raise WeightsError(f"{source}: the file does not fix act (the MLP's activation) for {family}; pass "
                                   "act='gelu' | 'gelu_tanh' | 'quick_gelu' to load_model")
            out.append(("act", "gelu", "timm's default (exact GELU) for a class-token ViT without norm_pre"))
    if "layer_norm_eps" not in fields:
        if fields.get("pre_norm"):
            out.append(("layer_norm_eps", 1e-5, "CLIP's LayerNorm eps 1e-5 (every CLIP with norm_pre)"))
        else:
            out.append(("layer_norm_eps", 1e-6, "timm's default LayerNorm eps for this layout"))
    return out


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


def _num_heads(width: int, class_token: bool, source: str) -> tuple[int, str]:
    """num_heads for a width the tensors do not settle, from the variant table, and where it came from. Only for
    class-token ViTs: without a class token the same widths come with other head counts (timm's
    vit_base_patch16_gap_224: 16 at 768; SigLIP So400m: 16 at 1152), so the file must say."""
    row = next((name for name, r in _WIDTHS.items() if r["embed_dim"] == width), None)
    if row is not None and class_token:
        return _WIDTHS[row]["num_heads"], f"the ViT-{row} row of the variant table (width {width})"
    why = f"width {width} is no variant of the table" if row is None else \
        f"width {width} without a class token has more than one head count in use"
    raise WeightsError(f"{source}: the file does not fix num_heads ({why}); pass num_heads=... to load_model")


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
