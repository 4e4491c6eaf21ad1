"""The recipes of the experiments, built in code from the shipped Fashion-MNIST recipe plus overrides.

Every sub-run starts from `configs/fmnist_pretrain.yaml` (AdamW, warm-up + cosine, label smoothing 0.1, mild
inception crop; `vitlab.train.recipes`) and changes only what the experiment varies: the model, the data (subset,
classes, dataset), the steps and the batch. Fine-tuning starts from `configs/fmnist_finetune.yaml` (the paper's SGD
recipe).

Two scales: "full" (the models `docs/paper.md` reports: a 0.2 M-parameter ViT on 4x4 patches, the hybrid with the
same Transformer on a one-stage BiT stem, and a BiT-R26x1 of width 16) and "quick" (the same pipeline with
one-block models of a few thousand parameters on vitlab's synthetic data, for the tests).
"""

from __future__ import annotations

import copy
from typing import Any

from ..train import recipes
from ..train.recipe import Recipe, read_recipe_dict

MODEL_KINDS = ("vit", "hybrid", "bit")
LABELS = {"vit": "ViT", "hybrid": "Hybrid (ResNet stem + ViT)", "bit": "BiT ResNet"}

# The Transformer all ViTs share: 4x4 patches of the 28 px images (7x7 = 49 tokens), global average pooling.
_VIT_FULL = dict(name="ViT-Ti/16", patch_size=4, in_chans=1, embed_dim=64, depth=4, num_heads=4, mlp_dim=256,
                 pool="gap", class_token=False, pos_embed="learned")
_VIT_QUICK = dict(_VIT_FULL, embed_dim=16, depth=1, num_heads=2, mlp_dim=32)
# The hybrid: a one-stage BiT stem (stride 4) whose 7x7 map, projected 1x1, gives the same 49 tokens.
_HYBRID = dict(patch_size=1, hybrid_layers=[1], hybrid_width=32)
_BIT_FULL = dict(name="BiT-R26x1", in_chans=1, width=16)
_BIT_QUICK = dict(name="BiT-R14x1", in_chans=1, width=8)


def model_section(kind: str, quick: bool, img_size: int = 28) -> dict[str, Any]:
    """The recipe's `model:` section for a model kind ("vit", "hybrid", "bit") at a scale."""
    if kind not in MODEL_KINDS:
        raise ValueError(f"model kind must be one of {MODEL_KINDS}, got {kind!r}")
    if kind == "bit":
        return {**(_BIT_QUICK if quick else _BIT_FULL), "img_size": img_size}
    vit = dict(_VIT_QUICK if quick else _VIT_FULL, img_size=img_size)
    return {**vit, **_HYBRID} if kind == "hybrid" else vit


def data_section(quick: bool, **overrides: Any) -> dict[str, Any]:
    """Fashion-MNIST with the shipped recipe's augmentation (synthetic data shaped like it when `quick`)."""
    base = dict(read_recipe_dict(recipes.path("fmnist_pretrain"))["data"])
    if quick:
        base.update(dataset="synthetic", num_samples=600)
    base.update(overrides)
    if base.get("dataset") == "digits":
        base.pop("num_samples", None)
        base["hflip"] = False  # a mirrored digit is another glyph
    return base


def pretrain_recipe(model: dict[str, Any], data: dict[str, Any], *, steps: int, batch_size: int, warmup: int,
                    seed: int = 0, fewshot: dict[str, Any] | None = None, eval_samples: int | None = None,
                    lr: float | None = None, early_stop_every: int = 0, early_stop_patience_epochs: float = 0.0,
                    early_stop_metric: str = "loss", early_stop_smoothing: str = "none") -> Recipe:
    """`fmnist_pretrain.yaml` (AdamW) with the model, data, length and batch replaced; with `early_stop_every`,
    early stopping on the val split (`data.val_fraction`; the val loss by default, a patience in epochs), the run
    ending with its best val weights. `seed`: model init, data order, augmentation."""
    d = copy.deepcopy(read_recipe_dict(recipes.path("fmnist_pretrain")))
    d["model"], d["data"] = dict(model), dict(data)
    d["schedule"]["warmup_steps"] = warmup
    if lr is not None:
        d["optim"]["lr"] = lr
    d["train"].update(steps=steps, batch_size=batch_size, seed=seed, precision="fp32", log_every=max(1, steps // 20),
                      checkpoint_every=max(1, steps // 4), keep_checkpoints=1)
    evals = d["train"]["evaluators"]
    evals["eval"].update(batch_size=500, max_samples=eval_samples)
    if early_stop_every:
        evals["early_stop"] = {"type": "early_stop", "every": early_stop_every, "batch_size": 500,
                               "patience_epochs": early_stop_patience_epochs, "metric": early_stop_metric,
                               "smoothing": early_stop_smoothing}
    if fewshot is not None:
        evals["fewshot"] = {"type": "fewshot", "batch_size": 500, **fewshot}
    return Recipe.from_dict(d)


def finetune_recipe(model: dict[str, Any], data: dict[str, Any], *, init: str, steps: int, batch_size: int,
                    warmup: int, lr: float, drop_head: bool, pos_embed_resize: str = "bicubic",
                    eval_samples: int | None = None, seed: int = 0) -> Recipe:
    """`fmnist_finetune.yaml` (the paper's fine-tuning: SGD momentum 0.9, no weight decay, clipping at 1, warm-up +
    cosine) from the checkpoint `init`, with a zero-initialised head when `drop_head` (a new label space)."""
    d = copy.deepcopy(read_recipe_dict(recipes.path("fmnist_finetune")))
    d["model"], d["data"] = dict(model), dict(data)
    d["optim"]["lr"] = lr
    d["schedule"]["warmup_steps"] = warmup
    d["train"].update(steps=steps, batch_size=batch_size, precision="fp32", log_every=max(1, steps // 20),
                      checkpoint_every=max(1, steps // 4), keep_checkpoints=1, seed=seed)
    d["train"]["evaluators"]["eval"].update(batch_size=500, max_samples=eval_samples)
    d["init"] = {"checkpoint": str(init), "drop_head": drop_head, "pos_embed_resize": pos_embed_resize}
    return Recipe.from_dict(d)
