"""The Hub's folder methods of vitlab's models: `save_pretrained`, `from_pretrained`, `push_to_hub`.

    model.save_pretrained("my-vit")                       # config.json + model.safetensors (+ README.md)
    model = vitlab.load_model("my-vit")                   # or VisionTransformer.from_pretrained / ResNetV2...
    model.push_to_hub("owner/my-vit")                     # the same folder, uploaded in one commit

What huggingface_hub's `PyTorchModelHubMixin` gives any `nn.Module`, in vitlab's folder: config.json holds the
model's config (a ViTConfig, or a BiT ResNet's ResNetConfig with "arch": "resnetv2") and preprocessing,
model.safetensors the weights with vitlab's header (`vitlab.weights.publish`). `VisionTransformer` and `ResNetV2`
inherit it, so the model classes keep to the network.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any, Self


class HubMixin:
    """`save_pretrained` / `from_pretrained` / `push_to_hub` for a vitlab model (see `vitlab.weights.publish`)."""

    def save_pretrained(self, save_directory: str | Path, **kwargs: Any) -> Path:
        """Write config.json + model.safetensors (+ README.md); see `vitlab.weights.publish.save_pretrained`."""
        model: Any = self
        return _publish().save_pretrained(model, save_directory, **kwargs)  # type: ignore[no-any-return]

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, **kwargs: Any) -> Self:
        """A model from a Hub folder or "owner/repo"; see `vitlab.weights.publish.from_pretrained`.

        Raises:
            TypeError: the folder holds another kind of model (`vitlab.load_model` takes either).
        """
        model = _publish().from_pretrained(name_or_path, **kwargs)
        if not isinstance(model, cls):
            raise TypeError(f"{name_or_path} holds a {type(model).__name__}, not a {cls.__name__}; "
                            "vitlab.load_model loads either")
        return model

    def push_to_hub(self, repo_id: str, **kwargs: Any) -> Any:
        """Upload `save_pretrained`'s folder in one commit; see `vitlab.weights.publish.push_to_hub`."""
        model: Any = self
        return _publish().push_to_hub(model, repo_id, **kwargs)


def _publish() -> ModuleType:
    from .weights import publish  # on use: vitlab.weights imports the model classes that inherit this

    return publish
