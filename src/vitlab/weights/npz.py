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
weights and normalises groups with other epsilons than timm's (`vitlab.hybrid.EPS`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import ViTConfig
from ..posembed import sincos_2d
from .atomic import atomic_output
from .report import WeightsError

PREFIX = "opt/target/"
_BLOCK_RE = re.compile(r"Transformer/encoderblock_(\d+)/(.+)")
# Reading: Linen names (what `_linen_names` turns either naming into). Writing: the released names.
_ATTN = "MultiHeadDotProductAttention_0"
_LN = {"LayerNorm_0": "norm1", "LayerNorm_1": "norm2"}
_DENSE = {"MlpBlock_0/Dense_0": "mlp.fc1", "MlpBlock_0/Dense_1": "mlp.fc2"}
_ATTN_RELEASED = "MultiHeadDotProductAttention_1"
_LN_RELEASED = {"LayerNorm_0": "norm1", "LayerNorm_2": "norm2"}
_DENSE_RELEASED = {"MlpBlock_3/Dense_0": "mlp.fc1", "MlpBlock_3/Dense_1": "mlp.fc2"}
_NUMBERED = re.compile(r"(.*)_(\d+)")  # flax's MODULE_NUM_RE: "<Module>_<n>"
_LN_PARAM = {"scale": "weight", "bias": "bias"}
_RESNET_RE = re.compile(r"block(\d+)/unit(\d+)/(conv[123]|gn[123]|conv_proj|gn_proj)/(kernel|scale|bias)")
_RESNET_PART = {"conv1": "conv1", "conv2": "conv2", "conv3": "conv3", "gn1": "norm1", "gn2": "norm2", "gn3": "norm3",
                "conv_proj": "downsample.conv", "gn_proj": "downsample.norm"}


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


