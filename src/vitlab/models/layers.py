"""What the ViT (`vitlab.models.vit`) and the BiT ResNet (`vitlab.models.resnet`) share outside the network itself:
the zero-initialised classifier head of fine-tuning and the check of what the model is given as images. A leaf
module (torch only): both import it, neither imports the other."""

from __future__ import annotations

import torch
from torch import nn

_EXPECTED = "a float tensor of shape (B, C, H, W), normalised as the weights expect"


def zero_head(num_features: int, num_classes: int, like: torch.Tensor) -> nn.Linear | nn.Identity:
    """A zero-initialised Linear head (the paper's fine-tuning head, Sec. 3.2; BiT's too) on `like`'s device and
    dtype; nn.Identity for `num_classes` 0 (features out)."""
    if not num_classes:
        return nn.Identity()
    head = nn.Linear(num_features, num_classes, device=like.device, dtype=like.dtype)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    return head


def check_images(x: object, weight: torch.Tensor) -> None:
    """TypeError / ValueError in our words for what the model cannot take (metadata only: no sync, no copy).

    Args:
        x: What was given as images.
        weight: The first weight the images meet (its dtype and device are what `x` must match).
    """
    if not isinstance(x, torch.Tensor):
        module = type(x).__module__
        given = type(x).__name__ if module == "builtins" else f"{module}.{type(x).__name__}"
        hint = " (torch.from_numpy(a) makes it one)" if module == "numpy" else ""
        raise TypeError(f"expected {_EXPECTED}; got {given}{hint}")
    if x.dtype == torch.uint8:
        raise TypeError(f"got uint8 pixels; expected {_EXPECTED}: convert with vitlab.data.transforms_for(model) "
                        f"(PIL images), or scale to [0, 1] and apply model.preprocess's normalisation")
    if not x.is_floating_point():
        raise TypeError(f"got a tensor of dtype {str(x.dtype).removeprefix('torch.')}; expected {_EXPECTED}")
    if x.dim() != 4:
        raise ValueError(f"expected images of shape (B, C, H, W), got {tuple(x.shape)}")
    if x.device != weight.device and weight.device.type != "meta":
        raise ValueError(f"the images are on {x.device} and the model on {weight.device}: move one of them "
                         f"(images.to(device) or model.to(device))")
    if x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
        dtype, wdtype = (str(t).removeprefix("torch.") for t in (x.dtype, weight.dtype))
        raise TypeError(f"got {dtype} images for a {wdtype} model; convert with images.to(torch.{wdtype}) (or run "
                        f"under torch.autocast)")
