"""What a recipe builds before training: the model (from `init.checkpoint` when fine-tuning) and the data
configuration, which takes the checkpoint's preprocessing where the recipe leaves it open."""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn

from ..data.preprocess import data_config_fields, from_data_config
from ..models.config import ViTConfig
from ..models.resnet import ResNetConfig, ResNetV2
from ..models.vit import VisionTransformer
from ..weights import WeightsWarning, create_model, load_model, load_weights
from ..weights.checkpoint import read_preprocess
from .recipe import FROM_INIT, Recipe, data_config_from_dict


def build_model(recipe: Recipe, num_classes: int, in_chans: int | None = None) -> VisionTransformer | ResNetV2:
    """The recipe's model (a ViT, or a BiT ResNet) with the data's class count; from the `init` checkpoint when one
    is given.

    Fine-tuning (paper Sec. 3.2): the pre-trained head (and pre-logits) is replaced by a zero-initialised one
    when `init.drop_head`, and learned position embeddings are resampled on the 2-D grid to the new resolution.
    With `model.name: init.checkpoint` the architecture is the checkpoint's own (`vitlab.load_model`, the model
    section's fields changing it): a backbone without a head (DINOv2, SigLIP) gets a zero-initialised one.
    """
    over = dict(recipe.model.overrides)
    if "num_classes" in over and over["num_classes"] != num_classes:
        raise ValueError(f"model.num_classes={over['num_classes']} but the data has {num_classes} classes")
    over["num_classes"] = num_classes
    if in_chans is not None and over.get("in_chans", in_chans) != in_chans:
        raise ValueError(f"model.in_chans={over['in_chans']} but the data gives {in_chans} channels")
    if recipe.model.name == FROM_INIT:
        return _from_checkpoint(recipe, over, num_classes)
    model = create_model(recipe.model.name, **over)
    if recipe.init.checkpoint:
        name = recipe.init.checkpoint  # a path, registry name, hf-hub:owner/repo, gs:// or https URL
        with warnings.catch_warnings(record=True) as caught:  # noted in the report instead (pre-logits dropped)
            warnings.simplefilter("always", WeightsWarning)
            try:
                report = load_weights(model, name, pos_embed_resize=recipe.init.pos_embed_resize)
            except FileNotFoundError as e:
                raise FileNotFoundError(f"init.checkpoint: {e}") from None
        report.messages.extend(str(w.message) for w in caught if issubclass(w.category, WeightsWarning))
        if recipe.init.drop_head and isinstance(model.head, nn.Linear):
            model.reset_classifier(num_classes)  # Sec. 3.2: a zero-initialised D x K head
            report.messages.append("init.drop_head: head replaced by a zero-initialised one")
        model.init_report = report  # type: ignore[assignment]  # read by the CLI and tests
    return model


def _from_checkpoint(recipe: Recipe, over: dict[str, Any], num_classes: int) -> VisionTransformer | ResNetV2:
    """`model.name: init.checkpoint`: the checkpoint's model with the section's fields, in training mode."""
    name = recipe.init.checkpoint
    assert name is not None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", WeightsWarning)
        try:
            model, report = load_model(name, pos_embed_resize=recipe.init.pos_embed_resize, return_report=True,
                                       **over)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"init.checkpoint: {e}") from None
    report.messages.extend(str(w.message) for w in caught if issubclass(w.category, WeightsWarning))
    if recipe.init.drop_head and isinstance(model.head, nn.Linear) and not report.replaced:
        model.reset_classifier(num_classes)  # Sec. 3.2: a zero-initialised D x K head
        report.messages.append("init.drop_head: head replaced by a zero-initialised one")
    model.init_report = report  # type: ignore[assignment]  # read by the CLI and tests
    return model.train()


def init_preprocess(recipe: Recipe) -> Any:
    """The preprocessing `init.checkpoint` carries (a `vitlab.models.preprocess.Preprocess`), or None (none, or
    unknown)."""
    if not recipe.init.checkpoint:
        return None
    try:
        return read_preprocess(recipe.init.checkpoint)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"init.checkpoint: {e}") from None


def data_config_with_init(recipe: Recipe) -> Any:
    """The recipe's DataConfig; when fine-tuning, the checkpoint's statistics and eval resize fill the fields the
    recipe's data section does not set (normalize, eval_resize, eval_crop_fraction): fine-tuning feeds the weights
    pixels prepared the way they were pre-trained on unless the recipe says otherwise."""
    data = dict(recipe.data)
    pre = init_preprocess(recipe)
    if pre is not None:
        try:
            fields = data_config_fields(pre)
        except ValueError as e:
            if "normalize" not in data:
                raise ValueError(f"init.checkpoint {recipe.init.checkpoint}: {e}; set data.normalize") from None
            fields = {"eval_resize": pre.resize, "eval_crop_fraction": pre.crop_fraction}
        data = {**fields, **data}
    return data_config_from_dict(data)


def trained_preprocess(recipe: Recipe, data_cfg: Any, model_cfg: ViTConfig | ResNetConfig) -> Any:
    """The eval preprocessing the run's data pipeline applies, stored with every model it saves."""
    try:
        data_cfg = data_cfg or data_config_with_init(recipe)
        return from_data_config(data_cfg, model_cfg.img_size, model_cfg.in_chans)
    except (ValueError, TypeError, OSError):  # ready-made data with a recipe whose data section is a stub
        return None
