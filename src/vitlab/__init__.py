"""vitlab: the Vision Transformer of "An Image is Worth 16x16 Words" (Dosovitskiy et al., ICLR 2021)."""

import importlib
from typing import Any

from .config import ViTConfig, list_models
from .flops import count_flops, count_params
from .model import VisionTransformer, create_model
from .optimize import optimize
from .posembed import resample_pos_embed, sincos_2d
from .preprocess import Preprocess
from .weights import load_model, load_weights, save_weights

__version__ = "0.1.0"

__all__ = [
    "Preprocess",
    "ViTConfig",
    "VisionTransformer",
    "count_flops",
    "count_params",
    "create_model",
    "list_models",
    "load_model",
    "load_weights",
    "optimize",
    "resample_pos_embed",
    "save_weights",
    "sincos_2d",
]


_SUBPACKAGES = ("analysis", "data", "train")  # imported on first use: `vitlab.data.transforms_for(model)`


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
