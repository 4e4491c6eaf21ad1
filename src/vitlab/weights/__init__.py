"""Weights in and out: vitlab `.safetensors`, Google vit_jax `.npz`, timm, transformers and torchvision.

    model = vitlab.load_model("run/final.safetensors")            # architecture from the file
    report = vitlab.load_weights(model, "ViT-B_16.npz")           # any supported format, detected
    vitlab.save_weights(model, "out.safetensors", {"recipe": ...})
    vitlab.weights.read_metadata("out.safetensors")               # -> {"recipe": ...}
    model.save_pretrained("my-vit"); vitlab.VisionTransformer.from_pretrained("my-vit")  # the Hub's layout
    vitlab.weights.export(model, "hf-dir", "hf")                  # transformers / torchvision / timm files
    vitlab.weights.convert("ViT-B_16.npz", "vit.pth", to="torchvision")  # any source to any of those, in one call
"""

from .api import load_model, load_weights, read_config, read_metadata, save_weights
from .convert import ConvertResult, convert
from .publish import export, from_pretrained, push_to_hub, save_pretrained
from .report import LoadReport, ShapeMismatchError, WeightsError, WeightsWarning
from .safety import UnsafeCheckpointError

__all__ = [
    "ConvertResult",
    "LoadReport",
    "ShapeMismatchError",
    "UnsafeCheckpointError",
    "WeightsError",
    "WeightsWarning",
    "convert",
    "export",
    "from_pretrained",
    "load_model",
    "load_weights",
    "push_to_hub",
    "read_config",
    "read_metadata",
    "save_pretrained",
    "save_weights",
]
