"""A run directory: what marks it as holding a run, and the checks before training writes into it.

    run_dir/recipe.yaml      the recipe as run (written once; a resume must match it)
    run_dir/metrics.jsonl    one JSON row per log / eval / evaluator event
    run_dir/checkpoints/     atomic, resumable checkpoints (`vitlab.train.checkpoint`)
    run_dir/tb/              TensorBoard events
    run_dir/model.safetensors, report.md, report.json, curves.png   written when the run completes
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..io import write_atomic
from . import checkpoint as ckpt
from .recipe import Recipe

# Keys of a run's recipe that may change between an interrupted run and its --resume (they do not change what the
# optimizer sees).
RESUMABLE_CHANGES = {"train.eval_every", "train.checkpoint_every", "train.log_every", "train.keep_checkpoints",
                     "train.max_bad_steps", "train.eval_batch_size", "train.evaluators"}
RUN_MARKERS = ("recipe.yaml", "metrics.jsonl", "checkpoints")


class RunDirError(FileExistsError):
    """A run directory already holds a run and --resume was not given (or nothing to resume)."""


def check_run_dir(run_dir: Path, resume: bool) -> None:
    """Refuse to write into a run directory that holds a run unless resuming; refuse to resume nothing."""
    held = [m for m in RUN_MARKERS if (run_dir / m).exists()]
    if held and not resume:
        raise RunDirError(f"run directory {run_dir} already holds a run ({', '.join(held)}); pass --resume to "
                          f"continue it or choose another -o RUN_DIR")
    if resume and not ckpt.list_checkpoints(run_dir / "checkpoints"):
        raise RunDirError(f"--resume: no checkpoint in {run_dir / 'checkpoints'} to resume from")


def check_same_recipe(run_dir: Path, recipe: Recipe) -> None:
    """Refuse to resume with a recipe that differs from the run's recipe.yaml outside `RESUMABLE_CHANGES`."""
    saved_path = run_dir / "recipe.yaml"
    if not saved_path.is_file():
        return
    import yaml

    saved = _flatten(Recipe.from_dict(yaml.safe_load(saved_path.read_text()), check_data=False).to_dict())
    now = _flatten(recipe.to_dict())
    diff = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k) and k not in RESUMABLE_CHANGES)
    if diff:
        details = "; ".join(f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in diff)
        raise ValueError(f"--resume: the recipe differs from the run's {saved_path} ({details}); resuming needs the "
                         f"same recipe (only {sorted(RESUMABLE_CHANGES)} may change)")


def resume_point(ckpt_dir: Path, world_size: int) -> tuple[Path, dict[str, Any]]:
    """(weights path, training state) of the checkpoint a resume continues from: the newest that loads. It must
    have been written by as many processes as this run has (data positions and RNGs are per process)."""
    found = ckpt.latest_checkpoint(ckpt_dir)
    if found is None:
        raise RunDirError(f"--resume: no loadable checkpoint in {ckpt_dir}")
    _, weights, saved = found
    if saved.get("world_size", 1) != world_size:
        raise ValueError(f"--resume: the checkpoint was written by {saved.get('world_size', 1)} processes, this run "
                         f"has {world_size}; resume with the same number (data positions are per process)")
    return weights, saved


def write_recipe(run_dir: Path, recipe: Recipe) -> None:
    """recipe.yaml, atomically (a new run only; a resumed run keeps the one it started with)."""
    write_atomic(run_dir / "recipe.yaml", recipe.to_yaml(), overwrite=True)


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and k != "overrides":
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
