"""Transfer's pre-training: the ViT trained on the upstream classes of Fashion-MNIST at 28 px, in OUT/upstream/
(`inside` analyses it too).

Upstream holds out classes so that one downstream task is new to the model (`transfer`): the upstream task is
Fashion-MNIST's first six classes (T-shirt/top, Trouser, Pullover, Dress, Coat, Sandal), the held-out task the
other four (Shirt, Sneaker, Bag, Ankle boot).
An unfinished one is resumed with the recipe it was started with (its recipe.yaml), so an experiment run with
another --budget does not restart it.
"""

from __future__ import annotations

from pathlib import Path

from ..train.recipe import Recipe
from ..train.rundir import read_run_recipe
from .recipes import data_section, model_section, pretrain_recipe
from .subrun import SubRunResult, run_or_resume

UPSTREAM_CLASSES = [0, 1, 2, 3, 4, 5]
HELD_OUT_CLASSES = [6, 7, 8, 9]
DIR = "upstream"


def upstream_recipe(quick: bool, steps: int, batch_size: int, warmup: int, eval_samples: int | None) -> Recipe:
    data = data_section(quick, classes=UPSTREAM_CLASSES)
    return pretrain_recipe(model_section("vit", quick), data, steps=steps, batch_size=batch_size, warmup=warmup,
                           eval_samples=eval_samples)


def ensure_upstream(out: Path, recipe: Recipe, *, progress: bool = False) -> SubRunResult:
    """Train (or resume, or read back) the upstream run in OUT/upstream; an existing one keeps its own recipe."""
    run_dir = out / DIR
    if (run_dir / "recipe.yaml").is_file():
        saved = read_run_recipe(run_dir / "recipe.yaml")  # one written before train.evaluators reads too
        if saved.model.to_dict() != recipe.model.to_dict() or saved.data != recipe.data:
            raise ValueError(f"{run_dir} holds a pre-training of another model or data (one made by --quick, or by "
                             f"another version); choose another --out")
        recipe = saved
    return run_or_resume(DIR, recipe, run_dir, progress=progress)
