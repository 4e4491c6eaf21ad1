"""Reading checkpoints without running their code.

A pickle can call any Python function while it is read. We only read formats that cannot: safetensors,
`torch.load(weights_only=True)` (PyTorch's restricted unpickler: tensors, dicts, lists, numbers, strings) and
`np.load(allow_pickle=False)`. Anything else is refused with an `UnsafeCheckpointError` naming the file.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .report import WeightsError


class UnsafeCheckpointError(WeightsError):
    """A checkpoint that would need arbitrary code to be run to read it; it was not read."""


def torch_load(path: str | Path) -> Any:
    """`torch.load` restricted to plain data (tensors and containers); refuses anything that runs code.

    Raises:
        UnsafeCheckpointError: the pickle references a function or class outside PyTorch's allow-list.
    """
    path = Path(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=False)
    except pickle.UnpicklingError as e:
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it is a pickle that asks to run code or build objects other than tensors "
            f"({_culprit(e)}). Only plain state dicts are read (torch.load(weights_only=True)); if you trust the "
            f"file, re-save its state dict with torch.save(model.state_dict(), ...) or as .safetensors"
        ) from None
    except RuntimeError as e:
        if "weights_only" in str(e) or "Unpickl" in str(e):
            raise UnsafeCheckpointError(f"refusing to load {path}: {_first_line(e)}") from None
        raise WeightsError(f"could not read {path} as a PyTorch checkpoint: {_first_line(e)}") from e


def np_load(path: str | Path) -> dict[str, np.ndarray]:
    """All arrays of an .npz (or one .npy) with pickles disabled, so object arrays are refused."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    except ValueError as e:
        if "allow_pickle" in str(e) or "pickle" in str(e).lower():
            raise UnsafeCheckpointError(
                f"refusing to load {path}: it holds pickled Python objects, which can run code; "
                "official Google .npz checkpoints hold plain arrays only"
            ) from None
        raise WeightsError(f"could not read {path} as a NumPy archive: {_first_line(e)}") from e
    except (OSError, EOFError) as e:
        raise WeightsError(f"could not read {path} as a NumPy archive: {_first_line(e)}") from e


def _culprit(e: BaseException) -> str:
    """The line of PyTorch's refusal that names the offending global (e.g. "Unsupported global: GLOBAL io.open")."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))  # PyTorch colours its message
    m = re.search(r"Unsupported global: GLOBAL \S+", text)
    if m:
        return m.group(0)
    for line in text.splitlines():
        if "Unsupported" in line:
            return line.strip().rstrip(".")
    return _first_line(e)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