def to_ours(arrays: dict[str, np.ndarray], source: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Convert a vit_jax archive to our tensors; also returns the config fields it fixes (num_heads, ...)."""
    if PREFIX + "embedding/kernel" in arrays:
        arrays = {k.removeprefix(PREFIX): v for k, v in arrays.items() if k.startswith(PREFIX)}
    if "embedding/kernel" not in arrays:
        if any(k.startswith("params/") for k in arrays):
            raise WeightsError(f"{source}: a big_vision checkpoint (params/...); only vit_jax .npz files are read")
        raise WeightsError(f"{source}: no 'embedding/kernel': not a vit_jax ViT checkpoint")
    linen = _linen_names(arrays)
    original = {v: k for k, v in linen.items()}  # messages name the file's own key
    arrays = {linen[k]: v for k, v in arrays.items()}

    def t(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a))

    out: dict[str, torch.Tensor] = {}
    hints: dict[str, Any] = {}
    qkv: dict[tuple[str, str], dict[str, np.ndarray]] = {}
    stem = "patch_embed.backbone.stem." if any(_RESNET_RE.fullmatch(k) for k in arrays) else "patch_embed.backbone."
    if "conv_root/kernel" in arrays:
        hints["hybrid_eps"] = "vit_jax"  # Google's ResNet: WS (w - mean) / (std + 1e-5), GroupNorm eps 1e-6

    def resnet_param(a: np.ndarray, kind: str) -> torch.Tensor:
        """A ResNet kernel (HWIO -> OIHW) or GroupNorm scale / bias (any shape with C values -> (C,))."""
        if kind == "kernel":
            if a.ndim != 4:
                raise WeightsError(f"{source}: a ResNet kernel of shape {a.shape}; expected (kh, kw, in, out)")
            return t(a.transpose(3, 2, 0, 1))
        return t(a.reshape(-1))

    for key, a in arrays.items():
        if key in ("conv_root/kernel", "gn_root/scale", "gn_root/bias"):
            name = "conv.weight" if key == "conv_root/kernel" else f"norm.{_LN_PARAM[key.rsplit('/', 1)[1]]}"
            out[stem + name] = resnet_param(a, key.rsplit("/", 1)[1])
        elif m := _RESNET_RE.fullmatch(key):
            stage, unit, part, kind = m.groups()
            name = "weight" if kind in ("kernel", "scale") else "bias"
            out[f"patch_embed.backbone.stages.{int(stage) - 1}.blocks.{int(unit) - 1}.{_RESNET_PART[part]}.{name}"] = \
                resnet_param(a, kind)
        elif key == "embedding/kernel":
            if a.ndim != 4:
                raise WeightsError(f"{source}: embedding/kernel has shape {a.shape}; expected (P, P, C, D)")
            out["patch_embed.proj.weight"] = t(a.transpose(3, 2, 0, 1))  # (P, P, C, D) -> (D, C, P, P)
        elif key == "embedding/bias":
            out["patch_embed.proj.bias"] = t(a)
        elif key == "cls":
            out["cls_token"] = t(a.reshape(1, 1, -1))
        elif key == "Transformer/posembed_input/pos_embedding":
            out["pos_embed"] = t(a.reshape(1, -1, a.shape[-1]))  # (1, T, D)
        elif key.startswith("Transformer/encoder_norm/"):
            out[f"norm.{_LN_PARAM[key.rsplit('/', 1)[1]]}"] = t(a)
        elif key in ("head/kernel", "pre_logits/kernel"):
            out[f"{'head' if key.startswith('head') else 'pre_logits.fc'}.weight"] = t(a.T)  # (in, out) -> (out, in)
        elif key in ("head/bias", "pre_logits/bias"):
            out[f"{'head' if key.startswith('head') else 'pre_logits.fc'}.bias"] = t(a)
        elif m := _BLOCK_RE.fullmatch(key):
            i, rest = m.groups()
            module, leaf = rest.rsplit("/", 1)
            if module in _LN and leaf in _LN_PARAM:
                out[f"blocks.{i}.{_LN[module]}.{_LN_PARAM[leaf]}"] = t(a)
            elif module in _DENSE and leaf in ("kernel", "bias"):
                out[f"blocks.{i}.{_DENSE[module]}.{'weight' if leaf == 'kernel' else 'bias'}"] = \
                    t(a.T if leaf == "kernel" else a)
            elif module == f"{_ATTN}/out":
                if leaf == "kernel":  # (heads, hd, D) -> (D, heads * hd)
                    out[f"blocks.{i}.attn.proj.weight"] = t(a.reshape(-1, a.shape[-1]).T)
                else:
                    out[f"blocks.{i}.attn.proj.bias"] = t(a)
            elif module.startswith(f"{_ATTN}/") and module.split("/")[1] in ("query", "key", "value"):
                qkv.setdefault((i, leaf), {})[module.split("/")[1]] = a
                if leaf == "kernel":
                    hints["num_heads"] = int(a.shape[1])  # (D, heads, hd): the only format that stores heads
            else:
                raise WeightsError(f"{source}: unknown vit_jax parameter {original[key]!r}")
        else:
            raise WeightsError(f"{source}: unknown vit_jax parameter {original[key]!r}")
    for (i, leaf), parts in qkv.items():
        if set(parts) != {"query", "key", "value"}:
            raise WeightsError(f"{source}: encoderblock_{i} lacks one of query/key/value {leaf}")
        if leaf == "kernel":  # each (D, heads, hd) -> (heads * hd, D), stacked q, k, v -> (3D, D)
            w = np.concatenate([parts[n].reshape(parts[n].shape[0], -1).T for n in ("query", "key", "value")])
            out[f"blocks.{i}.attn.qkv.weight"] = t(w)
        else:
            b = np.concatenate([parts[n].reshape(-1) for n in ("query", "key", "value")])  # (3D,)
            out[f"blocks.{i}.attn.qkv.bias"] = t(b)
    if "cls_token" not in out:
        hints.update(class_token=False, pool="gap")  # vit_jax's classifier="gap" has no class token
    return out, hints


def from_ours(state: dict[str, torch.Tensor], cfg: ViTConfig) -> tuple[dict[str, np.ndarray], list[str]]:
    """Our tensors as a vit_jax archive (no prefix), plus notes on anything that had to be made explicit."""
    notes: list[str] = []
    H, hd, D = cfg.num_heads, cfg.head_dim, cfg.embed_dim

    def n(x: torch.Tensor) -> np.ndarray:
        return x.detach().to("cpu", torch.float32).numpy()

    out: dict[str, np.ndarray] = {}
    names = {"conv": "conv_root", "norm": "gn_root"}
    for key, v in state.items():  # a hybrid's ResNet
        if not key.startswith("patch_embed.backbone."):
            continue
        rest = key.removeprefix("patch_embed.backbone.").removeprefix("stem.")
        if m := re.fullmatch(r"stages\.(\d+)\.blocks\.(\d+)\.(.+)\.(weight|bias)", rest):
            stage, unit, part, kind = m.groups()
            theirs = next(k for k, o in _RESNET_PART.items() if o == part)
            name = f"block{int(stage) + 1}/unit{int(unit) + 1}/{theirs}"
        else:
            part, kind = rest.rsplit(".", 1)
            name = names[part]
        if name.rsplit("/", 1)[-1].startswith("conv"):
            out[f"{name}/kernel"] = n(v).transpose(2, 3, 1, 0)  # OIHW -> HWIO
        else:
            out[f"{name}/{'scale' if kind == 'weight' else 'bias'}"] = n(v)
    out |= {
        "embedding/kernel": n(state["patch_embed.proj.weight"]).transpose(2, 3, 1, 0),  # (D, C, P, P) -> HWIO
        "embedding/bias": n(state["patch_embed.proj.bias"]),
        "Transformer/encoder_norm/scale": n(state["norm.weight"]),
        "Transformer/encoder_norm/bias": n(state["norm.bias"]),
    }
    if "cls_token" in state:
        out["cls"] = n(state["cls_token"])  # (1, 1, D)
    if "pos_embed" in state:
        pos = n(state["pos_embed"])
    else:  # vit_jax always adds a table: write ours explicitly so the network computes the same function
        pos = np.zeros((1, cfg.seq_len, D), np.float32)
        if cfg.pos_embed == "sincos2d":
            pos[0, cfg.num_prefix_tokens :] = sincos_2d(*cfg.grid_size, D).numpy()
            notes.append("wrote the fixed sin-cos table as Transformer/posembed_input/pos_embedding")
        else:
            notes.append("the model has no position embeddings: wrote a zero table")
    out["Transformer/posembed_input/pos_embedding"] = pos
    for i in range(cfg.depth):
        b, g = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        for ln, ours in _LN_RELEASED.items():
            out[f"{g}{ln}/scale"] = n(state[f"{b}{ours}.weight"])
            out[f"{g}{ln}/bias"] = n(state[f"{b}{ours}.bias"])
        w = n(state[f"{b}attn.qkv.weight"])  # (3D, D)
        bias = n(state[f"{b}attn.qkv.bias"]) if f"{b}attn.qkv.bias" in state else np.zeros(3 * D, np.float32)
        for j, name in enumerate(("query", "key", "value")):
            out[f"{g}{_ATTN_RELEASED}/{name}/kernel"] = w[j * D : (j + 1) * D].T.reshape(D, H, hd)
            out[f"{g}{_ATTN_RELEASED}/{name}/bias"] = bias[j * D : (j + 1) * D].reshape(H, hd)
        out[f"{g}{_ATTN_RELEASED}/out/kernel"] = n(state[f"{b}attn.proj.weight"]).T.reshape(H, hd, D)
        out[f"{g}{_ATTN_RELEASED}/out/bias"] = n(state[f"{b}attn.proj.bias"])
        for dense, ours in _DENSE_RELEASED.items():
            out[f"{g}{dense}/kernel"] = n(state[f"{b}{ours}.weight"]).T
            out[f"{g}{dense}/bias"] = n(state[f"{b}{ours}.bias"])
    if not cfg.qkv_bias:
        notes.append("the model has no q/k/v biases: wrote zeros")
    if cfg.hybrid_layers is not None and cfg.hybrid_eps != "vit_jax":
        notes.append(f"the model's ResNet uses {cfg.hybrid_eps}'s epsilons; readers of a .npz (vit_jax, vitlab) use "
                     "vit_jax's, which differ for filters of small variance (vitlab.hybrid.EPS)")
    if "pre_logits.fc.weight" in state:
        out["pre_logits/kernel"] = n(state["pre_logits.fc.weight"]).T
        out["pre_logits/bias"] = n(state["pre_logits.fc.bias"])
    if "head.weight" in state:
        out["head/kernel"] = n(state["head.weight"]).T
        out["head/bias"] = n(state["head.bias"])
    if cfg.pool == "gap" and cfg.class_token:
        notes.append("pool='gap' with a class token has no vit_jax classifier setting; the reader must choose it")
    return {k: np.ascontiguousarray(v) for k, v in out.items()}, notes


def save_npz(arrays: dict[str, np.ndarray], path: str | Path, overwrite: bool = False) -> Path:
    """Write the archive atomically (uncompressed, as Google's files are)."""
    path = Path(path)
    with atomic_output(path, overwrite) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)
    return path
