"""The model factory: a named variant or a config, built and, on request, loaded with pretrained weights.

    model = vitlab.create_model("ViT-B/16", weights="augreg_in21k_ft_in1k")   # a registry name, path, hf-hub:, URL
    model = vitlab.create_model("BiT-R50x1", num_classes=10)                  # the paper's CNN baseline

It lives with the weights, not the models: a registry entry fixes config fields (classes, resolution, pre-logits)
before the network is built, and `vitlab.models` stays free of the readers.
"""

from __future__ import annotations

from typing import Any

from ..models.config import ViTConfig
from ..models.resnet import ResNetConfig, ResNetV2, config_from_name
from ..models.vit import VisionTransformer
from . import hub
from .api import load_weights


def create_model(name: str | ViTConfig | ResNetConfig, weights: str | None = None, **overrides: Any) -> Any:
    """Build a named variant ("ViT-B/16", case-insensitive) or a `ViTConfig`, overriding any config field.
    A BiT ResNet name ("BiT-R50x1", `vitlab.models.resnet`) or a `ResNetConfig` builds the paper's CNN baseline.

    Args:
        name: Variant name or a ViTConfig.
        weights: Pretrained weights to load into it: a path, a registry name, "hf-hub:owner/repo", a gs:// or
            https URL (anything `vitlab.weights.hub.resolve` takes). A registry entry's config fields (classes,
            resolution, pre-logits) are used unless `overrides` say otherwise, and its preprocessing becomes
            `model.preprocess`; another class count gets a zero head, another resolution resampled position
            embeddings (see `load_weights`).
        **overrides: ViTConfig fields.

    Example:
        >>> model = create_model("ViT-Ti/16", depth=4, img_size=64, num_classes=7)
        >>> model(torch.zeros(2, 3, 64, 64)).shape
        torch.Size([2, 7])
    """
    if weights is not None:
        overrides = {**hub.entry_overrides(hub.locate(weights)[1]), **overrides}
    cfg = name.replace(**overrides) if isinstance(name, ViTConfig | ResNetConfig) else \
        config_from_name(name, **overrides)
    model = ResNetV2(cfg) if isinstance(cfg, ResNetConfig) else VisionTransformer(cfg)
    if weights is not None:
        load_weights(model, weights)
    return model
