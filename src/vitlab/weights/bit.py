"""BiT ResNet-v2 weights (`vitlab.models.resnet`): timm's `resnetv2_*_bit` state dicts and Google's BiT `.npz` files.

timm's names are ours except the classifier, a 1x1 convolution there and a Linear here:

    timm                                   vitlab
    head.fc.weight (K, C, 1, 1)            head.weight (K, C)
    head.fc.bias                           head.bias

Google's released files (storage.googleapis.com/bit_models/BiT-{S,M}-R50x1.npz, ...) are flat NumPy archives of
the TF/Flax parameters, convolution kernels HWIO, everything under `resnet/`; units are counted from 01:

    resnet/root_block/standardized_conv2d/kernel               stem.conv.weight
    resnet/block{i+1}/unit{j+1:02d}/a/group_norm/{gamma,beta}  stages.{i}.blocks.{j}.norm1.{weight,bias}
    resnet/block{i+1}/unit{j+1:02d}/a/standardized_conv2d/kernel          ....conv1.weight
    resnet/block{i+1}/unit{j+1:02d}/b/..., c/...                          ....norm2 / conv2, norm3 / conv3
    resnet/block{i+1}/unit{j+1:02d}/a/proj/standardized_conv2d/kernel     ....downsample.conv.weight
    resnet/group_norm/{gamma,beta}                             norm.{weight,bias}
    resnet/head/conv2d/{kernel,bias} (1, 1, C, K), (K,)        head.{weight,bias}

(the table of Google's own loader, big_transfer bit_pytorch/models.py `load_from`, and of timm's
resnetv2._load_weights). The reader states `eps="bit"`: Google's code standardises with 1e-10 where timm uses 1e-8.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch

from ..models.resnet import VARIANTS, ResNetConfig, ResNetV2
from .report import LoadReport, WeightsError

PREFIX = "resnet/"
ROOT = PREFIX + "root_block/standardized_conv2d/kernel"
_UNIT_RE = re.compile(r"resnet/block(\d+)/unit(\d+)/")
_STAGE_RE = re.compile(r"stages\.(\d+)\.blocks\.(\d+)\.")
# (Google's sub-path inside a unit, our name inside a block)
_UNIT_PARTS = (
    ("a/group_norm/gamma", "norm1.weight"), ("a/group_norm/beta", "norm1.bias"),
    ("a/standardized_conv2d/kernel", "conv1.weight"),
    ("b/group_norm/gamma", "norm2.weight"), ("b/group_norm/beta", "norm2.bias"),
    ("b/standardized_conv2d/kernel", "conv2.weight"),
    ("c/group_norm/gamma", "norm3.weight"), ("c/group_norm/beta", "norm3.bias"),
    ("c/standardized_conv2d/kernel", "conv3.weight"),
    ("a/proj/standardized_conv2d/kernel", "downsample.conv.weight"),
)
# timm ResNetV2 tensors that mean another network than BiT's (fragment -> what it is)
_UNSUPPORTED = {
    "running_mean": "BatchNorm (timm's resnetv2_50 / _101 without _bit); BiT uses GroupNorm",
    "stem.conv1.": "a deep stem (timm's resnetv2_*d)",
    "stem.norm.": "a post-activation stem (a ViT hybrid's backbone, not a pre-activation ResNet)",
    "downsample.norm.": "normalised projection shortcuts (post-activation ResNetV2)",
}


# -- timm --------------------------------------------------------------------------------------------------


def matches_timm(keys: set[str]) -> bool:
    """True for a timm ResNetV2 state dict (or ours): a top-level stem and stages."""
    return "stem.conv.weight" in keys and any(k.startswith("stages.") for k in keys)


def timm_to_ours(state: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """timm's `resnetv2_*_bit` state dict in our names (the 1x1-convolution head becomes a Linear's)."""
    for key in state:
        for frag, what in _UNSUPPORTED.items():
            if frag in key:
                raise WeightsError(f"{source}: tensor {key!r} belongs to {what}, which vitlab's BiT ResNet does "
                                   "not have")
    out = {}
    for k, v in state.items():
        if k == "head.fc.weight":
            if v.dim() not in (2, 4) or (v.dim() == 4 and tuple(v.shape[2:]) != (1, 1)):
                raise WeightsError(f"{source}: head.fc.weight has shape {tuple(v.shape)}; expected (K, C, 1, 1)")
            v = v.reshape(v.shape[0], v.shape[1])
        out[k.replace("head.fc.", "head.", 1) if k.startswith("head.fc.") else k] = v
    return out


def ours_to_timm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict in timm's names and shapes (`timm.create_model("resnetv2_50x1_bit").load_state_dict`)."""
    out = {}
    for k, v in state.items():
        if k == "head.weight":
            out["head.fc.weight"] = v[:, :, None, None]
        elif k == "head.bias":
            out["head.fc.bias"] = v
        else:
            out[k] = v
    return out


