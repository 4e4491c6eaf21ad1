"""Google's big_vision ViT `.npz` checkpoints, read into our names.

big_vision (github.com/google-research/big_vision, `big_vision/models/vit.py`) keeps vit_jax's parameter tree
with a few differences, all undone here before the tree goes through the vit_jax reader (`npz.to_ours`):

- Keys are "/"-joined under `params/` (its trainer saved `{"params": ..., "opt": ...}`; optimizer state and
  other top-level entries are ignored), or under `params/img/` for the image tower of a two-tower model; files
  shared as bare parameters have no prefix.
- The learned position table is `pos_embedding` at the top (older files: `Transformer/pos_embedding`), added
  to the patches *before* the class token `cls` is prepended, so the class token has no row of its own: ours
  gets a zero row in front. Files from before 2022 have a row for the class token (N + 1 rows, N square),
  which is then used as is, as big_vision's `fix_old_checkpoints` does.
- `posemb="sincos2d"` stores no table: the fixed 2-D sin-cos embedding (ours is the same function, see
  `vitlab.models.posembed.sincos_2d`), so the file does not fix the input size.
- Blocks are named as current flax numbers submodules (`LayerNorm_0`, `MultiHeadDotProductAttention_0`,
  `LayerNorm_1`, `MlpBlock_0`); the released vit_jax names are accepted too, as big_vision's loader does.
- A model trained with `scan=True` stores one `Transformer/encoderblock` whose tensors carry the depth as a
  leading axis; it is split into `encoderblock_{i}`.
- `pool_type`: "tok" has `cls` (ours: pool="token"); "gap", the default, has none (ours: pool="gap"); "map"
  adds a `MAPHead_0` attention-pooling head (SigLIP's image tower; ours: pool="map", `attn_pool`). ("0", the
  first token of a model without `cls`, leaves no trace in the file and is read as "gap".)
- `rep_size` gives `pre_logits` (Dense + tanh, as ours); the classifier is `head`.
- bfloat16 arrays, which `np.savez` stores as 2-byte void, are widened to float32.

big_vision's MLP uses flax's default GELU, the tanh approximation; vitlab's is exact, which moves logits by
about 1e-4 on the tiny test models (tests/test_weights_big_vision.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from . import npz
from .report import WeightsError

PREFIXES = ("params/img/", "params/")
_POS_KEYS = ("pos_embedding", "Transformer/pos_embedding", "Transformer/posembed_input/pos_embedding")
_VIT_JAX_POS = "Transformer/posembed_input/pos_embedding"
_TOP = re.compile(r"embedding/(kernel|bias)|cls|Transformer/encoder_norm/(scale|bias)|(pre_logits|head)/(kernel|bias)")
_BLOCK = re.compile(r"Transformer/encoderblock(?:_(\d+))?/([^/]+)/(.+)")
# A block's submodule -> vit_jax's name for it (what npz.to_ours reads); big_vision's current names and the old ones.
_SUBMODULE = {
    "LayerNorm_0": "LayerNorm_0", "MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
    "LayerNorm_1": "LayerNorm_2", "MlpBlock_0": "MlpBlock_3",
    "MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_1", "LayerNorm_2": "LayerNorm_2",
    "MlpBlock_3": "MlpBlock_3",
}
_LEAF = {
    "LayerNorm": re.compile(r"(scale|bias)"),
    "MultiHeadDotProductAttention": re.compile(r"(query|key|value|out)/(kernel|bias)"),
    "MlpBlock": re.compile(r"Dense_[01]/(kernel|bias)"),
}


def matches(keys: Iterable[str]) -> bool:
    """True for a big_vision archive: a `params/` prefix, or bare parameters with a part vit_jax never has."""
    keys = set(keys)
    if any(k.startswith("params/") for k in keys):
        return True
    if any(k in ("pos_embedding", "Transformer/pos_embedding", "probe") or k.startswith(
            ("Transformer/encoderblock/", "MAPHead_")) for k in keys):
        return True
    # Encoder blocks without a table: vit_jax always stores Transformer/posembed_input/pos_embedding, while
    # big_vision's posemb="sincos2d" stores none.
    return "embedding/kernel" in keys and _VIT_JAX_POS not in keys and any(
        k.startswith("Transformer/encoderblock_") for k in keys)


def to_ours(arrays: dict[str, np.ndarray], source: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Convert a big_vision ViT archive to our tensors; also returns the config fields it fixes.

    Raises:
        WeightsError: an unknown tensor, named as in the file.
    """
    params, prefix = _params(arrays, source)
    head = {k: _widen(params.pop(k)) for k in [k for k in params if k.startswith("MAPHead_0/")]}
    stray = sorted(k for k in params if k == "probe" or k.startswith("MAPHead_"))
    if stray:
        raise WeightsError(f"{source}: unknown big_vision attention-pooling parameter {prefix + stray[0]!r}")
    out: dict[str, np.ndarray] = {}
    scanned: dict[str, np.ndarray] = {}
    pos = None
    for key, a in params.items():
        a = _widen(a)
        if key in _POS_KEYS:
            if pos is not None:
                raise WeightsError(f"{source}: {prefix}{key}: a second position table (found {prefix}{pos[0]})")
            pos = (key, a)
        elif _TOP.fullmatch(key):
            out[key] = a
        elif m := _BLOCK.fullmatch(key):
            index, module, leaf = m.groups()
            kind = module.rsplit("_", 1)[0]
            if module not in _SUBMODULE or not _LEAF[kind].fullmatch(leaf):
                raise WeightsError(f"{source}: unknown big_vision ViT parameter {prefix + key!r}")
            name = f"{_SUBMODULE[module]}/{leaf}"
            if index is None:
                scanned[name] = a
            else:
                out[f"Transformer/encoderblock_{index}/{name}"] = a
        else:
            raise WeightsError(f"{source}: unknown big_vision ViT parameter {prefix + key!r}")
    if scanned:
        if any(k.startswith("Transformer/encoderblock_") for k in out):
            raise WeightsError(f"{source}: both a scanned {prefix}Transformer/encoderblock and numbered "
                               "encoderblock_{i}: not one model")
        out |= _unscan(scanned, source, prefix)
    if "embedding/kernel" not in out:
        raise WeightsError(f"{source}: no {prefix}embedding/kernel: not a big_vision ViT")
    hints: dict[str, Any] = {}
    if pos is None:
        hints["pos_embed"] = "sincos2d"  # big_vision's posemb="sincos2d" stores nothing
    else:
        out[_VIT_JAX_POS] = _with_class_row(pos[1], "cls" in out, f"{prefix}{pos[0]}", source)
    state, npz_hints = npz.to_ours(out, source)
    if head:  # pool_type="map": the MAP head (SigLIP's image tower) as ours, `attn_pool`
        state |= _map_head(head, source, prefix)
        hints["pool"] = "map"
    return state, {**npz_hints, **hints}


