"""Checkpoints that survive a kill at any instant, and resume exactly.

A checkpoint of step s is two files in `run_dir/checkpoints/`:

    step_{s:08d}.safetensors   the weights with the ViTConfig and metadata (`vitlab.save_weights`)
    step_{s:08d}.state.pt      training state: optimizer, step, RNG states, data position, EMA (torch.save)

Each is written with `vitlab.utils.io.write_atomic`: a temporary file in the same folder, fsync'ed, `os.replace`d onto
its name, the folder fsync'ed. The state file is written last and names the step, so a checkpoint exists only when
its state file does: a kill in the middle leaves at most a stray temporary file and the previous checkpoint intact.
The state file holds only tensors, numbers, strings, lists and dicts, so it loads with `weights_only=True`.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from ..utils.io import write_atomic

CKPT_RE = re.compile(r"step_(\d{8})\.state\.pt")


def atomic_write(path: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """`vitlab.utils.io.write_atomic(path, write, overwrite=True)` (kept for the training modules that call it)."""
    return write_atomic(path, write, overwrite=True)


def checkpoint_paths(ckpt_dir: str | os.PathLike, step: int) -> tuple[Path, Path]:
    """(weights, state) paths of the checkpoint of `step`."""
    d = Path(ckpt_dir)
    return d / f"step_{step:08d}.safetensors", d / f"step_{step:08d}.state.pt"


def list_checkpoints(ckpt_dir: str | os.PathLike) -> list[int]:
    """Steps of the complete checkpoints in `ckpt_dir` (state file and weights both present), oldest first."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return []
    steps = []
    for p in d.iterdir():
        m = CKPT_RE.fullmatch(p.name)
        if m and checkpoint_paths(d, int(m.group(1)))[0].is_file():
            steps.append(int(m.group(1)))
    return sorted(steps)


def save_checkpoint(
    ckpt_dir: str | os.PathLike,
    step: int,
    save_weights_fn: Callable[[Path], None],
    state: dict[str, Any],
    keep: int,
) -> Path:
    """Write the checkpoint of `step` atomically, then delete all but the latest `keep`.

    Args:
        ckpt_dir: The run's checkpoints folder.
        step: Optimizer steps done.
        save_weights_fn: Writes the weights .safetensors to the path it is given.
        state: Training state (tensors, numbers, strings, lists, dicts).
        keep: Complete checkpoints to keep, newest first.

    Returns:
        The weights path.
    """
    weights, state_path = checkpoint_paths(ckpt_dir, step)
    write_atomic(weights, save_weights_fn, overwrite=True)
    write_atomic(state_path, lambda tmp: _torch_save(dict(state, step=step), tmp), overwrite=True)  # commits it
    for old in list_checkpoints(ckpt_dir)[:-keep]:
        for p in checkpoint_paths(ckpt_dir, old)[::-1]:  # state first: the pair stops counting at once
            p.unlink(missing_ok=True)
    return weights


def _torch_save(obj: Any, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()


def load_state(path: str | os.PathLike) -> dict[str, Any]:
    """Load a training-state file with `weights_only=True` (no arbitrary code runs)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for truncated / foreign files
        raise ValueError(f"could not load training state {path}: {type(e).__name__}: {e}") from e


@dataclass
class LoadedCheckpoint:
    """A checkpoint whose two files loaded: its step, weights path, weights (state dict) and training state."""

    step: int
    weights_path: Path
    weights: dict[str, torch.Tensor]
    state: dict[str, Any]


def _weights_header(path: Path) -> dict[str, torch.Tensor]:
    """Open the weights file's header only: a truncated or foreign file fails here, without reading the tensors."""
    with safe_open(str(path), framework="pt") as f:
        f.keys()
    return {}


def _load_weights(path: Path, device: str | torch.device) -> dict[str, torch.Tensor]:
    """The weights of a checkpoint; ValueError naming the file when it is damaged or holds non-finite values."""
    try:
        weights = load_file(str(path), device=str(device))
    except Exception as e:  # safetensors raises its own SafetensorError (not an OSError) for a damaged file
        raise ValueError(f"could not load checkpoint weights {path}: {type(e).__name__}: {e}") from e
    bad = [k for k, t in weights.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise ValueError(f"checkpoint weights {path} hold non-finite values ({', '.join(bad[:3])})")
    return weights


def _newest_readable(ckpt_dir: str | os.PathLike, read_weights: Callable[[Path], dict[str, torch.Tensor]],
                     stacklevel: int) -> LoadedCheckpoint | None:
    """The newest checkpoint whose state file and weights (read with `read_weights`) load; each one skipped on the
    way is named in a warning."""
    for step in reversed(list_checkpoints(ckpt_dir)):
        weights_path, state_path = checkpoint_paths(ckpt_dir, step)
        try:
            state = load_state(state_path)
            if state.get("step") != step:
                raise ValueError(f"{state_path} says step {state.get('step')}")
            weights = read_weights(weights_path)
        except (ValueError, OSError) as e:
            warnings.warn(f"skipping unreadable checkpoint of step {step}: {e}", stacklevel=stacklevel)
            continue
        return LoadedCheckpoint(step, weights_path, weights, state)
    return None


def latest_checkpoint(ckpt_dir: str | os.PathLike) -> tuple[int, Path, dict[str, Any]] | None:
    """(step, weights path, state) of the newest checkpoint that loads; older ones are tried (with a warning
    naming the damaged file) if it does not. The weights file is checked as far as its header (a truncated file
    fails there); `load_latest_checkpoint` also reads the tensors."""

    def header(path: Path) -> dict[str, torch.Tensor]:
        try:
            return _weights_header(path)
        except Exception as e:  # SafetensorError, OSError
            raise ValueError(f"could not load checkpoint weights {path}: {type(e).__name__}: {e}") from e

    found = _newest_readable(ckpt_dir, header, stacklevel=3)
    return None if found is None else (found.step, found.weights_path, found.state)


def load_latest_checkpoint(ckpt_dir: str | os.PathLike, device: str | torch.device = "cpu"
                           ) -> LoadedCheckpoint | None:
    """The newest checkpoint whose state file and weights both load and whose weights are finite, with its
    weights on `device` (what a resume continues from); older ones are tried, with a warning naming the damaged
    file, if it does not."""
    return _newest_readable(ckpt_dir, lambda p: _load_weights(p, device), stacklevel=3)
