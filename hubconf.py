"""torch.hub entry points, one per named variant of `vitlab.list_models()`:

    model = torch.hub.load("/path/to/vitlab", "vit_b16", source="local")                     # random init
    model = torch.hub.load("/path/to/vitlab", "vit_b16", source="local", weights="hf-hub:google/vit-base-patch16-224")
    model = torch.hub.load("/path/to/vitlab", "vit_ti16", source="local", depth=4, num_classes=10)  # overrides

`weights` is anything `vitlab.load_weights` takes (a registry name, "hf-hub:owner/repo", a URL, a local file);
keyword arguments override ViTConfig fields. Names: "ViT-B/16" -> vit_b16, "R50+ViT-B/16" -> r50_vit_b16.
"""

import inspect as _inspect
import pathlib as _pathlib
import re as _re
import sys as _sys

dependencies = ["torch", "numpy", "safetensors", "tqdm"]  # what `import vitlab` needs (checked by torch.hub)

_SRC = _pathlib.Path(__file__).resolve().parent / "src"
if _SRC.is_dir() and str(_SRC) not in _sys.path:  # a checkout that is not installed
    _sys.path.insert(0, str(_SRC))

import vitlab as _vitlab  # noqa: E402


def _entry_name(variant: str) -> str:
    """"ViT-B/16" -> "vit_b16", "R50+ViT-B/16" -> "r50_vit_b16"."""
    return _re.sub(r"[^a-z0-9]+", "_", variant.lower().replace("vit-", "vit_").replace("/", "")).strip("_")


def _make_entry(variant: str):
    def entry(*, weights=None, **overrides):
        if weights is None:
            return _vitlab.create_model(variant, **overrides)
        if "weights" in _inspect.signature(_vitlab.create_model).parameters:
            return _vitlab.create_model(variant, weights=weights, **overrides)
        model = _vitlab.create_model(variant, **overrides)
        _vitlab.load_weights(model, weights)
        return model.eval()

    entry.__name__ = entry.__qualname__ = _entry_name(variant)
    entry.__doc__ = (f"{variant}: `vitlab.create_model({variant!r}, **overrides)`; with `weights=NAME`, loaded from "
                     "any checkpoint name vitlab.load_weights takes (registry name, hf-hub:owner/repo, URL, file).")
    return entry


for _variant in _vitlab.list_models():
    globals()[_entry_name(_variant)] = _make_entry(_variant)
