"""Training: YAML recipes, the optimizer and schedule, the loop, atomic resumable checkpoints, distributed set-up
and the run report.

    recipe = load_recipe(recipes.path("fmnist_pretrain"), ["train.steps=100"])  # a shipped recipe, or any file
    result = train(recipe, "runs/fmnist")           # resumable: train(recipe, "runs/fmnist", resume=True)
    result.eval.top1, result.model, result.report  # a TrainResult
"""

from ..inference.evaluate import EvalResult, evaluate
from . import recipes
from .checkpoint import latest_checkpoint, list_checkpoints, load_latest_checkpoint, save_checkpoint
from .loop import NonFiniteError, RunDirError, RunLockedError, TrainResult, build_model, train, train_step
from .optim import build_optimizer, param_groups
from .recipe import Recipe, apply_overrides, load_recipe
from .schedule import lr_at

__all__ = [
    "EvalResult",
    "NonFiniteError",
    "Recipe",
    "RunDirError",
    "RunLockedError",
    "TrainResult",
    "apply_overrides",
    "build_model",
    "build_optimizer",
    "evaluate",
    "latest_checkpoint",
    "list_checkpoints",
    "load_latest_checkpoint",
    "load_recipe",
    "lr_at",
    "param_groups",
    "recipes",
    "save_checkpoint",
    "train",
    "train_step",
]
