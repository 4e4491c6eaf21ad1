"""Read any supported checkpoint into one shape: tensors in our names plus what the file says about itself.

Format detection looks at what is there, not at the file name alone: a directory with a transformers
`config.json`, an `.npz` archive, a `.safetensors` file with our header, or tensor names (timm, transformers,
torchvision) inside a `.safetensors` / `.pth` / `.bin` file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..config import ViTConfig
from . import hf, npz, ours, safety, timm, torchvision
from .report import WeightsError

FORMATS = ("vitlab", "npz", "timm", "hf", "torchvision")
# Where training scripts nest the model's state dict inside a checkpoint dict.
_NESTED = ("state_dict", "model", "model_state_dict", "module", "state_dict_ema", "model_ema")
_HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


@dataclass
class Checkpoint:
    """A checkpoint read into our names.

    Attributes:
        source: What was read (file or directory).
        format: One of FORMATS.
        state: Tensors named as in our model (timm's names).
        config: The full ViTConfig when the file carries one (ours, or ours beside it).
        known: Config fields the file states outright (transformers config.json, heads of a .npz).
        grid: The checkpoint's position-embedding grid, when its config fixes it.
        meta: Free-form metadata stored with it (ours: what `save_weights` was given; transformers: class names).
        default_resize: Position-embedding resampling mode native to the format.
    """

    source: Path
    format: str
    state: dict[str, torch.Tensor]
    config: ViTConfig | None = None
    known: dict[str, Any] = field(default_factory=dict)
    grid: tuple[int, int] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    default_resize: str = "bicubic"


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Read `path` (file or directory) in whichever supported format it is.

    Raises:
        FileNotFoundError: nothing at `path`.
        UnsafeCheckpointError: a pickle that would run code.
        WeightsError: an unknown or unsupported layout (the message names what was found).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    src = str(path)
    if path.is_dir():
        return _read_dir(path)
    if path.suffix == ".npz":
        state, hints = npz.to_ours(safety.np_load(path), src)
        return Checkpoint(path, "npz", state, known=hints, default_resize="jax")
    if path.suffix == ".safetensors":
        header = ours.read_header(path)
        tensors = ours.load_tensors(path)
        if ours.CONFIG_KEY in header:
            cfg = ours.read_config(path)
            return Checkpoint(path, "vitlab", timm.to_ours(tensors, src), config=cfg, grid=cfg.grid_size,
                              meta=ours.read_meta(path))
    else:
        tensors = _unwrap(safety.torch_load(path), src)
    ckpt = _from_tensors(tensors, path)
    _config_beside(ckpt)
    return ckpt


def _read_dir(path: Path) -> Checkpoint:
    cfg_file = path / "config.json"
    weights = next((path / n for n in _HF_WEIGHTS if (path / n).exists()), None)
    if weights is None:
        if (path / "model.safetensors.index.json").exists():
            raise WeightsError(f"{path}: sharded transformers checkpoints are not supported (ViTs fit one file)")
        found = sorted(p.name for p in path.iterdir())[:10]
        raise WeightsError(f"{path}: a directory needs {' or '.join(_HF_WEIGHTS)} (found: {found})")
    if not cfg_file.exists():
        raise WeightsError(f"{path}: a transformers checkpoint directory needs config.json")
    tensors = ours.load_tensors(weights) if weights.suffix == ".safetensors" else _unwrap(
        safety.torch_load(weights), str(weights))
    ckpt = _from_tensors(tensors, weights)
    ckpt.source = path
    _config_beside(ckpt)
    return ckpt


def _from_tensors(tensors: dict[str, torch.Tensor], path: Path) -> Checkpoint:
    src = str(path)
    keys = set(tensors)
    if timm.matches(keys):
        return Checkpoint(path, "timm", timm.to_ours(tensors, src))
    if hf.matches(keys):
        return Checkpoint(path, "hf", hf.to_ours(tensors, src))
    if torchvision.matches(keys):
        return Checkpoint(path, "torchvision", torchvision.to_ours(tensors, src))
    sample = ", ".join(sorted(keys)[:6])
    raise WeightsError(
        f"{path}: not a ViT checkpoint in any known layout (timm, transformers, torchvision, vit_jax .npz, "
        f"vitlab .safetensors); first tensor names: {sample}"
    )


def _unwrap(obj: Any, source: str) -> dict[str, torch.Tensor]:
    """The tensor dict inside a training checkpoint ({"model": ..., "optimizer": ...}), prefixes removed."""
    for _ in range(3):
        if isinstance(obj, dict) and not any(isinstance(v, torch.Tensor) for v in obj.values()):
            inner = next((obj[k] for k in _NESTED if isinstance(obj.get(k), dict)), None)
            if inner is None:
                break
            obj = inner
    if not isinstance(obj, dict) or not obj:
        raise WeightsError(f"{source}: expected a state dict (name -> tensor), got {type(obj).__name__}")
    tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise WeightsError(f"{source}: holds no tensors at its top level (keys: {sorted(obj)[:8]})")
    for prefix in ("module.", "_orig_mod.", "model."):  # DDP, torch.compile, wrappers
        if all(k.startswith(prefix) for k in tensors):
            tensors = {k.removeprefix(prefix): v for k, v in tensors.items()}
    return tensors


def _config_beside(ckpt: Checkpoint) -> None:
    """Use a config.json next to the weights: a transformers config, or a vitlab config (possibly nested)."""
    base = ckpt.source if ckpt.source.is_dir() else ckpt.source.parent
    file = base / "config.json"
    if not file.exists():
        return
    try:
        data = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise WeightsError(f"{file}: unreadable config.json beside the checkpoint: {e}") from e
    if hf.is_hf_config(data):
        if ckpt.format != "hf":
            return  # someone else's config; the tensors speak for themselves
        known = hf.config_from_hf(data, str(file))
        if "class_names" in known:
            ckpt.meta["class_names"] = known.pop("class_names")
        ckpt.known.update(known)
        if "img_size" in known and "patch_size" in known:
            img = known["img_size"]
            h, w = img if isinstance(img, tuple) else (img, img)
            ckpt.grid = (h // known["patch_size"], w // known["patch_size"])
        return
    for key in (ours.CONFIG_KEY, "config", "model"):
        if isinstance(data, dict) and isinstance(data.get(key), dict):
            data = data[key]
            break
    try:
        cfg = ViTConfig.from_dict(data)
    except (TypeError, ValueError):
        return  # not a ViTConfig: ignore it rather than guess
    ckpt.config = cfg
    ckpt.grid = cfg.grid_size
