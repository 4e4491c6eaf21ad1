"""Google's official vit_jax `.npz` checkpoints, to and from our names.

The file is a flat NumPy archive of the Flax parameter tree, keys joined by "/" (optionally under an
`opt/target/` prefix, as the original release has them). Flax Dense kernels are (in, out), the transpose of
PyTorch's (out, in); the patch embedding is an HWIO convolution (P, P, C, D); attention keeps heads separate:
query/key/value kernels (D, heads, head_dim), biases (heads, head_dim), the output kernel (heads, head_dim, D).

    embedding/{kernel,bias}                                           patch_embed.proj
    cls                                                               cls_token
    Transformer/posembed_input/pos_embedding                          pos_embed
    Transformer/encoderblock_{i}/LayerNorm_0/{scale,bias}             blocks.{i}.norm1
    Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1/      blocks.{i}.attn.qkv (q, k, v), .attn.proj (out)
        {query,key,value,out}/{kernel,bias}
    Transformer/encoderblock_{i}/LayerNorm_2/{scale,bias}             blocks.{i}.norm2
    Transformer/encoderblock_{i}/MlpBlock_3/Dense_{0,1}/{kernel,bias} blocks.{i}.mlp.fc1, .fc2
    Transformer/encoder_norm/{scale,bias}                             norm
    pre_logits/{kernel,bias}                                          pre_logits.fc
    head/{kernel,bias}                                                head

These are the names of Google's released files, made with pre-Linen flax (one submodule counter per block).
Current flax.linen counts each module type separately (LayerNorm_0, MultiHeadDotProductAttention_0, LayerNorm_1,
MlpBlock_0). Like vit_jax's `checkpoint.load` (flax's `convert_pre_linen`), the reader renumbers sibling
submodules named `<Module>_<n>` 0, 1, ... per module type in the order of n, so both namings read the same; the
writer uses the released names, which every reader (vit_jax, timm) takes.

Hybrids (R50+ViT) add the BiT ResNet at the top level; convolution kernels are HWIO:

    conv_root/kernel, gn_root/{scale,bias}                            patch_embed.backbone.stem.{conv,norm}
    block{s}/unit{u}/conv{1,2,3}/kernel, .../gn{1,2,3}/{scale,bias}   ...stages.{s-1}.blocks.{u-1}.conv{r}, norm{r}
    block{s}/unit{u}/conv_proj/kernel, .../gn_proj/{scale,bias}       ...stages.{s-1}.blocks.{u-1}.downsample
(a stem-only hybrid has no `stem.`: its backbone is the stem, as in timm). GroupNorm parameters may be (C,) or,
as flax < 0.3.6 wrote them, (1, 1, 1, C). The reader sets `hybrid_eps="vit_jax"`: Google's ResNet standardises
weights and normalises groups with other epsilons than timm's (`vitlab.models.hybrid.EPS`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from ..models.config import ViTConfig
from ..models.posembed import sincos_2d
from ..utils.io import atomic_write
from .report import WeightsError

PREFIX = "opt/target/"

# Every tensor, read both ways: (vit_jax name as released, our name, layout, piece of our tensor). {i} numbers the
# block; {s} and {u} a hybrid's ResNet stage and unit, counted from 1 by vit_jax and from 0 by us. Reading
# renumbers the file's names the Linen way first (`_linen_names`), so it matches this table renumbered alike.
_B = "Transformer/encoderblock_{i}/"
_ATTN = _B + "MultiHeadDotProductAttention_1/"
_UNIT, _STAGE = "block{s}/unit{u}/", "patch_embed.backbone.stages.{s}.blocks.{u}."
_STEM = "patch_embed.backbone.stem."  # a stem-only hybrid's backbone is the stem itself: no "stem."
_OFFSET = {"i": 0, "s": 1, "u": 1}  # vit_jax's number minus ours
_QKV = ("query", "key", "value")


class _Row(NamedTuple):
    theirs: str
    ours: str
    layout: str = "same"
    piece: int | None = None  # q, k, v: pieces 0, 1, 2 of blocks.{i}.attn.qkv, stacked on dim 0


def _affine(theirs: str, ours: str, layout: str = "same") -> list[_Row]:
    """A LayerNorm's or GroupNorm's scale and bias."""
    return [_Row(f"{theirs}/scale", f"{ours}.weight", layout), _Row(f"{theirs}/bias", f"{ours}.bias", layout)]


def _dense(theirs: str, ours: str) -> list[_Row]:
    return [_Row(f"{theirs}/kernel", f"{ours}.weight", "dense"), _Row(f"{theirs}/bias", f"{ours}.bias")]


_TABLE: list[_Row] = [
    _Row("embedding/kernel", "patch_embed.proj.weight", "conv"),
    _Row("embedding/bias", "patch_embed.proj.bias"),
    _Row("cls", "cls_token", "cls"),
    _Row("Transformer/posembed_input/pos_embedding", "pos_embed", "tokens"),
    *_affine(_B + "LayerNorm_0", "blocks.{i}.norm1"),
    *[_Row(f"{_ATTN}{n}/kernel", "blocks.{i}.attn.qkv.weight", "heads_in", j) for j, n in enumerate(_QKV)],
    *[_Row(f"{_ATTN}{n}/bias", "blocks.{i}.attn.qkv.bias", "heads", j) for j, n in enumerate(_QKV)],
    _Row(_ATTN + "out/kernel", "blocks.{i}.attn.proj.weight", "heads_out"),
    _Row(_ATTN + "out/bias", "blocks.{i}.attn.proj.bias"),
    *_affine(_B + "LayerNorm_2", "blocks.{i}.norm2"),
    *_dense(_B + "MlpBlock_3/Dense_0", "blocks.{i}.mlp.fc1"),
    *_dense(_B + "MlpBlock_3/Dense_1", "blocks.{i}.mlp.fc2"),
    *_affine("Transformer/encoder_norm", "norm"),
    *_dense("pre_logits", "pre_logits.fc"),
    *_dense("head", "head"),
    _Row("conv_root/kernel", _STEM + "conv.weight", "conv"),
    *_affine("gn_root", _STEM + "norm", "gn"),
    *[_Row(f"{_UNIT}conv{r}/kernel", f"{_STAGE}conv{r}.weight", "conv") for r in (1, 2, 3)],
    *[row for r in (1, 2, 3) for row in _affine(f"{_UNIT}gn{r}", f"{_STAGE}norm{r}", "gn")],
    _Row(_UNIT + "conv_proj/kernel", _STAGE + "downsample.conv.weight", "conv"),
    *_affine(_UNIT + "gn_proj", _STAGE + "downsample.norm", "gn"),
]

# layout -> (vit_jax array -> ours, ours -> vit_jax given (heads, head_dim))
_LAYOUTS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray, tuple[int, int]], np.ndarray]]] = {
    "same": (lambda a: a, lambda x, hh: x),
    "dense": (lambda a: a.T, lambda x, hh: x.T),  # flax (in, out) <-> torch (out, in)
    "conv": (lambda a: a.transpose(3, 2, 0, 1), lambda x, hh: x.transpose(2, 3, 1, 0)),  # HWIO <-> OIHW
    "gn": (lambda a: a.reshape(-1), lambda x, hh: x),  # flax < 0.3.6 wrote GroupNorm parameters as (1, 1, 1, C)
    "cls": (lambda a: a.reshape(1, 1, -1), lambda x, hh: x),  # (1, 1, D)
    "tokens": (lambda a: a.reshape(1, -1, a.shape[-1]), lambda x, hh: x),  # (1, T, D)
    # attention keeps heads apart: q/k/v kernels (D, H, hd) <-> (H*hd, D), their biases (H, hd) <-> (H*hd,),
    # the output kernel (H, hd, D) <-> (D, H*hd)
    "heads_in": (lambda a: a.reshape(a.shape[0], -1).T, lambda x, hh: x.T.reshape(-1, *hh)),
    "heads": (lambda a: a.reshape(-1), lambda x, hh: x.reshape(hh)),
    "heads_out": (lambda a: a.reshape(-1, a.shape[-1]).T, lambda x, hh: x.T.reshape(*hh, -1)),
}
# The number of dimensions each layout's arrays have in a vit_jax file (others: any).
_NDIM = {"dense": 2, "conv": 4, "heads_in": 3, "heads": 2, "heads_out": 3, "tokens": 3}
_NUMBERED = re.compile(r"(.*)_(\d+)")  # flax's MODULE_NUM_RE: "<Module>_<n>"


def _pattern(template: str) -> re.Pattern[str]:
    """"a/{i}/b" -> a regex matching "a/<n>/b" with the number in group "i"."""
    parts = re.split(r"\{(\w)\}", template)  # literal, field, literal, ...
    return re.compile("".join(re.escape(p) if k % 2 == 0 else f"(?P<{p}>\\d+)" for k, p in enumerate(parts)))


def _lookup(table: list[tuple[re.Pattern[str], _Row]], key: str) -> Iterator[tuple[_Row, dict[str, int]]]:
    for pattern, row in table:
        if m := pattern.fullmatch(key):
            yield row, {k: int(v) for k, v in m.groupdict().items()}


def matches(keys: set[str]) -> bool:
    """True for a vit_jax parameter archive."""
    return "embedding/kernel" in keys or PREFIX + "embedding/kernel" in keys


def _linen_names(keys: Iterable[str]) -> dict[str, str]:
    """Each "/"-joined key -> the key with every `<Module>_<n>` path component renumbered as vit_jax's
    `checkpoint.load` does (flax's `convert_pre_linen`): among the siblings of one parent, the components of one
    module type become 0, 1, ... in the order of n. Linen names map to themselves; the released
    `LayerNorm_0, MultiHeadDotProductAttention_1, LayerNorm_2, MlpBlock_3` become `LayerNorm_0,
    MultiHeadDotProductAttention_0, LayerNorm_1, MlpBlock_0`."""
    keys = list(keys)
    siblings: dict[tuple[str, ...], set[str]] = defaultdict(set)
    for key in keys:
        parts = key.split("/")
        for i, part in enumerate(parts):
            siblings[tuple(parts[:i])].add(part)
    renamed: dict[tuple[str, ...], str] = {}
    for parent, names in siblings.items():
        by_module: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for name in names:
            if m := _NUMBERED.fullmatch(name):
                by_module[m.group(1)].append((int(m.group(2)), name))
        for module, members in by_module.items():
            for j, (_, name) in enumerate(sorted(members)):
                renamed[(*parent, name)] = f"{module}_{j}"
    out = {}
    for key in keys:
        parts = key.split("/")
        out[key] = "/".join(renamed.get(tuple(parts[: i + 1]), p) for i, p in enumerate(parts))
    return out

_WRITE = [(_pattern(row.ours), row) for row in _TABLE]
_READ = [(_pattern(linen), row) for row, linen in zip(_TABLE, _linen_names(row.theirs for row in _TABLE).values(),
                                                      strict=True)]  # the table renumbered the Linen way


def to_ours(arrays: dict[str, np.ndarray], source: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Convert a vit_jax archive to our tensors; also returns the config fields it fixes (num_heads, ...)."""
    if PREFIX + "embedding/kernel" in arrays:
        arrays = {k.removeprefix(PREFIX): v for k, v in arrays.items() if k.startswith(PREFIX)}
    if "embedding/kernel" not in arrays:
        if any(k.startswith("params/") for k in arrays):
            raise WeightsError(f"{source}: a big_vision checkpoint (params/...); only vit_jax .npz files are read")
        raise WeightsError(f"{source}: no 'embedding/kernel': not a vit_jax ViT checkpoint")
    linen = _linen_names(arrays)
    out: dict[str, torch.Tensor] = {}
    hints: dict[str, Any] = {}
    pieces: dict[str, dict[int, np.ndarray]] = defaultdict(dict)
    for key, a in arrays.items():
        row, fields = next(_lookup(_READ, linen[key]), (None, {}))
        if row is None:
            raise WeightsError(f"{source}: unknown vit_jax parameter {key!r}")  # the file's own name
        if row.layout == "conv" and a.ndim != 4:
            raise WeightsError(f"{source}: {key} has shape {a.shape}; expected an HWIO kernel (kh, kw, in, out)")
        ndim = _NDIM.get(row.layout)
        if (ndim is not None and a.ndim != ndim) or a.size == 0 or a.dtype.kind not in "fiub":
            raise WeightsError(f"{source}: {key} has shape {a.shape} and dtype {a.dtype}; expected "
                               f"{f'{ndim} dimensions of ' if ndim else ''}numbers ({row.layout} layout)")
        if row.layout == "heads_in":
            hints["num_heads"] = int(a.shape[1])  # (D, heads, hd): the only format that stores heads
        ours = row.ours.format(**{k: v - _OFFSET[k] for k, v in fields.items()})
        x = np.ascontiguousarray(_LAYOUTS[row.layout][0](a))
        if row.piece is None:
            out[ours] = torch.from_numpy(x)
        else:
            pieces[ours][row.piece] = x
    for ours, got in pieces.items():
        if sorted(got) != [0, 1, 2]:
            raise WeightsError(f"{source}: {ours} needs query, key and value; the file has only "
                               f"{[_QKV[j] for j in sorted(got)]}")
        if len({got[j].shape for j in (0, 1, 2)}) != 1:
            raise WeightsError(f"{source}: the query, key and value of {ours} differ in shape: "
                               f"{[got[j].shape for j in (0, 1, 2)]}")
        out[ours] = torch.from_numpy(np.concatenate([got[j] for j in (0, 1, 2)]))
    if "conv_root/kernel" in arrays:
        hints["hybrid_eps"] = "vit_jax"  # Google's ResNet: WS (w - mean) / (std + 1e-5), GroupNorm eps 1e-6
    if not any(k.startswith("patch_embed.backbone.stages.") for k in out):
        out = {("patch_embed.backbone." + k.removeprefix(_STEM) if k.startswith(_STEM) else k): v
               for k, v in out.items()}
    if "cls_token" not in out:
        hints.update(class_token=False, pool="gap")  # vit_jax's classifier="gap" has no class token
    return out, hints


def from_ours(state: dict[str, torch.Tensor], cfg: ViTConfig) -> tuple[dict[str, np.ndarray], list[str]]:
    """Our tensors as a vit_jax archive (no prefix), plus notes on anything that had to be made explicit."""
    if cfg.family_options():  # vit_jax's ViT has none of them, and no tensor holds act or rope
        raise WeightsError(f"vit_jax's ViT cannot hold {cfg.family_options()} (the later families' options); "
                           "use --to timm, --to hf or vitlab's .safetensors")
    notes: list[str] = []
    D = cfg.embed_dim
    state = dict(state)
    if "pos_embed" not in state:  # vit_jax always adds a table: write ours explicitly so the network is the same
        pos = torch.zeros(1, cfg.seq_len, D)
        if cfg.pos_embed == "sincos2d":
            pos[0, cfg.num_prefix_tokens :] = sincos_2d(*cfg.grid_size, D)
            notes.append("wrote the fixed sin-cos table as Transformer/posembed_input/pos_embedding")
        else:
            notes.append("the model has no position embeddings: wrote a zero table")
        state["pos_embed"] = pos
    if not cfg.qkv_bias:
        state |= {f"blocks.{i}.attn.qkv.bias": torch.zeros(3 * D) for i in range(cfg.depth)}
        notes.append("the model has no q/k/v biases: wrote zeros")
    out: dict[str, np.ndarray] = {}
    unknown = []
    for key, v in state.items():
        if key.startswith("patch_embed.backbone.") and not key.startswith((_STEM, "patch_embed.backbone.stages.")):
            key = _STEM + key.removeprefix("patch_embed.backbone.")  # a stem-only hybrid
        x = v.detach().to("cpu", torch.float32).numpy()
        found = False
        for row, fields in _lookup(_WRITE, key):
            found = True
            part = x if row.piece is None else np.split(x, 3)[row.piece]
            theirs = row.theirs.format(**{k: v + _OFFSET[k] for k, v in fields.items()})
            out[theirs] = np.ascontiguousarray(_LAYOUTS[row.layout][1](part, (cfg.num_heads, cfg.head_dim)))
        if not found:
            unknown.append(key)
    if unknown:
        raise WeightsError(f"no vit_jax name for {unknown[:5]}{' ...' if len(unknown) > 5 else ''}")
    if cfg.hybrid_layers is not None and cfg.hybrid_eps != "vit_jax":
        notes.append(f"the model's ResNet uses {cfg.hybrid_eps}'s epsilons; readers of a .npz (vit_jax, vitlab) use "
                     "vit_jax's, which differ for filters of small variance (vitlab.models.hybrid.EPS)")
    if cfg.pool == "gap" and cfg.class_token:
        notes.append("pool='gap' with a class token has no vit_jax classifier setting; the reader must choose it")
    return out, notes


def save_npz(arrays: dict[str, np.ndarray], path: str | Path, overwrite: bool = False) -> Path:
    """Write the archive atomically (uncompressed, as Google's files are)."""
    path = Path(path)
    with atomic_write(path, overwrite=overwrite) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as allow_pickle's bool
    return path
