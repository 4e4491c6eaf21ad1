"""Class names: ImageNet-1k's ship with the package (`imagenet_classes.txt`, index order, torchvision's
spelling), so a checkpoint trained on it names its predictions without a file beside it."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

from ..weights.ours import stored_class_names

IMAGENET_1K = "imagenet-1k"


@functools.cache
def imagenet_classes() -> tuple[str, ...]:
    """The 1000 ImageNet-1k (ILSVRC-2012) class names, in the index order every ImageNet checkpoint uses."""
    text = resources.files("vitlab.data").joinpath("imagenet_classes.txt").read_text(encoding="utf-8")
    names = tuple(line for line in text.splitlines() if line)
    if len(names) != 1000:
        raise RuntimeError(f"vitlab/data/imagenet_classes.txt holds {len(names)} names, not 1000: reinstall vitlab")
    return names


def class_names(meta: dict[str, Any], num_classes: int) -> list[str]:
    """Names for a checkpoint's outputs: stored ones ("classes" from `vitlab train`, "class_names" from a
    transformers or timm config), else ImageNet-1k's for a 1000-class head (or labels "imagenet-1k"), else
    the indices as strings."""
    names = stored_class_names(meta, num_classes)
    if names is not None:
        return names
    if num_classes == 1000 and meta.get("labels", IMAGENET_1K) == IMAGENET_1K:
        return list(imagenet_classes())
    return [str(i) for i in range(num_classes)]
