"""Weights in and out: vitlab `.safetensors`, Google vit_jax `.npz`, timm, transformers and torchvision.

    model = vitlab.load_model("run/final.safetensors")            # architecture from the file
    report = vitlab.load_weights(model, "ViT-B_16.npz")           # any supported format, detected
    vitlab.save_weights(model, "out.safetensors", {"recipe": ...})
    vitlab.weights.read_metadata("out.safetensors")               # -> {"recipe": ...}
"""

from .api import load_model, load_weights, read_config, read_metadata, save_weights
from .report import LoadReport, ShapeMismatchError, WeightsError, WeightsWarning
from .safety import UnsafeCheckpointError

__all__ = [
    "LoadReport",
    "ShapeMismatchError",
    "UnsafeCheckpointError",
    "WeightsError",
    "WeightsWarning",
    "load_model",
    "load_weights",
    "read_config",
    "read_metadata",
    "save_weights",
]
