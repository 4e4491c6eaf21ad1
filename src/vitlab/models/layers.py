"""Small modules around the ViT (`vitlab.models.vit`) and the BiT ResNet (`vitlab.models.resnet`): the
zero-initialised classifier head of fine-tuning, the check of what the model is given as images, and the switches
the later ViT families add (activation, LayerScale, SwiGLU, MAP head), each built only when a ViTConfig field asks.
A leaf module (torch only): both models import it, neither imports the other."""

from __future__ import annotations

import torch
import torch.nn.functional as F
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


# -- the later families' switches: each off (nn.Identity / the plain module) unless a ViTConfig field asks -----------

def activation(name: str) -> nn.Module:
    """The MLP's nonlinearity by ViTConfig.act: exact GELU (the paper), tanh GELU (SigLIP2), QuickGELU (OpenAI CLIP:
    x * sigmoid(1.702 x), Radford et al. 2021) or SiLU (SwiGLU's gate)."""
    if name == "gelu":
        return nn.GELU()
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    if name == "quick_gelu":
        return QuickGELU()
    if name == "silu":
        return nn.SiLU()
    raise ValueError(f"unknown activation {name!r}")


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): the GELU approximation OpenAI's CLIP was trained with."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class LayerScale(nn.Module):
    """A learned per-channel scale on each residual branch (CaiT, Touvron et al. ICCV 2021), timm's `ls1/ls2.gamma`."""

    def __init__(self, dim: int, init: float):
        super().__init__()
        self.init = init
        self.gamma = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class SwiGLU(nn.Module):
    """Gated MLP (Shazeer 2020; DINOv2-g, EVA-02): fc1 gives a gate and a value half, act(gate) * value -> fc2.
    timm's packed layout (`SwiGLUPacked`): the gate is the first half of fc1's rows."""

    def __init__(self, dim: int, hidden: int, act: str, norm: bool, eps: float, dropout: float):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)  # (hidden, D): [gate; value]
        self.act = activation(act)
        self.drop1 = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(hidden // 2, eps=eps) if norm else nn.Identity()  # EVA-02's sub-LN
        self.fc2 = nn.Linear(hidden // 2, dim)
        self.drop2 = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.fc1(x).chunk(2, dim=-1)  # each (B, T, hidden / 2)
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(gate) * value))))


class AttentionPool(nn.Module):
    """Multihead attention pooling (MAP; Lee et al. 2019, the SigLIP head, big_vision's MAPHead): a learned latent
    query attends over the tokens, then a residual MLP. timm's `AttentionPoolLatent` names, latent length 1."""

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, act: str, eps: float, qkv_bias: bool = True):
        super().__init__()
        self.num_heads = num_heads
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))  # (1, 1, D): the query
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.mlp = _MapMlp(dim, mlp_dim, act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        h = self.num_heads
        q = self.q(self.latent).reshape(1, 1, h, D // h).transpose(1, 2).expand(B, -1, -1, -1)  # (B, h, 1, hd)
        k, v = self.kv(x).reshape(B, N, 2, h, D // h).permute(2, 0, 3, 1, 4).unbind(0)  # each (B, h, N, hd)
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, 1, D)
        y = self.proj(y)
        y = y + self.mlp(self.norm(y))  # (B, 1, D)
        return y[:, 0]  # (B, D)


class _MapMlp(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = activation(act)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))
