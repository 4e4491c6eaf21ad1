"""The hybrid's input: tokens from a ResNet feature map instead of raw patches (paper Sec. 3.1, "Hybrid
Architecture"; Sec. 4.1: ResNet-50 as in BiT, GroupNorm and weight-standardised convolutions, stage 4 dropped
and stage 3 extended to 9 blocks for R50+ViT-B/16).

The ResNet is BiT's v2 layout in its post-activation form, as in Google's hybrid checkpoints:

    stem:   StdConv 7x7 / 2 -> GroupNorm -> ReLU -> max-pool 3x3 / 2       (stride 4)
    stage:  Bottleneck blocks (1x1 -> 3x3 -> 1x1, GroupNorm after each, ReLU after the first two and after the
            residual sum); the first block of a stage projects the shortcut (1x1 StdConv + GroupNorm) and, from
            the second stage on, halves the resolution (stride 2 in its 3x3).

Padding is TensorFlow's "SAME" (input-size dependent, extra pixel on the bottom/right), as in the JAX models.
Weight standardisation and GroupNorm take their epsilons from the weights' source (`ViTConfig.hybrid_eps`, see
`EPS`): timm's ResNetV2 and Google's vit_jax differ in both, and for a filter with small variance or a nearly
flat image the difference reaches the logits.

Module names follow timm's ResNetV2 (`patch_embed.backbone.stem.conv.weight`, `...stages.0.blocks.0.conv1.weight`)
so timm's `vit_*_r*` hybrids interchange weights; with no stages the backbone is the bare stem, as in timm.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

GROUPS = 32  # GroupNorm groups, as in BiT


class Eps(NamedTuple):
    """A convention's epsilons: standardised weight (w - mean) / sqrt(var + ws), or / (std + ws) when
    `ws_on_std`; GroupNorm divides by sqrt(var + gn)."""

    ws: float
    ws_on_std: bool
    gn: float


EPS = {
    # timm ResNetV2 as its ViT hybrids build it (vision_transformer_hybrid.py: StdConv2dSame eps=1e-8, GroupNormAct
    # default eps 1e-5)
    "timm": Eps(ws=1e-8, ws_on_std=False, gn=1e-5),
    # Google's vit_jax: models_resnet.weight_standardize(w, axis=[0, 1, 2], eps=1e-5) divides by std + eps;
    # flax.linen.GroupNorm's epsilon defaults to 1e-6
    "vit_jax": Eps(ws=1e-5, ws_on_std=True, gn=1e-6),
    # Google's BiT in PyTorch (big_transfer bit_pytorch/models.py: StdConv2d divides by sqrt(var + 1e-10);
    # nn.GroupNorm's default 1e-5), the reference for its released `.npz` files
    "bit": Eps(ws=1e-10, ws_on_std=False, gn=1e-5),
}


def _same_pad(x: torch.Tensor, k: int, s: int, value: float = 0.0) -> torch.Tensor:
    """TensorFlow "SAME" padding for a k x k window at stride s: output ceil(in / s), extra pixel bottom/right."""
    ih, iw = x.shape[-2:]
    ph = max((math.ceil(ih / s) - 1) * s + k - ih, 0)
    pw = max((math.ceil(iw / s) - 1) * s + k - iw, 0)
    if ph or pw:
        x = F.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2], value=value)
    return x


class StdConv2d(nn.Conv2d):
    """Convolution with weight standardisation (each filter: zero mean, unit variance), no bias; "SAME" padding,
    or with `same=False` PyTorch's symmetric k // 2 (BiT's PyTorch port and timm's `resnetv2_*_bit`)."""

    def __init__(self, cin: int, cout: int, k: int, stride: int = 1, eps: str = "timm", same: bool = True):
        super().__init__(cin, cout, k, stride=stride, padding=0 if same else k // 2, bias=False)
        self.eps, self.on_std = EPS[eps].ws, EPS[eps].ws_on_std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        mean = w.mean(dim=(1, 2, 3), keepdim=True)
        var = w.var(dim=(1, 2, 3), keepdim=True, unbiased=False)
        w = (w - mean) / (var.sqrt() + self.eps if self.on_std else torch.sqrt(var + self.eps))
        k, s = self.kernel_size[0], self.stride[0]
        if self.padding != (0, 0):  # symmetric padding (same=False)
            return F.conv2d(x, w, None, s, self.padding)
        if s == 1 and k % 2:  # SAME at stride 1 is symmetric for odd k: the convolution pads, no padded copy
            return F.conv2d(x, w, None, 1, (k - 1) // 2)
        if k == 1:  # SAME never pads a 1x1 window; subsampling first is the same result, ~30% faster to train
            return F.conv2d(x[:, :, ::s, ::s], w)
        return F.conv2d(_same_pad(x, k, s), w, None, s)


class GroupNormAct(nn.GroupNorm):
    """GroupNorm (32 groups unless `groups` says otherwise) followed by ReLU unless `act=False`."""

    def __init__(self, channels: int, act: bool = True, eps: str = "timm", groups: int = GROUPS):
        super().__init__(groups, channels, eps=EPS[eps].gn)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = super().forward(x)
        return F.relu(x) if self.act else x


def set_eps(backbone: nn.Module, eps: str) -> None:
    """Switch a built backbone to another source's epsilons (weights loaded from that source), in place."""
    for m in backbone.modules():
        if isinstance(m, StdConv2d):
            m.eps, m.on_std = EPS[eps].ws, EPS[eps].ws_on_std
        elif isinstance(m, GroupNormAct):
            m.eps = EPS[eps].gn


class MaxPoolSame(nn.Module):
    """3x3 / 2 max-pool with "SAME" padding (pads with -inf, so padding never wins)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _same_pad(x, 3, 2, value=float("-inf"))
        # ATen's channels-last max-pool vectorises over channels: on CPU 5x faster forward, 1.5x with backward
        x = F.max_pool2d(x.contiguous(memory_format=torch.channels_last), 3, 2)
        return x.contiguous()


class Downsample(nn.Module):
    """The projection shortcut of a stage's first block."""

    def __init__(self, cin: int, cout: int, stride: int, eps: str = "timm"):
        super().__init__()
        self.conv = StdConv2d(cin, cout, 1, stride, eps)
        self.norm = GroupNormAct(cout, act=False, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


class Bottleneck(nn.Module):
    """1x1 (width) -> 3x3 (width, stride) -> 1x1 (4 x width), GroupNorm after each; ReLU after the sum."""

    def __init__(self, cin: int, cout: int, stride: int, project: bool, eps: str = "timm"):
        super().__init__()
        mid = cout // 4
        self.downsample = Downsample(cin, cout, stride, eps) if project else None
        self.conv1 = StdConv2d(cin, mid, 1, eps=eps)
        self.norm1 = GroupNormAct(mid, eps=eps)
        self.conv2 = StdConv2d(mid, mid, 3, stride, eps)
        self.norm2 = GroupNormAct(mid, eps=eps)
        self.conv3 = StdConv2d(mid, cout, 1, eps=eps)
        self.norm3 = GroupNormAct(cout, act=False, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        x = self.norm1(self.conv1(x))
        x = self.norm2(self.conv2(x))
        x = self.norm3(self.conv3(x))
        return F.relu(x + shortcut)


class Stage(nn.Module):
    def __init__(self, cin: int, cout: int, depth: int, stride: int, eps: str = "timm"):
        super().__init__()
        self.blocks = nn.Sequential(*[
            Bottleneck(cin if i == 0 else cout, cout, stride if i == 0 else 1, project=i == 0, eps=eps)
            for i in range(depth)
        ])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


def make_stem(in_chans: int, width: int, eps: str = "timm") -> nn.Sequential:
    return nn.Sequential(OrderedDict(conv=StdConv2d(in_chans, width, 7, 2, eps), norm=GroupNormAct(width, eps=eps),
                                     pool=MaxPoolSame()))


class ResNetBackbone(nn.Module):
    """Stem plus stages; stage i has `layers[i]` bottlenecks of width `width * 2**i` (outputs 4x that)."""

    def __init__(self, in_chans: int, layers: tuple[int, ...], width: int, eps: str = "timm"):
        super().__init__()
        self.stem = make_stem(in_chans, width, eps)
        stages, cin = [], width
        for i, depth in enumerate(layers):
            cout = 4 * width * 2**i
            stages.append(Stage(cin, cout, depth, stride=1 if i == 0 else 2, eps=eps))
            cin = cout
        self.stages = nn.Sequential(*stages)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(x))


def build_backbone(in_chans: int, layers: tuple[int, ...], width: int, eps: str = "timm") -> nn.Module:
    """The ResNet for `ViTConfig.hybrid_layers` / `hybrid_width` / `hybrid_eps`; with no stages, the bare stem
    (timm's layout)."""
    return ResNetBackbone(in_chans, layers, width, eps) if layers else make_stem(in_chans, width, eps)


def backbone_channels(layers: tuple[int, ...], width: int) -> int:
    """Channels of the feature map the tokens are projected from."""
    return 4 * width * 2 ** (len(layers) - 1) if layers else width


@torch.no_grad()
def init_backbone(backbone: nn.Module) -> None:
    """He-normal (fan-out) convolutions, unit GroupNorm scales, zero shifts: the usual ResNet init."""
    for m in backbone.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.GroupNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def backbone_macs(in_chans: int, layers: tuple[int, ...], width: int, h: int, w: int) -> int:
    """Multiply-adds of the backbone's convolutions for one (h, w) image ("SAME" padding: sizes are ceil(in/s))."""
    h, w = math.ceil(h / 2), math.ceil(w / 2)
    macs = h * w * in_chans * width * 7 * 7  # stem conv
    h, w = math.ceil(h / 2), math.ceil(w / 2)  # max-pool
    cin = width
    for i, depth in enumerate(layers):
        cout = 4 * width * 2**i
        mid = cout // 4
        for b in range(depth):
            s = 2 if i > 0 and b == 0 else 1
            macs += h * w * cin * mid  # conv1, at the input resolution
            h, w = math.ceil(h / s), math.ceil(w / s)
            macs += h * w * (mid * mid * 9 + mid * cout)  # conv2 (strided), conv3
            if b == 0:
                macs += h * w * cin * cout  # projection shortcut
            cin = cout
    return macs
