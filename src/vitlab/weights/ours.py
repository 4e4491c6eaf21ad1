"""Our own format: a `.safetensors` file whose metadata holds the `ViTConfig` and free-form JSON.

Header metadata (all strings, as safetensors requires):
    "format": "pt"
    "vitlab.config": the ViTConfig as JSON (`ViTConfig.to_dict()`)
    "vitlab.meta": free-form JSON from the caller (recipe, metrics, class names under "classes", ...)
    "vitlab.preprocess": the `Preprocess` the weights expect (`Preprocess.to_dict()` as JSON), when known
    "vitlab.version": the vitlab version that wrote it
Tensor names are the model's own (timm's), so the file also loads into timm with `load_state_dict`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load, save_file

from ..models.config import ViTConfig
from ..models.preprocess import Preprocess
from ..models.resnet import ResNetConfig, config_from_dict
from ..utils.io import atomic_write
from ..utils.version import __version__
from .report import WeightsError
from .safety import sniff

CONFIG_KEY = "vitlab.config"
META_KEY = "vitlab.meta"
VERSION_KEY = "vitlab.version"
PREPROCESS_KEY = "vitlab.preprocess"
# Where metadata keeps the class names, in label order: `vitlab train` writes "classes"; a transformers id2label, a
# timm config's label_names and the NAME_HEADERS below are read as "class_names".
CLASS_NAME_KEYS = ("classes", "class_names")
# The header entry (a JSON list) that holds the class names in the timm / torchvision .safetensors files `export`
# writes, each in its library's word (timm's pretrained_cfg "label_names", torchvision's meta "categories").
NAME_HEADERS = {"timm": "timm.label_names", "torchvision": "torchvision.categories"}


def stored_class_names(meta: dict[str, Any], num_classes: int) -> list[str] | None:
    """The class names a checkpoint's metadata holds for its `num_classes` outputs (None when it holds none, or a
    list of another length: a head replaced since)."""
    for key in CLASS_NAME_KEYS:
        names = meta.get(key)
        if isinstance(names, list | tuple) and len(names) == num_classes and num_classes:
            return [str(n) for n in names]
    return None


def save_safetensors(
    state: dict[str, torch.Tensor],
    path: str | Path,
    cfg: ViTConfig | ResNetConfig | None = None,
    metadata: dict[str, Any] | None = None,
    overwrite: bool = False,
    preprocess: Preprocess | None = None,
) -> Path:
    """Write `state` to `path` atomically with the config, `metadata` (JSON-serialisable) and the preprocessing
    in the header."""
    header = {"format": "pt", VERSION_KEY: __version__}
    if cfg is not None:
        header[CONFIG_KEY] = json.dumps(cfg.to_dict())
    if metadata is not None:
        try:
            header[META_KEY] = json.dumps(metadata)
        except TypeError as e:
            raise TypeError(f"metadata must be JSON-serialisable (dicts, lists, str, numbers): {e}") from None
    if preprocess is not None:
        header[PREPROCESS_KEY] = json.dumps(preprocess.to_dict())
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    path = Path(path)
    with atomic_write(path, overwrite=overwrite) as tmp:
        save_file(tensors, str(tmp), metadata=header)
    return path


def _unreadable(path: str | Path, e: BaseException) -> WeightsError:
    """The error for a file safetensors cannot parse: what the file looks like when it is not one at all."""
    kind = sniff(path)
    if kind.name != "safetensors":
        return WeightsError(f"{path}: not a .safetensors file: looks like {kind.description}")
    return WeightsError(f"{path}: damaged .safetensors file: {e}")


def read_header(path: str | Path) -> dict[str, str]:
    """The raw string metadata of a .safetensors file (empty when it has none)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise
    except (SafetensorError, OSError) as e:
        raise _unreadable(path, e) from e


def _header_json(path: str | Path, key: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:  # json.JSONDecodeError, and UnicodeDecodeError of a damaged string
        raise WeightsError(f"{path}: bad {key} in the header (not JSON: {e})") from e


def read_config(path: str | Path) -> ViTConfig | ResNetConfig | None:
    """The config stored in a .safetensors header (a ViTConfig, or a BiT ResNet's ResNetConfig), or None for files
    written by others."""
    text = read_header(path).get(CONFIG_KEY)
    if text is None:
        return None
    data = _header_json(path, CONFIG_KEY, text)
    if not isinstance(data, dict):
        raise WeightsError(f"{path}: bad {CONFIG_KEY} in the header: a JSON object expected, got {type(data).__name__}")
    try:
        return config_from_dict(data)
    except (TypeError, ValueError) as e:
        raise WeightsError(f"{path}: bad {CONFIG_KEY} in the header: {e}") from e


def read_meta(path: str | Path) -> dict[str, Any]:
    """The free-form metadata given to `save_weights` (empty when none was given)."""
    text = read_header(path).get(META_KEY)
    if text is None:
        return {}
    data = _header_json(path, META_KEY, text)
    if not isinstance(data, dict):
        raise WeightsError(f"{path}: bad {META_KEY} in the header: a JSON object expected, got {type(data).__name__}")
    return data


def read_header_class_names(path: str | Path, header: dict[str, str]) -> list[str] | None:
    """The class names in a timm / torchvision .safetensors header (`NAME_HEADERS`), or None when it has none."""
    for key in NAME_HEADERS.values():
        if key in header:
            names = _header_json(path, key, header[key])
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise WeightsError(f"{path}: bad {key} in the header: a JSON list of strings expected")
            return names
    return None


def read_preprocess(path: str | Path, header: dict[str, str] | None = None) -> Preprocess | None:
    """The Preprocess stored in a .safetensors header, or None when the file does not say."""
    text = (read_header(path) if header is None else header).get(PREPROCESS_KEY)
    if text is None:
        return None
    try:
        return Preprocess.from_dict(_header_json(path, PREPROCESS_KEY, text))
    except WeightsError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise WeightsError(f"{path}: bad {PREPROCESS_KEY} in the header: {e}") from e


def load_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a .safetensors file, on the CPU, in memory of their own.

    `safetensors.torch.load_file` returns tensors backed by a mapping of the file, which later writes to the
    file show through (and truncating it crashes the process); a model must not depend on its file like that.
    """
    try:
        return load(Path(path).read_bytes())
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise
    except (SafetensorError, OSError) as e:
        raise _unreadable(path, e) from e
