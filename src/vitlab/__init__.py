"""vitlab: the Vision Transformer of "An Image is Worth 16x16 Words" (Dosovitskiy et al., ICLR 2021)."""

from .config import ViTConfig, list_models
from .flops import count_flops, count_params
from .model import VisionTransformer, create_model
from .optimize import optimize
from .posembed import resample_pos_embed, sincos_2d
from .weights import load_model, load_weights, save_weights

__version__ = "0.1.0"

__all__ = [
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