# -- Google's .npz -----------------------------------------------------------------------------------------


def matches_npz(arrays: dict[str, np.ndarray]) -> bool:
    """True for Google's BiT archive layout (`resnet/root_block/...`)."""
    return ROOT in arrays


def _conv(a: np.ndarray, name: str, source: str) -> torch.Tensor:
    if a.ndim != 4:
        raise WeightsError(f"{source}: {name} has shape {a.shape}; a convolution kernel is (H, W, in, out)")
    return torch.from_numpy(np.ascontiguousarray(a.transpose(3, 2, 0, 1)))  # HWIO -> OIHW


def _vector(a: np.ndarray, name: str, source: str) -> torch.Tensor:
    if a.ndim not in (1, 4) or (a.ndim == 4 and a.shape[:3] != (1, 1, 1)):  # (C,) or old flax's (1, 1, 1, C)
        raise WeightsError(f"{source}: {name} has shape {a.shape}; a GroupNorm parameter is (C,)")
    return torch.from_numpy(np.ascontiguousarray(a.reshape(-1)))


def npz_to_ours(arrays: dict[str, np.ndarray], source: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Google's BiT archive in our names, and the config facts it states (classes, input channels, epsilons).

    Raises:
        WeightsError: a unit with missing tensors, stages not numbered 1..n, or a tensor of the wrong rank.
    """
    state: dict[str, torch.Tensor] = {"stem.conv.weight": _conv(arrays[ROOT], ROOT, source)}
    units: dict[int, set[int]] = {}
    for k in arrays:
        if m := _UNIT_RE.match(k):
            units.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    if sorted(units) != list(range(1, len(units) + 1)) or not units:
        raise WeightsError(f"{source}: BiT blocks {sorted(units)} are not numbered block1..blockN")
    used = {ROOT}
    for b in sorted(units):
        if sorted(units[b]) != list(range(1, len(units[b]) + 1)):
            raise WeightsError(f"{source}: block{b} units {sorted(units[b])} are not numbered unit01..")
        for u in sorted(units[b]):
            g = f"{PREFIX}block{b}/unit{u:02d}/"
            for part, ours in _UNIT_PARTS:
                key = g + part
                if key not in arrays:
                    if part.startswith("a/proj/") and u > 1:
                        continue  # only a stage's first unit projects its shortcut
                    raise WeightsError(f"{source}: {key} missing")
                read = _conv if part.endswith("kernel") else _vector
                state[f"stages.{b - 1}.blocks.{u - 1}.{ours}"] = read(arrays[key], key, source)
                used.add(key)
    for part, ours in (("group_norm/gamma", "norm.weight"), ("group_norm/beta", "norm.bias")):
        if PREFIX + part not in arrays:
            raise WeightsError(f"{source}: {PREFIX + part} (the final GroupNorm) missing")
        state[ours] = _vector(arrays[PREFIX + part], PREFIX + part, source)
        used.add(PREFIX + part)
    known: dict[str, Any] = {"eps": "bit", "in_chans": int(state["stem.conv.weight"].shape[1]), "num_classes": 0}
    kernel, bias = PREFIX + "head/conv2d/kernel", PREFIX + "head/conv2d/bias"
    if kernel in arrays:
        head = arrays[kernel]
        if head.ndim != 4 or head.shape[:2] != (1, 1):
            raise WeightsError(f"{source}: {kernel} has shape {head.shape}; expected (1, 1, C, K)")
        state["head.weight"] = torch.from_numpy(np.ascontiguousarray(head[0, 0].T))  # (K, C)
        state["head.bias"] = torch.from_numpy(np.asarray(arrays[bias]).reshape(-1)) if bias in arrays else \
            torch.zeros(head.shape[-1])
        known["num_classes"] = int(head.shape[-1])
        used |= {kernel, bias}
    left = sorted(set(arrays) - used)
    if left:
        raise WeightsError(f"{source}: tensors outside Google's BiT layout: {', '.join(left[:6])}")
    return state, known


def to_npz(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Our state dict as Google's BiT archive (readable by big_transfer's `load_from` and timm's `_load_weights`)."""
    def conv(t: torch.Tensor) -> np.ndarray:
        return t.detach().float().cpu().numpy().transpose(2, 3, 1, 0)  # OIHW -> HWIO

    def vec(t: torch.Tensor) -> np.ndarray:
        return t.detach().float().cpu().numpy()

    parts = {ours: part for part, ours in _UNIT_PARTS}
    out: dict[str, np.ndarray] = {}
    for k, v in state.items():
        if k == "stem.conv.weight":
            out[ROOT] = conv(v)
        elif m := _STAGE_RE.match(k):
            part = parts[k[m.end():]]
            key = f"{PREFIX}block{int(m.group(1)) + 1}/unit{int(m.group(2)) + 1:02d}/{part}"
            out[key] = conv(v) if part.endswith("kernel") else vec(v)
        elif k in ("norm.weight", "norm.bias"):
            out[PREFIX + ("group_norm/gamma" if k == "norm.weight" else "group_norm/beta")] = vec(v)
        elif k == "head.weight":
            out[PREFIX + "head/conv2d/kernel"] = vec(v).T[None, None]  # (1, 1, C, K)
        elif k == "head.bias":
            out[PREFIX + "head/conv2d/bias"] = vec(v)
        else:
            raise ValueError(f"{k} is not a BiT ResNet tensor")
    return out


# -- the architecture from the tensors ---------------------------------------------------------------------


def matches_state(state: dict[str, torch.Tensor]) -> bool:
    """True for a BiT ResNet state dict in our names."""
    return matches_timm(set(state))


def infer_config(state: dict[str, torch.Tensor], known: dict[str, Any] | None = None, source: str = "checkpoint",
                 ) -> tuple[ResNetConfig, dict[str, Any], list[str]]:
    """The ResNetConfig of a BiT state dict (our names), as `vitlab.weights.infer.infer_config` for ViTs.

    The stem convolution gives the width and input channels, the block indices the units per stage, the head the
    classes. GroupNorm's group count is not stored: 32 (BiT's) is assumed. The input size is not stored either
    (the pool is global): `known["img_size"]` or 224.
    """
    known = dict(known or {})
    stem = state["stem.conv.weight"]
    if stem.dim() != 4:
        raise WeightsError(f"{source}: stem.conv.weight has shape {tuple(stem.shape)}; expected (w, C, 7, 7)")
    depth: dict[int, int] = {}
    for k in state:
        if m := _STAGE_RE.match(k):
            i, j = int(m.group(1)), int(m.group(2))
            depth[i] = max(depth.get(i, 0), j + 1)
    if not depth or sorted(depth) != list(range(len(depth))):
        raise WeightsError(f"{source}: ResNet stages {sorted(depth)} are not numbered 0..n-1")
    inferred: dict[str, Any] = dict(
        width=int(stem.shape[0]), in_chans=int(stem.shape[1]), layers=tuple(depth[i] for i in range(len(depth))),
        num_classes=int(state["head.weight"].shape[0]) if "head.weight" in state else 0,
    )
    fields = {**inferred, **{k: v for k, v in known.items() if k in ("img_size", "num_classes", "eps", "in_chans")}}
    fields["name"] = next((n for n, row in VARIANTS.items()
                           if row["layers"] == fields["layers"] and row["width"] == fields["width"]), None)
    notes = []
    if "img_size" not in known:
        notes.append("a ResNet's tensors do not fix its input size: img_size=224 assumed for preprocessing (pass "
                     "img_size=... to match the weights' training resolution)")
    try:
        cfg = ResNetConfig(**fields)
    except (ValueError, TypeError) as e:
        raise WeightsError(f"{source}: the tensor shapes give no valid BiT ResNet: {e}") from e
    return cfg, {k: v for k, v in inferred.items() if k not in known}, notes


def adopt_eps(model: ResNetV2, ckpt: Any, report: LoadReport) -> None:
    """Switch `model` to the epsilons of the weights' source when the checkpoint states them (Google's `.npz`)."""
    eps = ckpt.known.get("eps")
    if eps is not None and eps != model.cfg.eps:
        report.messages.append(f"eps: {model.cfg.eps!r} -> {eps!r}, the epsilons of the weights' source")
        model.set_eps(eps)
