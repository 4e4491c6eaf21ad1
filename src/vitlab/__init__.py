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
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
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

# The modules of the flat layout before the floors, and where each lives now. `import vitlab.model` (and every
# other old path) still works until the next release: it warns and returns the new module itself.
_MOVED = {
    "_extras": "utils.extras", "_progress": "utils.progress", "io": "utils.io",
    "allocator": "perf.allocator", "autotune": "perf.autotune", "precision": "perf.precision",
    "config": "models.config", "model": "models.vit", "resnet": "models.resnet", "hybrid": "models.hybrid",
    "posembed": "models.posembed", "layers": "models.layers", "flops": "models.flops",
    "preprocess": "models.preprocess",
    "optimize": "deploy.optimize", "autoselect": "deploy.autoselect", "quant": "deploy.quant",
    "export": "deploy.export",
    "evaluate": "inference.evaluate", "predict": "inference.predict", "recipes": "train.recipes",
}


def _caller_level() -> int:
    """The `stacklevel`, seen from `_moved`, of the first frame outside this file and the import machinery: the line
    that imported the old path, so the warning points there (and shows by default when that is `__main__`).
    `warnings` does not count the frames of importlib._bootstrap, so neither does this."""
    frame, level = sys._getframe(2), 2  # the frame above `_moved`
    while frame is not None and (frame.f_code.co_filename == __file__ or "importlib" in frame.f_code.co_filename):
        level += "_bootstrap" not in frame.f_code.co_filename
        frame = frame.f_back  # type: ignore[assignment]
    return level


def _moved(old: str) -> types.ModuleType:
    """The module that `vitlab.<old>` became, with a DeprecationWarning naming its new path."""
    new = f"{__name__}.{_MOVED[old]}"
    warnings.warn(f"{__name__}.{old} is now {new}; the old path goes in the next release", DeprecationWarning,
                  stacklevel=_caller_level())
    return importlib.import_module(new)


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `vitlab.<old>` for the old paths in `_MOVED`; loading it returns the new module object (not a copy),
    so `import vitlab.model` and `from vitlab.precision import autocast` see, and patch, the module in use."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        package, _, old = fullname.rpartition(".")
        if package != __name__ or old not in _MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _moved(spec.name.rpartition(".")[2])
        spec.loader_state = module.__spec__  # the import system sets the old path's spec on it next; undone below
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # already executed under its new name, which it keeps (__name__, __file__ and __spec__ say the new path)
        assert module.__spec__ is not None
        module.__spec__ = module.__spec__.loader_state


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedFinder())


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value  # once: later lookups are plain module attributes
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _MOVED:
        return importlib.import_module(f"{__name__}.{name}")  # through _MovedFinder: warns, binds the new module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBPACKAGES})


class _Package(types.ModuleType):
    """`vitlab.optimize` and `vitlab.predict` are functions named like the old modules that defined them. Importing
    such a module path (`import vitlab.optimize`) binds the module on the package; keep the function there instead
    (the module stays importable: `from vitlab.deploy.optimize import MODES`)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and name in _LAZY and hasattr(value, name):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
