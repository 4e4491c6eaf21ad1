"""The shipped training recipes (the YAML files of the repository's `configs/`), as package data.

An installed wheel carries them, so `vitlab demo` and `vitlab.train.recipes.path("fmnist_pretrain")` work without a
checkout. In a checkout, `configs/` is a link to `src/vitlab/configs/`: the place to copy a recipe from.

    from vitlab import recipes
    recipes.names()                          # ['fmnist_finetune', 'fmnist_hybrid', ...]
    load_recipe(recipes.path("fmnist_pretrain"), ["train.steps=100"])
    print(recipes.read("vit_b16_finetune_folder"))   # the file, comments included: a template to copy
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

SUFFIX = ".yaml"


def directory() -> Path:
    """The folder holding the shipped recipes (inside the installed package)."""
    folder = resources.files("vitlab").joinpath("configs")
    if not isinstance(folder, Path):  # a zipped install: importlib.resources gives no file-system path
        raise RuntimeError(f"vitlab's recipes are not on the file system ({folder!r}); use "
                           "vitlab.train.recipes.read(name)")
    return folder


def names() -> list[str]:
    """Names of the shipped recipes, sorted, without the `.yaml` suffix."""
    return sorted(f.name[: -len(SUFFIX)] for f in resources.files("vitlab").joinpath("configs").iterdir()
                  if f.name.endswith(SUFFIX))


def path(name: str) -> Path:
    """The file of the shipped recipe `name` ("fmnist_pretrain" or "fmnist_pretrain.yaml").

    Raises:
        FileNotFoundError: No shipped recipe has that name (the message lists those that do).
    """
    return directory() / _file_name(name)


def read(name: str) -> str:
    """The text of the shipped recipe `name`, comments included (works from any install, zipped or not)."""
    return resources.files("vitlab").joinpath("configs", _file_name(name)).read_text(encoding="utf-8")


def _file_name(name: str) -> str:
    stem = name.removesuffix(SUFFIX)
    if stem not in names():
        raise FileNotFoundError(f"no shipped recipe {name!r}; the recipes are: {', '.join(names())}")
    return stem + SUFFIX
