"""Write src/vitlab/weights/timm_arch_table.json: the construction arguments of every ViT architecture timm registers.

Run at development time, with the timm version the table should describe installed (1.0.31 today):

    .venv/bin/python tools/gen_timm_arch_table.py

For each function registered in timm's vision_transformer.py, deit.py and eva.py it records the keyword arguments
the function hands to the model's constructor (its `model_args`, captured by calling it with the constructor
replaced), turned into JSON data, plus the input size and class count of the architecture's default
pretrained config (timm fills img_size / num_classes from it when the function does not set them). eva.py's
architectures are a different class (timm's Eva): their rows say so ("class": "Eva") and vitlab.weights.eva
reads their arguments (refusing by name what vitlab's ViT does not compute). vitlab reads the table at run time
(vitlab.weights.timm_arch) without importing timm; tests/test_weights_timm_arch.py checks every row against the
model timm builds (the Eva rows: tests/test_families_rope.py).
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
from pathlib import Path
from typing import Any

import timm
import torch.nn as nn
from timm.layers import activations
from timm.models import deit, eva, get_pretrained_cfg
from timm.models import vision_transformer as vt
from timm.models._registry import _model_entrypoints

OUT = Path(__file__).resolve().parents[1] / "src" / "vitlab" / "weights" / "timm_arch_table.json"
_ACTS = {nn.GELU: "gelu", activations.GELU: "gelu", activations.GELUTanh: "gelu_tanh",
         activations.QuickGELU: "quick_gelu", nn.SiLU: "silu"}


def _layer(value: Any) -> dict[str, Any]:
    """A class or functools.partial of one as data: its name and the keyword arguments that change numbers."""
    cls, kw = (value.func, dict(value.keywords)) if isinstance(value, functools.partial) else (value, {})
    out: dict[str, Any] = {"layer": cls.__name__}
    params = inspect.signature(cls).parameters
    if "eps" in params:
        out["eps"] = kw.get("eps", params["eps"].default)
    if "gate_last" in params:
        out["gate_last"] = kw.get("gate_last", params["gate_last"].default)
    return out


def _value(key: str, value: Any) -> Any:
    """One constructor argument as JSON-like data."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple | list):
        return [_value(key, v) for v in value]
    if key == "act_layer" and value in _ACTS:
        return _ACTS[value]
    if isinstance(value, type | functools.partial):
        return _layer(value)
    raise TypeError(f"{key}={value!r}: no data form")


def _capture(module: Any, create: str, names: list[str]) -> dict[str, tuple[str, dict[str, Any]]]:
    """arch -> (constructor, kwargs) for the architectures `names` of `module`, by calling each registered
    function with `module.<create>` replaced."""
    got: dict[str, tuple[str, dict[str, Any]]] = {}
    original = getattr(module, create)

    def stub(variant: str, pretrained: bool = False, **kwargs: Any) -> None:
        distilled = kwargs.pop("distilled", False)
        got[variant] = ("VisionTransformerDistilled" if distilled else "VisionTransformer", kwargs)

    setattr(module, create, stub)
    try:
        for name in names:
            _model_entrypoints[name](pretrained=False)
    finally:
        setattr(module, create, original)
    return got


def _row(arch: str, module: str, cls: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    cfg = get_pretrained_cfg(arch)
    row: dict[str, Any] = {"module": module, "class": cls, "tag": cfg.tag}
    size = list(cfg.input_size[1:]) if cfg.fixed_input_size else None
    row["default_img_size"] = size[0] if size and size[0] == size[1] else size
    row["default_num_classes"] = cfg.num_classes
    if module == "eva":
        row["class"] = "Eva"
    row["args"] = {k: _value(k, v) for k, v in sorted(kwargs.items())}
    return row


def dumps(version: str, table: dict[str, dict[str, Any]]) -> str:
    """The table as JSON, {"timm_version": ..., "archs": {arch: row}}, one architecture a line (diffs show rows)."""
    rows = ",\n".join(f"  {json.dumps(arch)}: {json.dumps(row)}" for arch, row in table.items())
    return f'{{\n "timm_version": {json.dumps(version)},\n "archs": {{\n{rows}\n }}\n}}\n'


def main() -> int:
    table: dict[str, dict[str, Any]] = {}
    for module, create, short in ((vt, "_create_vision_transformer", "vision_transformer"),
                                  (deit, "_create_deit", "deit"), (eva, "_create_eva", "eva")):
        names = timm.list_models(module=short)
        for arch, (cls, kwargs) in sorted(_capture(module, create, names).items()):
            table[arch] = _row(arch, short, cls, kwargs)
    OUT.write_text(dumps(timm.__version__, table), encoding="utf-8")
    print(f"{len(table)} architectures -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
