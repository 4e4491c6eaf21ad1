"""vitlab: the Vision Transformer of "An Image is Worth 16x16 Words" (Dosovitskiy et al., ICLR 2021).

The package is a stack of floors, each importing only the floors below it (pyproject.toml's import-linter
contract, run by `make test`):

    cli                  the `vitlab` command: parses arguments, imports the rest only for the command that runs
    paper                `vitlab reproduce`: the paper's claims, re-run small
    train | serving      the training loop, recipes (the shipped ones: `vitlab.train.recipes`), the demo |
                         `vitlab serve`: a model behind an HTTP API (batching, bounded queue, restarts, a page)
    analysis | bench     looking inside a model | timing it against its peers (independent of each other)
    inference            evaluate, predict
    deploy               vitlab.optimize's speed modes, ONNX / OpenVINO runtimes and export, static int8
    data                 data sets, transforms, the input pipeline
    weights              files in and out, the Hub, and the factory: create_model(name, weights=...)
    models               ViTConfig and its variants, the ViT, the hybrid stem, BiT ResNets, preprocessing, FLOPs
    perf                 this CPU, mixed precision, measured choices cached per machine
    utils                atomic writes, progress bars, optional dependencies
"""

import importlib
from typing import TYPE_CHECKING, Any

from .utils.version import __version__ as __version__

if TYPE_CHECKING:
    from .deploy.optimize import optimize
    from .inference.predict import predict
    from .models.config import ViTConfig, list_models
    from .models.flops import count_flops, count_params
    from .models.posembed import resample_pos_embed, sincos_2d
    from .models.preprocess import Preprocess
    from .models.vit import VisionTransformer
    from .serving import serve
    from .weights import create_model, load_model, load_weights, save_weights

# public name -> module defining it. Imported on first use, so `import vitlab` (and `vitlab --help`) does not pay
# for torch until a name that needs it is touched.
_LAZY = {
    "ViTConfig": "models.config", "list_models": "models.config", "count_flops": "models.flops",
    "count_params": "models.flops", "VisionTransformer": "models.vit", "create_model": "weights",
    "optimize": "deploy.optimize", "predict": "inference.predict", "resample_pos_embed": "models.posembed",
    "sincos_2d": "models.posembed", "Preprocess": "models.preprocess", "load_model": "weights",
    "load_weights": "weights", "save_weights": "weights", "serve": "serving",
}

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
    "serve",
    "sincos_2d",
]

# imported on first use: `vitlab.data.transforms_for(model)`
_SUBPACKAGES = ("analysis", "bench", "data", "deploy", "inference", "models", "paper", "perf", "serving", "train",
                "utils", "weights")


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
