"""vitlab: the Vision Transformer of "An Image is Worth 16x16 Words" (Dosovitskiy et al., ICLR 2021)."""

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import ViTConfig, list_models
    from .flops import count_flops, count_params
    from .model import VisionTransformer, create_model
    from .optimize import optimize
    from .posembed import resample_pos_embed, sincos_2d
    from .predict import predict
    from .preprocess import Preprocess
    from .weights import load_model, load_weights, save_weights

# public name -> module defining it. Imported on first use, so `import vitlab` (and `vitlab --help`) does not pay
# for torch until a name that needs it is touched.
_LAZY = {
    "ViTConfig": "config", "list_models": "config", "count_flops": "flops", "count_params": "flops",
    "VisionTransformer": "model", "create_model": "model", "optimize": "optimize", "predict": "predict",
    "resample_pos_embed": "posembed", "sincos_2d": "posembed", "Preprocess": "preprocess",
    "load_model": "weights", "load_weights": "weights", "save_weights": "weights",
}

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
    "predict",
    "resample_pos_embed",
    "save_weights",
    "sincos_2d",
]


_SUBPACKAGES = ("analysis", "data", "recipes", "train")  # imported on first use: `vitlab.data.transforms_for(model)`


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value  # once: later lookups are plain module attributes
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBPACKAGES})


class _Package(types.ModuleType):
    """`vitlab.optimize` and `vitlab.predict` are functions named like the modules that define them. Importing such
    a module binds the module on the package; keep the function there, as an eager `from .optimize import optimize`
    would (the module itself stays importable: `from vitlab.optimize import MODES`)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _LAZY.get(name) == name:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
