"""BiT ResNets: the paper's CNN baseline (Sec. 4.1 and Table 2: "Big Transfer (BiT), which performs supervised
transfer learning with large ResNets"; Kolesnikov et al., 2020).

A ResNet-v2 (pre-activation: He et al., 2016, "Identity Mappings") with GroupNorm and weight-standardised
convolutions in place of BatchNorm, built from the same blocks as the hybrid's stem (`vitlab.models.hybrid`):

    stem:    StdConv 7x7 / 2 -> zero-pad 1 -> max-pool 3x3 / 2                        (stride 4, no norm: v2)
    stage i: bottleneck units, width w * 2**i inside, 4 w * 2**i out; each unit is
             x' = ReLU(GN(x));  y = conv3(ReLU(GN(conv2(ReLU(GN(conv1(x')))))));  return y + shortcut
             where the first unit of a stage projects the shortcut from x' (1x1 StdConv, strided from stage 2 on)
             and puts the stride on its 3x3, as BiT does
    head:    ReLU(GN(x)) -> global average pool -> Dense (zero-initialised: BiT's fine-tuning head)

Padding is PyTorch's symmetric one with the zero pad before the pool, as in Google's BiT PyTorch port
(big_transfer bit_pytorch/models.py) and timm's `resnetv2_*_bit` ("fixed" stem). The epsilons follow the weights'
source (`ResNetConfig.eps`): timm's StdConv2d (1e-8) or Google's PyTorch port (1e-10); GroupNorm 1e-5 in both.

Parameter names are timm's ResNetV2 names (`stem.conv`, `stages.{i}.blocks.{j}.{norm1,conv1,norm2,conv2,norm3,
conv3,downsample.conv}`, `norm`), except the classifier: `head` is a Linear (K, C) here, where timm has a 1x1
convolution `head.fc` (K, C, 1, 1); the readers (`vitlab.weights.bit`) map one onto the other. One name for the
classifier keeps the zoo's fine-tuning path (zero head, `reset_classifier`, `load_weights`' head replacement) the
same for ViTs and ResNets.

The config lives here with the model rather than in `vitlab.models.config`: it shares no field semantics with ViTConfig
beyond the input and the classes, and `vitlab.models.config` stays free of torch for the CLI.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .config import ViTConfig, check_keys, check_number, to_hw
from .hybrid import GROUPS, GroupNormAct, StdConv2d, init_backbone, set_eps
from .layers import check_images, zero_head

ARCH = "resnetv2"  # the "arch" key of a serialised ResNetConfig (ViTConfig has none)
EPS_CHOICES = ("timm", "bit")  # vitlab.models.hybrid.EPS keys the ResNet takes


@dataclass
class ResNetConfig:
    """Everything that fixes a BiT ResNet-v2.

    Attributes:
        img_size: The input size it is trained / evaluated at (any size runs: the pool is global); int or (H, W).
        in_chans: Input channels (3 for RGB, 1 for greyscale).
        num_classes: Classes of the head; 0 gives no head (features only).
        layers: Bottleneck units per stage: (3, 4, 6, 3) is ResNet-50, (3, 4, 23, 3) ResNet-101, (3, 8, 36, 3)
            ResNet-152.
        width: Stem width: 64 times BiT's width factor (x1: 64, x3: 192). Stage i is `width * 2**i` wide inside
            its bottlenecks and 4x that at its output. Small values (16) make Fashion-MNIST-sized models.
        groups: GroupNorm groups (BiT: 32); a layer with fewer channels uses one group per channel.
        eps: Whose epsilons the weight standardisation and GroupNorm use (`vitlab.models.hybrid.EPS`): "timm" (timm's
            resnetv2_*_bit: sqrt(var + 1e-8)) or "bit" (Google's BiT PyTorch code: sqrt(var + 1e-10)); the `.npz`
            reader sets "bit".
        name: The variant this config came from, if any (informational).
    """

    img_size: int | tuple[int, int] = 224
    in_chans: int = 3
    num_classes: int = 1000
    layers: tuple[int, ...] = (3, 4, 6, 3)
    width: int = 64
    groups: int = GROUPS
    eps: str = "timm"
    name: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.img_size, list):
            self.img_size = tuple(self.img_size)
        if isinstance(self.layers, list):
            self.layers = tuple(self.layers)
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first inconsistent field."""
        for name in ("in_chans", "width", "groups"):
            check_number(f"ResNetConfig.{name}", getattr(self, name), integer=True, lo=1, what="a positive int")
        check_number("ResNetConfig.num_classes", self.num_classes, integer=True, lo=0, what="an int >= 0")
        layers = self.layers
        if not isinstance(layers, tuple) or not 1 <= len(layers) <= 4 or any(
                isinstance(n, bool) or not isinstance(n, int) or n <= 0 for n in layers):
            raise ValueError(f"ResNetConfig.layers must be 1 to 4 positive ints (units per stage), got {layers!r}")
        for c in self.channels():
            g = min(self.groups, c)
            if c % g:
                raise ValueError(f"ResNetConfig: {c} channels do not split into {g} GroupNorm groups (width "
                                 f"{self.width}, groups {self.groups}): make width a multiple of groups")
        if self.eps not in EPS_CHOICES:
            raise ValueError(f"ResNetConfig.eps must be one of {EPS_CHOICES}, got {self.eps!r}")
        if self.name is not None and not isinstance(self.name, str):
            raise ValueError(f"ResNetConfig.name must be a string or None, got {self.name!r}")
        to_hw(self.img_size, "ResNetConfig.img_size")

    def channels(self) -> list[int]:
        """Every channel count a GroupNorm sees: the stem's, then each stage's inner and output width."""
        return [self.width] + [c for i in range(len(self.layers)) for c in (self.width * 2**i, 4 * self.width * 2**i)]

    # -- derived quantities (the names ViTConfig uses for the same facts) ---------------------------
    @property
    def img_hw(self) -> tuple[int, int]:
        return to_hw(self.img_size, "ResNetConfig.img_size")

    @property
    def stride(self) -> int:
        """Input pixels per feature-map cell: 4 after the stem, x2 per stage after the first."""
        return 4 * 2 ** (len(self.layers) - 1)

    @property
    def grid_size(self) -> tuple[int, int]:
        """(H, W) of the last feature map at `img_size`."""
        h, w = self.img_hw
        return (feature_side(h, len(self.layers)), feature_side(w, len(self.layers)))

    @property
    def num_features(self) -> int:
        """Width of the pooled features (the head's input)."""
        return 4 * self.width * 2 ** (len(self.layers) - 1)

    # -- (de)serialisation --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["img_size"] = list(d["img_size"]) if isinstance(d["img_size"], tuple) else d["img_size"]
        d["layers"] = list(d["layers"])
        return {"arch": ARCH, **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ResNetConfig:
        d = dict(d)
        arch = d.pop("arch", ARCH)
        if arch != ARCH:
            raise ValueError(f"not a ResNetConfig: arch {arch!r} (expected {ARCH!r})")
        return cls(**check_keys(d, cls, "ResNetConfig", "field"))

    def replace(self, **overrides: Any) -> ResNetConfig:
        return dataclasses.replace(self, **check_keys(overrides, self, "ResNetConfig", "field"))

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> ResNetConfig:
        """The config of a named BiT variant ("BiT-R50x1", "bit-m-r50x1", "resnetv2_50x1_bit.goog_in21k", ...)."""
        key = canonical_name(name)
        if key is None:
            raise ValueError(f"unknown model {name!r}; known BiT models: {', '.join(VARIANTS)}")
        cfg = cls(**VARIANTS[key], name=key)
        return cfg.replace(**overrides) if overrides else cfg


def feature_side(n: int, stages: int) -> int:
    """Side of the last feature map for an input side n (7x7/2 pad 3, pad 1 + 3x3/2 pool, 3x3/2 pad 1 per stage)."""
    n = (n - 1) // 2 + 1  # stem conv
    n = (n - 1) // 2 + 1  # pool over the zero-padded map
    for _ in range(stages - 1):
        n = (n - 1) // 2 + 1
    return n


# BiT's models (Kolesnikov et al. 2020, Sec. 3.1 / Table 5: ResNet-50x1 ... ResNet-152x4) and two small depths for
# one-machine experiments (R26: timm's resnetv2 / R26+ViT layout; R14: one unit per stage).
_DEPTHS = {14: (1, 1, 1, 1), 26: (2, 2, 2, 2), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
_NAMED = ((50, 1), (50, 3), (101, 1), (101, 3), (152, 2), (152, 4), (26, 1), (14, 1))
VARIANTS: dict[str, dict[str, Any]] = {f"BiT-R{d}x{f}": dict(layers=_DEPTHS[d], width=64 * f) for d, f in _NAMED}


def canonical_name(name: str) -> str | None:
    """The table key ("BiT-R50x1") of a BiT name in any of its spellings, or None when `name` is no BiT name:
    "BiT-R50x1", "bit-m-r50x1" / "BiT-S-R101x3" (the released weights' names), "resnetv2_50x1_bit[.tag]" (timm)."""
    if not isinstance(name, str):
        return None
    s = name.strip()
    m = re.fullmatch(r"(?i)bit-(?:[sm]-)?r(\d+)x(\d+)", s) or re.fullmatch(r"(?i)resnetv2_(\d+)x(\d+)_bit(?:\..*)?", s)
    if m is None:
        return None
    key = f"BiT-R{int(m.group(1))}x{int(m.group(2))}"
    if key not in VARIANTS:
        raise ValueError(f"unknown model {name!r}; known BiT models: {', '.join(VARIANTS)}")
    return key


def config_from_name(name: str, **overrides: Any) -> ViTConfig | ResNetConfig:
    """The config of any zoo name: a BiT ResNet's (`ResNetConfig`) or a ViT's (`ViTConfig`)."""
    if canonical_name(name) is not None:
        return ResNetConfig.from_name(name, **overrides)
    try:
        return ViTConfig.from_name(name, **overrides)
    except ValueError as e:
        if str(e).startswith("unknown model"):
            raise ValueError(f"{e}, {', '.join(VARIANTS)}") from None
        raise


def config_from_dict(d: dict[str, Any]) -> ViTConfig | ResNetConfig:
    """A serialised config of either kind (a ResNetConfig's dict has "arch": "resnetv2")."""
    if isinstance(d, dict) and d.get("arch") == ARCH:
        return ResNetConfig.from_dict(d)
    return ViTConfig.from_dict(d)


# -- the network -------------------------------------------------------------------------------------------


class Stem(nn.Module):
    """StdConv 7x7 / 2 (padding 3), then a zero pad of 1 and a 3x3 / 2 max-pool: stride 4. No norm (v2)."""

    def __init__(self, cin: int, width: int, eps: str):
        super().__init__()
        self.conv = StdConv2d(cin, width, 7, 2, eps, same=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)  # (B, w, H/2, W/2)
        # BiT pads the pre-activation map with zeros (not -inf), so a zero can win the max
        return F.max_pool2d(F.pad(x, (1, 1, 1, 1)), 3, 2)  # (B, w, H/4, W/4)


class Downsample(nn.Module):
    """The projection shortcut of a stage's first unit: a 1x1 StdConv of the pre-activated input (no norm: v2)."""

    def __init__(self, cin: int, cout: int, stride: int, eps: str):
        super().__init__()
        self.conv = StdConv2d(cin, cout, 1, stride, eps, same=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class PreActBottleneck(nn.Module):
    """GN+ReLU -> 1x1 -> GN+ReLU -> 3x3 (stride) -> GN+ReLU -> 1x1 (4x wider), plus the shortcut."""

    downsample: Downsample | None

    def __init__(self, cin: int, cout: int, stride: int, project: bool, eps: str, groups: int):
        super().__init__()
        mid = cout // 4

        def gn(c: int) -> GroupNormAct:
            return GroupNormAct(c, eps=eps, groups=min(groups, c))

        self.downsample = Downsample(cin, cout, stride, eps) if project else None
        self.norm1 = gn(cin)
        self.conv1 = StdConv2d(cin, mid, 1, eps=eps, same=False)
        self.norm2 = gn(mid)
        self.conv2 = StdConv2d(mid, mid, 3, stride, eps, same=False)
        self.norm3 = gn(mid)
        self.conv3 = StdConv2d(mid, cout, 1, eps=eps, same=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_pre = self.norm1(x)  # pre-activation, shared by the residual branch and a projection shortcut
        shortcut = x if self.downsample is None else self.downsample(x_pre)
        x = self.conv1(x_pre)
        x = self.conv2(self.norm2(x))
        x = self.conv3(self.norm3(x))
        return x + shortcut  # no activation after the sum (v2)


class ResNetStage(nn.Module):
    def __init__(self, cin: int, cout: int, depth: int, stride: int, eps: str, groups: int):
        super().__init__()
        self.blocks = nn.Sequential(*[
            PreActBottleneck(cin if i == 0 else cout, cout, stride if i == 0 else 1, i == 0, eps, groups)
            for i in range(depth)
        ])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class ResNetV2(nn.Module):
    """BiT ResNet-v2 for image classification. Build with `vitlab.create_model("BiT-R50x1", **overrides)`.

    The surface matches the ViT's where the few-shot probe, training and evaluation use it:
        f = model.forward_features(images)           # (B, C, H/32, W/32), after the final GN + ReLU
        v = model.forward_head(f, pre_logits=True)   # (B, C): globally average-pooled features
        logits = model.forward_head(f)               # (B, num_classes)
        v = model.embed_features(images)             # the same pooled features in one call
        vitlab.weights.save_pretrained(model, "my-bit")  # a folder that vitlab.load_model("my-bit") loads back
    """

    preprocess: Any  # vitlab.models.preprocess.Preprocess the weights expect; None = unknown
    head: nn.Linear | nn.Identity

    def __init__(self, cfg: ResNetConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.preprocess = None
        self.grad_checkpointing = False
        self.stem = Stem(cfg.in_chans, cfg.width, cfg.eps)
        stages, cin = [], cfg.width
        for i, depth in enumerate(cfg.layers):
            cout = 4 * cfg.width * 2**i
            stages.append(ResNetStage(cin, cout, depth, 1 if i == 0 else 2, cfg.eps, cfg.groups))
            cin = cout
        self.stages = nn.Sequential(*stages)
        self.num_features = cin
        self.norm = GroupNormAct(cin, eps=cfg.eps, groups=min(cfg.groups, cin))  # the pre-activation of the head
        self.head = nn.Linear(cin, cfg.num_classes) if cfg.num_classes else nn.Identity()
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """He-normal (fan-out) convolutions, unit GroupNorm scales, zero shifts, zero head (BiT's zero_head)."""
        init_backbone(self)
        if isinstance(self.head, nn.Linear):
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)

    # -- timm's small surface -----------------------------------------------------------------------
    def no_weight_decay(self) -> set[str]:
        return set()

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def set_eps(self, eps: str) -> None:
        """Switch to another source's epsilons (weights loaded from it), in place; the config follows."""
        set_eps(self, eps)
        self.cfg = self.cfg.replace(eps=eps)

    def reset_classifier(self, num_classes: int, pool: str | None = None) -> None:
        """Replace the head by a zero-initialised one with `num_classes` outputs (BiT's fine-tuning head)."""
        if pool not in (None, "avg"):
            raise ValueError(f"a BiT ResNet pools by global average only, got pool={pool!r}")
        self.cfg = self.cfg.replace(num_classes=num_classes)
        self.head = zero_head(self.num_features, num_classes, like=self.norm.weight)

    # -- forward ------------------------------------------------------------------------------------
    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) images -> (B, F, H/32, W/32) feature map (after the final GroupNorm + ReLU)."""
        check_images(x, self.stem.conv.weight)
        if x.shape[1] != self.cfg.in_chans:
            raise ValueError(f"model expects {self.cfg.in_chans} input channels, got {x.shape[1]}")
        x = self.stem(x)  # (B, w, H/4, W/4)
        for stage in self.stages:
            if self.grad_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(stage, x, use_reentrant=False)
            else:
                x = stage(x)  # stage i: (B, 4 w 2^i, H/(4 * 2^i), ...)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = x.mean(dim=(2, 3))  # (B, F): global average pool
        return x if pre_logits else self.head(x)

    def embed_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) images -> (B, F) pooled pre-head features (for linear probes and few-shot evaluation)."""
        return self.forward_head(self.forward_features(x), pre_logits=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


def count_params(cfg: ResNetConfig) -> int:
    """Exact trainable parameter count of `ResNetV2(cfg)`, without building it."""
    w = cfg.width
    n = cfg.in_chans * w * 49  # stem
    cin = w
    for i, depth in enumerate(cfg.layers):
        cout = 4 * w * 2**i
        mid = cout // 4
        for b in range(depth):
            n += 2 * cin + cin * mid + 2 * mid + mid * mid * 9 + 2 * mid + mid * cout  # norm1 conv1 norm2 ...
            if b == 0:
                n += cin * cout  # projection
            cin = cout
    n += 2 * cin  # final norm
    if cfg.num_classes:
        n += cin * cfg.num_classes + cfg.num_classes
    return n


def count_macs(cfg: ResNetConfig, h: int, w: int) -> int:
    """Multiply-adds of one (h, w) image: the convolutions and the head."""
    h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1  # stem conv
    macs = h * w * cfg.in_chans * cfg.width * 49
    h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1  # pool
    cin = cfg.width
    for i, depth in enumerate(cfg.layers):
        cout = 4 * cfg.width * 2**i
        mid = cout // 4
        for b in range(depth):
            s = 2 if i > 0 and b == 0 else 1
            macs += h * w * cin * mid  # conv1 at the input resolution
            h, w = (h - 1) // s + 1, (w - 1) // s + 1
            macs += h * w * (mid * mid * 9 + mid * cout)  # conv2 (strided), conv3
            if b == 0:
                macs += h * w * cin * cout  # projection
            cin = cout
    return macs + cin * cfg.num_classes


def count_flops(cfg: ResNetConfig, img_size: int | tuple[int, int] | None = None, backward: bool = False) -> int:
    """FLOPs of one forward pass for one image (multiply-add = 2), x3 with `backward`."""
    h, w = cfg.img_hw if img_size is None else to_hw(img_size)
    flops = 2 * count_macs(cfg, h, w)
    return 3 * flops if backward else flops


__all__ = ["VARIANTS", "ResNetConfig", "ResNetV2", "canonical_name", "config_from_dict", "config_from_name",
           "count_flops", "count_params", "feature_side"]