_MAP = "MAPHead_0/"
_MAP_ATTN = _MAP + "MultiHeadDotProductAttention_0/"


def _map_head(p: dict[str, np.ndarray], source: str, prefix: str) -> dict[str, torch.Tensor]:
    """big_vision's `MAPHead_0` (probe, attention, LayerNorm, MLP) in timm's `attn_pool` names."""
    def get(name: str, ndim: int) -> torch.Tensor:
        if name not in p:
            raise WeightsError(f"{source}: the MAP head has no {prefix}{name}")
        if p[name].ndim != ndim:
            raise WeightsError(f"{source}: {prefix}{name} has shape {p[name].shape}; expected {ndim} dimensions")
        return torch.from_numpy(np.ascontiguousarray(p[name], dtype=np.float32))

    known = {_MAP + "probe", *(f"{_MAP_ATTN}{n}/{k}" for n in ("query", "key", "value", "out")
                                for k in ("kernel", "bias")),
             *(f"{_MAP}LayerNorm_0/{k}" for k in ("scale", "bias")),
             *(f"{_MAP}MlpBlock_0/Dense_{i}/{k}" for i in (0, 1) for k in ("kernel", "bias"))}
    for name in sorted(set(p) - known):
        raise WeightsError(f"{source}: unknown big_vision MAP-head parameter {prefix + name!r}")

    def dense(n: str) -> tuple[torch.Tensor, torch.Tensor]:  # (D, heads, hd) kernel -> (heads * hd, D) weight
        return get(f"{_MAP_ATTN}{n}/kernel", 3).flatten(1).T, get(f"{_MAP_ATTN}{n}/bias", 2).reshape(-1)

    (qw, qb), (kw, kb), (vw, vb) = dense("query"), dense("key"), dense("value")
    out = {"attn_pool.latent": get(_MAP + "probe", 3), "attn_pool.q.weight": qw, "attn_pool.q.bias": qb,
           "attn_pool.kv.weight": torch.cat([kw, vw]), "attn_pool.kv.bias": torch.cat([kb, vb]),
           "attn_pool.proj.weight": get(_MAP_ATTN + "out/kernel", 3).flatten(0, 1).T,  # (heads, hd, D) -> (D, D)
           "attn_pool.proj.bias": get(_MAP_ATTN + "out/bias", 1),
           "attn_pool.norm.weight": get(_MAP + "LayerNorm_0/scale", 1),
           "attn_pool.norm.bias": get(_MAP + "LayerNorm_0/bias", 1)}
    for i in (0, 1):
        out[f"attn_pool.mlp.fc{i + 1}.weight"] = get(f"{_MAP}MlpBlock_0/Dense_{i}/kernel", 2).T
        out[f"attn_pool.mlp.fc{i + 1}.bias"] = get(f"{_MAP}MlpBlock_0/Dense_{i}/bias", 1)
    return {k: v.contiguous() for k, v in out.items()}


