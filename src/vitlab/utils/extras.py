"""Optional dependencies: which `pip install 'vitlab[EXTRA]'` brings a module, and the error that says so.

The core install is what `import vitlab`, the models, weights and preprocessing need. Commands that need
more import it through `require` (or inside `with needs(...)`), so a missing module fails with the install line:

    with needs("analysis", "the analysis figures"):
        from matplotlib.figure import Figure
    ort = require("onnxruntime", "export", "checking the exported graph")
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

# extra -> the top-level modules it provides (pyproject.toml's [project.optional-dependencies], by import name;
# tests/test_packaging.py checks the two agree).
EXTRAS: dict[str, tuple[str, ...]] = {
    "train": ("tensorboard", "matplotlib"),
    "analysis": ("matplotlib",),
    "export": ("onnx", "onnxruntime", "onnxscript"),
    "data": ("webdataset",),
    "bench": ("matplotlib", "timm", "transformers", "onnx", "onnxruntime", "onnxscript"),
    "paper": ("sklearn", "matplotlib"),
    "quant": ("torchao",),
    "openvino": ("openvino", "nncf"),
    "serve": ("fastapi", "uvicorn", "httptools", "uvloop", "python_multipart", "prometheus_client"),
}
# pip distribution names whose import name differs (pyproject lists distributions; EXTRAS lists modules)
IMPORT_NAMES: dict[str, str] = {"scikit_learn": "sklearn"}


class MissingExtraError(ModuleNotFoundError):
    """An optional dependency is not installed; the message names the extra that installs it."""

    def __init__(self, module: str, extra: str, what: str | None = None):
        need = f"{what} needs {module!r}" if what else f"{module!r} is needed here"
        super().__init__(f"{need}, which is not installed: pip install 'vitlab[{extra}]'", name=module)
        self.extra = extra


@contextmanager
def needs(extra: str, what: str | None = None) -> Iterator[None]:
    """Turn a ModuleNotFoundError for one of `extra`'s modules raised inside the block into MissingExtraError.

    Errors for other modules (a bug, or a broken install of something else) pass through unchanged.
    """
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; known: {', '.join(EXTRAS)}")
    try:
        yield
    except MissingExtraError:
        raise
    except ModuleNotFoundError as e:
        top = (e.name or "").partition(".")[0]
        if top not in EXTRAS[extra]:
            raise
        raise MissingExtraError(top, extra, what) from e


def require(module: str, extra: str, what: str | None = None) -> ModuleType:
    """`importlib.import_module(module)`, raising MissingExtraError naming `extra` when it is not installed."""
    with needs(extra, what):
        return importlib.import_module(module)
