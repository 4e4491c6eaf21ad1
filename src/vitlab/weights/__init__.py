"""Weights in and out: vitlab `.safetensors`, Google vit_jax `.npz`, timm, transformers and torchvision.

    model = vitlab.load_model("run/final.safetensors")            # architecture from the file
    report = vitlab.load_weights(model, "ViT-B_16.npz")           # any supported format, detected
    vitlab.save_weights(model, "out.safetensors", {"recipe": ...})
    vitlab.weights.read_metadata("out.safetensors")               # -> {"recipe": ...}
    model = vitlab.create_model("ViT-B/16", weights="augreg_in21k_ft_in1k")  # build + load (`factory`)
    vitlab.weights.save_pretrained(model, "my-vit"); vitlab.load_model("my-vit")  # the Hub's folder layout
    vitlab.weights.push_to_hub(model, "owner/my-vit")             # the same folder, uploaded in one commit
    vitlab.weights.export(model, "hf-dir", "hf")                  # transformers / torchvision / timm files
    vitlab.weights.convert("ViT-B_16.npz", "vit.pth", to="torchvision")  # any source to any of those, in one call
"""

from .api import load_model, load_weights, read_config, read_metadata, save_weights
from .convert import ConvertResult, convert
from .factory import create_model
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
    "create_model",
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