def _params(arrays: dict[str, np.ndarray], source: str) -> tuple[dict[str, np.ndarray], str]:
    """The parameter tree (prefix removed) and the prefix it had."""
    for prefix in PREFIXES:
        if prefix + "embedding/kernel" in arrays:
            return {k.removeprefix(prefix): v for k, v in arrays.items() if k.startswith(prefix)}, prefix
    if any(k.startswith("params/") for k in arrays):
        sample = ", ".join(sorted(k for k in arrays if k.startswith("params/"))[:4])
        raise WeightsError(f"{source}: a big_vision checkpoint without params/embedding/kernel: not a ViT "
                           f"(first parameters: {sample})")
    return dict(arrays), ""


def _widen(a: np.ndarray) -> np.ndarray:
    """bfloat16 saved by np.savez comes back as 2-byte void: reinterpret it and widen to float32 (exact)."""
    if a.dtype.kind == "V" and a.dtype.itemsize == 2:
        return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return a


def _unscan(scanned: dict[str, np.ndarray], source: str, prefix: str) -> dict[str, np.ndarray]:
    """One scanned block (depth on axis 0 of every tensor) -> encoderblock_{i} for i < depth."""
    depths = {name: a.shape[0] if a.ndim else 0 for name, a in scanned.items()}
    depth = max(set(depths.values()), key=list(depths.values()).count)
    for name, d in depths.items():
        if d != depth:
            raise WeightsError(f"{source}: {prefix}Transformer/encoderblock/{name} has shape "
                               f"{scanned[name].shape}; the scanned block's other tensors have depth {depth} first")
    return {f"Transformer/encoderblock_{i}/{name}": a[i] for name, a in scanned.items() for i in range(depth)}


def _with_class_row(pos: np.ndarray, has_cls: bool, name: str, source: str) -> np.ndarray:
    """big_vision's (1, N, D) patch table as ours, (1, 1 + N, D) with the class token's row first when it has one."""
    if pos.ndim != 3 or pos.shape[0] != 1:
        raise WeightsError(f"{source}: {name} has shape {pos.shape}; expected (1, tokens, width)")
    n = pos.shape[1]
    old_layout = n > 1 and int(np.sqrt(n - 1)) ** 2 + 1 == n  # before 2022: a row for the class token, first
    if old_layout:
        return pos if has_cls else pos[:, 1:]  # without a class token that row was never used
    if has_cls:
        return np.concatenate([np.zeros_like(pos[:, :1]), pos], axis=1)  # the class token gets no position
    return pos
