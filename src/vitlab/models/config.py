"""`ViTConfig` and the table of named variants (paper Table 1; Ti and S from DeiT / AugReg).

Variants are data, not functions: one row per model, one `ViTConfig.from_name(name, **overrides)`.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

POOLS = ("token", "gap", "map")
ACTS = ("gelu", "gelu_tanh", "quick_gelu", "silu")
MLPS = ("mlp", "swiglu")
POS_EMBEDS = ("learned", "sincos2d", "none")
ROPES = {"eva02": 10000.0, "dinov3": 100.0}  # 2-D RoPE variant -> its published base (rope_theta's default)
RESIZE_MODES = ("jax", "bilinear", "bicubic", "dinov2", "hf")
HYBRID_EPS = ("timm", "vit_jax")  # whose weight-standardisation and GroupNorm epsilons (vitlab.models.hybrid.EPS)


def check_keys(d: Any, valid: Any, what: str, noun: str = "key") -> dict[str, Any]:
    """The one unknown-key check of every config read from a file or from keyword arguments.

    Args:
        d: What was given.
        valid: A dataclass (class or instance: its fields) or the valid names, in the order to list them.
        what: Names `d` in messages ("ViTConfig", "data", "recipe section 'train'").
        noun: What its keys are called ("key", "field", "section").

    Returns:
        `d` as a new dict.

    Raises:
        ValueError: `d` is not a mapping, or has keys outside `valid`: "unknown data key(s) ['shufle']; valid
            keys: [...]".
    """
    if not isinstance(d, Mapping):
        raise ValueError(f"{what} must be a mapping, got {type(d).__name__}")
    names = [f.name for f in dataclasses.fields(valid)] if dataclasses.is_dataclass(valid) else list(valid)
    unknown = sorted(set(d) - set(names), key=str)
    if unknown:
        raise ValueError(f"unknown {what} {noun}(s) {unknown}; valid {noun}s: {names}")
    return dict(d)


def check_number(name: str, value: Any, *, lo: float | None = None, hi: float | None = None, integer: bool = False,
                 allow_none: bool = False, lo_open: bool = False, hi_open: bool = False,
                 what: str | None = None) -> None:
    """The one number check of every config field (ViTConfig, the recipe's sections, DataConfig).

    A number is an int or a float, never a bool, and always finite: YAML reads `1e400` and `.inf` as inf and
    `.nan` as nan, and none of them is a usable learning rate, weight decay, epoch count or epsilon.

    Args:
        name: The field as the user wrote it ("optim.lr", "ViTConfig.layer_norm_eps"), for the message.
        value: What was given.
        lo, hi: Bounds, inclusive unless `lo_open` / `hi_open`.
        integer: Only Python ints are accepted.
        allow_none: None is accepted (the field is optional).
        what: What is expected, for every message ("a probability in [0, 1)"); default: the failed condition.

    Raises:
        ValueError: "optim.lr must be a finite number, got inf", "train.steps must be >= 1, got 0", ...
    """
    if value is None and allow_none:
        return

    def refuse(expected: str) -> ValueError:
        return ValueError(f"{name} must be {what or expected}, got {value!r}")

    kind = "an int" if integer else "a finite number"
    if isinstance(value, bool) or (integer and not isinstance(value, int)):  # numpy ints: json.dumps would fail
        raise refuse(kind)
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise refuse(kind)
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise refuse(f"{'>' if lo_open else '>='} {lo:g}")
    if hi is not None and (value >= hi if hi_open else value > hi):
        raise refuse(f"{'<' if hi_open else '<='} {hi:g}")


def check_bool(name: str, value: Any) -> None:
    """ValueError unless `value` is True or False (1, "no" and None are not: they would silently mean something)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")


def to_hw(size: int | Sequence[int], what: str = "img_size") -> tuple[int, int]:
    """(H, W) of an image size given as one side N (a square) or as (H, W) / [H, W].

    Raises:
        ValueError: `size` is not a positive int or a pair of them (`what` names it in the message).
    """
    try:
        if isinstance(size, bool) or (isinstance(size, Sequence) and (len(size) != 2 or isinstance(size, str))):
            raise TypeError
        h, w = (size, size) if not isinstance(size, Sequence) else size
        if isinstance(h, bool) or isinstance(w, bool):
            raise TypeError
        hw = (operator.index(h), operator.index(w))  # ints, numpy ints; not floats
    except TypeError:
        raise ValueError(f"{what} must be an int or (H, W), got {size!r}") from None
    if min(hw) <= 0:
        raise ValueError(f"{what} must be positive, got {size!r}")
    return hw


def pixels_per_token(patch_size: int, hybrid_layers: Sequence[int] | None = None) -> int:
    """Side in pixels of the square one token covers: P for the plain ViT; for the hybrid, the ResNet's stride
    (4 after the stem, x2 per further stage) times P, the patch side in feature-map cells (Sec. 3.1)."""
    if hybrid_layers is None:
        return patch_size
    return 4 * 2 ** max(len(hybrid_layers) - 1, 0) * patch_size


@dataclass
class ViTConfig:
    """Everything that fixes a Vision Transformer's architecture.

    Attributes:
        img_size: Input resolution the position embeddings are built for; an int or (H, W).
        patch_size: P, the side of each square patch (paper Sec. 3.1).
        in_chans: Input channels (3 for RGB, 1 for greyscale).
        num_classes: Classes of the head; 0 gives no head (features only).
        embed_dim: D, the width of every token.
        depth: L, the number of Transformer blocks.
        num_heads: Attention heads per block.
        mlp_dim: Hidden width of each block's MLP.
        pool: "token" reads the class token (Eq. 4); "gap" averages the patch tokens.
        class_token: Prepend a learned class token.
        pos_embed: "learned" (the paper's 1-D table), "sincos2d" (fixed, big_vision), or "none".
        representation_size: Width of the pre-training pre-logits layer (Dense + tanh); None for none.
        dropout: Dropout after the position embeddings and inside the MLP / attention projection.
        attn_dropout: Dropout on the attention weights.
        drop_path: Stochastic-depth rate, rising linearly to this value over the blocks.
        layer_norm_eps: LayerNorm epsilon (1e-6 as in Google's code).
        qkv_bias: Biases on the query/key/value projection.
        pos_embed_resize: How learned position embeddings are resampled on the fly for other input sizes.
        hybrid_layers: None for the plain ViT (patches from pixels); for the hybrid (Sec. 3.1), the bottleneck
            blocks of each ResNet stage whose feature map gives the tokens: (3, 4, 9) is R50+ViT-B/16's
            ResNet-50 without stage 4; () is the bare stem. `patch_size` then counts feature-map cells.
        hybrid_width: The ResNet's stem width (64 in ResNet-50); stage i is `width * 2**i` wide (x4 out).
        hybrid_eps: Whose epsilons the hybrid's weight-standardised convolutions and GroupNorms use, following
            the source of the weights: "timm" (ResNetV2: (w - mean) / sqrt(var + 1e-8), GroupNorm 1e-5) or
            "vit_jax" (Google's models_resnet.py: (w - mean) / (std + 1e-5), flax GroupNorm 1e-6); the `.npz`
            reader sets "vit_jax".
        act: The MLP's activation: "gelu" (exact, the paper), "gelu_tanh" (SigLIP2), "quick_gelu" (OpenAI
            CLIP: x * sigmoid(1.702 x)), "silu" (with mlp="swiglu").
        mlp: "mlp" (fc1 -> act -> fc2, the paper) or "swiglu" (Shazeer 2020, DINOv2-g / EVA-02: fc1 makes a gate
            and a value half, act(gate) * value -> fc2; mlp_dim counts both halves, as fc1's rows do).
        mlp_norm: A LayerNorm on the MLP's hidden units before fc2 (EVA-02's sub-LN, Wang et al. 2022).
        layer_scale: LayerScale's initial value (CaiT, Touvron et al. 2021; DeiT-III, DINOv2); None for none.
        reg_tokens: Register tokens after the class token (Darcet et al., ICLR 2024).
        no_embed_class: The position table has rows for the patches only; prefix tokens get no position
            (DeiT-III, timm's `no_embed_class`).
        distilled: DeiT's distillation token and second head (Touvron et al. 2021); the two heads' logits are
            averaged at inference.
        fc_norm: Normalise after pooling instead of before (MAE / BEiT fine-tuning; timm's `fc_norm`).
        pre_norm: A LayerNorm on the embedded tokens before the first block (CLIP's `ln_pre`, Radford et al. 2021).
        patch_bias: A bias in the patch projection (CLIP has none).
        rope: Rotary position embeddings of the patch tokens' queries and keys (RoFormer, Su et al. 2021), None
            for none: "eva02" (EVA-02, Fang et al. 2023: patch indices, frequencies theta^(-4i/d) per axis,
            interleaved pairs) or "dinov3" (DINOv3, Simeoni et al. 2025: patch centres in [-1, 1], periods
            theta^(4i/d), rotate-half layout). Prefix tokens are not rotated (`vitlab.models.rope`).
        rope_theta: The RoPE base (EVA-02's temperature, DINOv3's base period); None: the variant's own
            (`ROPES`: 10000, 100).
        rope_ref_grid: "eva02" only: the (rows, cols) grid the positions are rescaled to span at every input
            size (timm's `ref_feat_shape`, the pre-training grid: (16, 16) for EVA-02 at patch 14); None: the
            patch indices themselves.
        name: The variant this config came from, if any (informational).
    """

    img_size: int | tuple[int, int] = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    pool: str = "token"
    class_token: bool = True
    pos_embed: str = "learned"
    representation_size: int | None = None
    dropout: float = 0.0
    attn_dropout: float = 0.0
    drop_path: float = 0.0
    layer_norm_eps: float = 1e-6
    qkv_bias: bool = True
    pos_embed_resize: str = "bicubic"
    hybrid_layers: tuple[int, ...] | None = None
    hybrid_width: int = 64
    hybrid_eps: str = "timm"
    act: str = "gelu"
    mlp: str = "mlp"
    mlp_norm: bool = False
    layer_scale: float | None = None
    reg_tokens: int = 0
    no_embed_class: bool = False
    distilled: bool = False
    fc_norm: bool = False
    pre_norm: bool = False
    patch_bias: bool = True
    rope: str | None = None
    rope_theta: float | None = None
    rope_ref_grid: tuple[int, int] | None = None
    name: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.img_size, list):
            self.img_size = tuple(self.img_size)
        if isinstance(self.hybrid_layers, list):
            self.hybrid_layers = tuple(self.hybrid_layers)
        if isinstance(self.rope_ref_grid, list):
            self.rope_ref_grid = tuple(self.rope_ref_grid)
        self.validate()

    # -- validation, in one place -------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ValueError naming the first inconsistent field."""

        def number(field_name: str, **kw: Any) -> None:
            check_number(f"ViTConfig.{field_name}", getattr(self, field_name), **kw)

        for name in ("patch_size", "in_chans", "embed_dim", "depth", "num_heads", "mlp_dim"):
            number(name, integer=True, lo=1, what="a positive int")
        number("num_classes", integer=True, lo=0, what="an int >= 0")
        for name in ("class_token", "qkv_bias", "mlp_norm", "no_embed_class", "distilled", "fc_norm", "pre_norm",
                     "patch_bias"):  # a truthy 1 / "no" would silently build a different model
            check_bool(f"ViTConfig.{name}", getattr(self, name))
        if self.name is not None and not isinstance(self.name, str):
            raise ValueError(f"ViTConfig.name must be a string or None, got {self.name!r}")
        if self.hybrid_layers is not None:
            layers = self.hybrid_layers
            if not isinstance(layers, tuple) or len(layers) > 4 or any(
                    isinstance(n, bool) or not isinstance(n, int) or n <= 0 for n in layers):
                raise ValueError(f"ViTConfig.hybrid_layers must be None or up to 4 positive ints (blocks per ResNet "
                                 f"stage), got {layers!r}")
            number("hybrid_width", integer=True, lo=1, what="a positive int")
            if self.hybrid_width % 32:
                raise ValueError(f"ViTConfig.hybrid_width must be a multiple of 32 (GroupNorm's 32 groups), got "
                                 f"{self.hybrid_width}")
        h, w = self.img_hw  # raises unless a positive int or (H, W)
        for side, value in (("height", h), ("width", w)):
            if value % self.pixel_patch:
                what = (f"the hybrid's pixels per token {self.pixel_patch} (ResNet stride x patch_size)"
                        if self.hybrid_layers is not None else f"patch_size {self.patch_size}")
                raise ValueError(f"ViTConfig.img_size {side} {value} is not divisible by {what}")
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"ViTConfig.embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}"
            )
        if self.pool not in POOLS:
            raise ValueError(f"ViTConfig.pool must be one of {POOLS}, got {self.pool!r}")
        if self.pos_embed not in POS_EMBEDS:
            raise ValueError(f"ViTConfig.pos_embed must be one of {POS_EMBEDS}, got {self.pos_embed!r}")
        if self.pos_embed_resize not in RESIZE_MODES:
            raise ValueError(
                f"ViTConfig.pos_embed_resize must be one of {RESIZE_MODES}, got {self.pos_embed_resize!r}"
            )
        if self.hybrid_eps not in HYBRID_EPS:
            raise ValueError(f"ViTConfig.hybrid_eps must be one of {HYBRID_EPS}, got {self.hybrid_eps!r}")
        if self.pool == "token" and not self.class_token:
            raise ValueError("ViTConfig.pool='token' needs class_token=True (use pool='gap' without one)")
        if self.act not in ACTS:
            raise ValueError(f"ViTConfig.act must be one of {ACTS}, got {self.act!r}")
        if self.mlp not in MLPS:
            raise ValueError(f"ViTConfig.mlp must be one of {MLPS}, got {self.mlp!r}")
        if self.mlp == "swiglu" and self.mlp_dim % 2:
            raise ValueError(f"ViTConfig.mlp='swiglu' needs an even mlp_dim (gate and value halves), got "
                             f"{self.mlp_dim}")
        number("layer_scale", lo=0.0, lo_open=True, allow_none=True, what="None or a finite number > 0")
        number("reg_tokens", integer=True, lo=0, what="an int >= 0")
        if self.distilled and (not self.class_token or self.pool != "token"):
            raise ValueError("ViTConfig.distilled=True needs class_token=True and pool='token' (DeiT's two heads "
                             "read the class and distillation tokens)")
        if self.pos_embed == "sincos2d" and self.embed_dim % 4:
            raise ValueError(f"ViTConfig.pos_embed='sincos2d' needs embed_dim divisible by 4, got {self.embed_dim}")
        number("representation_size", integer=True, lo=1, allow_none=True, what="None or a positive int")
        for name in ("dropout", "attn_dropout", "drop_path"):  # 1 would drop everything
            number(name, lo=0.0, hi=1.0, hi_open=True, what="a probability in [0, 1)")
        number("layer_norm_eps", lo=0.0, lo_open=True, what="a finite number > 0")  # nan / inf: outputs nan / 0
        self._validate_rope()

    def _validate_rope(self) -> None:
        check_number("ViTConfig.rope_theta", self.rope_theta, lo=0.0, lo_open=True, allow_none=True,
                     what="None or a finite number > 0")
        grid = self.rope_ref_grid
        if grid is not None and (not isinstance(grid, tuple) or len(grid) != 2 or not all(
                isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in grid)):
            raise ValueError(f"ViTConfig.rope_ref_grid must be None or (rows, cols) positive ints, got {grid!r}")
        if self.rope is None:
            if self.rope_theta is not None or self.rope_ref_grid is not None:
                raise ValueError(f"ViTConfig.rope_theta / rope_ref_grid need rope= one of {tuple(ROPES)} (got "
                                 f"rope=None, rope_theta={self.rope_theta!r}, rope_ref_grid={self.rope_ref_grid!r})")
            return
        if not isinstance(self.rope, str) or self.rope not in ROPES:
            raise ValueError(f"ViTConfig.rope must be None or one of {tuple(ROPES)}, got {self.rope!r}")
        if self.head_dim % 4:
            raise ValueError(f"ViTConfig.rope needs a head dim (embed_dim / num_heads) divisible by 4 (2-D RoPE turns "
                             f"d/4 frequency pairs per axis), got {self.head_dim}")
        if grid is not None and self.rope != "eva02":
            raise ValueError(f"ViTConfig.rope_ref_grid is EVA-02's position rescaling; rope={self.rope!r} normalises "
                             "positions itself (set rope_ref_grid=None)")

    @property
    def rope_base(self) -> float | None:
        """The RoPE base in use: rope_theta, or the variant's published one; None without RoPE."""
        if self.rope is None:
            return None
        return float(self.rope_theta) if self.rope_theta is not None else ROPES[self.rope]

    # -- derived quantities -------------------------------------------------------------------------
    @property
    def img_hw(self) -> tuple[int, int]:
        """(H, W) of the input the position embeddings are built for."""
        return to_hw(self.img_size, "ViTConfig.img_size")

    @property
    def pixel_patch(self) -> int:
        """Side in pixels of the square each token covers: P, or the hybrid's ResNet stride x P."""
        return pixels_per_token(self.patch_size, self.hybrid_layers)

    @property
    def grid_size(self) -> tuple[int, int]:
        """(H/P, W/P): the patch grid (for a hybrid, P in pixels is `pixel_patch`)."""
        h, w = self.img_hw
        return (h // self.pixel_patch, w // self.pixel_patch)

    @property
    def num_patches(self) -> int:
        """N = HW / P^2."""
        gh, gw = self.grid_size
        return gh * gw

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: [class][distillation][registers]."""
        return int(self.class_token) + int(self.distilled) + self.reg_tokens

    @property
    def pos_prefix_rows(self) -> int:
        """Rows of the position table that belong to prefix tokens (none with `no_embed_class`)."""
        return 0 if self.no_embed_class else self.num_prefix_tokens

    @property
    def seq_len(self) -> int:
        """Tokens the encoder sees: N plus the prefix tokens."""
        return self.num_patches + self.num_prefix_tokens

    @property
    def is_plain(self) -> bool:
        """True for the paper's ViT (no option of the later families): what formats without them can hold."""
        return not self.family_options()

    def family_options(self) -> dict[str, Any]:
        """The later families' options this config uses ({} for the paper's ViT), e.g. {"layer_scale": 1e-5}."""
        return {k: getattr(self, k) for k, v in FAMILY_DEFAULTS.items() if getattr(self, k) != v} | (
            {"pool": "map"} if self.pool == "map" else {})

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    # -- (de)serialisation --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in ("img_size", "hybrid_layers", "rope_ref_grid"):
            if isinstance(d[k], tuple):
                d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ViTConfig:
        return cls(**check_keys(d, cls, "ViTConfig", "field"))

    def replace(self, **overrides: Any) -> ViTConfig:
        return dataclasses.replace(self, **check_keys(overrides, self, "ViTConfig", "field"))

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> ViTConfig:
        """Build the config of a named variant ("ViT-B/16", "vit_base_patch16", "B/16", ...)."""
        key = canonical_name(name)
        cfg = cls(**VARIANTS[key], name=key)
        return cfg.replace(**overrides) if overrides else cfg


# The options of the later families, at the values that give the paper's ViT (ViTConfig.family_options).
FAMILY_DEFAULTS: dict[str, Any] = dict(act="gelu", mlp="mlp", mlp_norm=False, layer_scale=None, reg_tokens=0,
                                       no_embed_class=False, distilled=False, fc_norm=False, pre_norm=False,
                                       patch_bias=True, rope=None, rope_theta=None, rope_ref_grid=None)

# The ladder. Widths/depths/MLP/heads: paper Table 1 (B, L, H); Ti and S: DeiT (Touvron et al. 2021),
# the sizes AugReg (Steiner et al. 2021) released. Patch size is part of the name.
_WIDTHS: dict[str, dict[str, int]] = {
    "Ti": dict(embed_dim=192, depth=12, mlp_dim=768, num_heads=3),  # DeiT-Ti / AugReg
    "S": dict(embed_dim=384, depth=12, mlp_dim=1536, num_heads=6),  # DeiT-S / AugReg
    "B": dict(embed_dim=768, depth=12, mlp_dim=3072, num_heads=12),  # Table 1, 86M
    "L": dict(embed_dim=1024, depth=24, mlp_dim=4096, num_heads=16),  # Table 1, 307M
    "H": dict(embed_dim=1280, depth=32, mlp_dim=5120, num_heads=16),  # Table 1, 632M
}
_NAMED = ("Ti/16", "S/16", "S/32", "B/8", "B/16", "B/32", "L/16", "L/32", "H/14")

VARIANTS: dict[str, dict[str, Any]] = {
    f"ViT-{n}": dict(_WIDTHS[n.split("/")[0]], patch_size=int(n.split("/")[1])) for n in _NAMED
}
# Hybrids (Sec. 3.1, Table 5): "/16" is the pixels per token, here the ResNet's stride with 1x1 "patches".
# R50: ResNet-50 with stage 4 dropped and stage 3 extended to 9 blocks (Sec. 4.1); R26: timm's S/32 hybrid.
VARIANTS["R50+ViT-B/16"] = dict(_WIDTHS["B"], patch_size=1, hybrid_layers=(3, 4, 9), hybrid_width=64)
VARIANTS["R26+ViT-S/32"] = dict(_WIDTHS["S"], patch_size=1, hybrid_layers=(2, 2, 2, 2), hybrid_width=64)

_TIMM_SIZES = {"tiny": "Ti", "small": "S", "base": "B", "large": "L", "huge": "H"}


def canonical_name(name: str) -> str:
    """Map "vit-b/16", "B/16", "vit_base_patch16_224" to the table key "ViT-B/16"; unknown names list the known."""
    if not isinstance(name, str):
        raise TypeError(f"model name must be a string, got {type(name).__name__}")
    s = name.strip()
    hybrid = re.fullmatch(r"(?i)(r\d+)\s*\+\s*vit[-_ ]?(ti|s|b|l|h)[/_-]?(\d+)", s) or re.fullmatch(
        r"(?i)vit_(tiny|small|base|large|huge)_(r\d+)_s(\d+)(?:_\d+)?(?:\..*)?", s)
    if hybrid:
        a, b, n = hybrid.groups()
        r, size = (a, b) if a.lower().startswith("r") else (b, _TIMM_SIZES[a.lower()])
        size = {"ti": "Ti"}.get(size.lower(), size.upper())
        key = f"{r.upper()}+ViT-{size}/{n}"
        if key not in VARIANTS:
            raise ValueError(f"unknown model {name!r}; known models: {', '.join(VARIANTS)}")
        return key
    m = re.fullmatch(r"(?i)(?:vit[-_ ]?)?(ti|s|b|l|h)[/_-]?(\d+)", s)
    if m:
        size = {"ti": "Ti"}.get(m.group(1).lower(), m.group(1).upper())
        key = f"ViT-{size}/{m.group(2)}"
    else:
        m = re.fullmatch(r"(?i)vit_(tiny|small|base|large|huge)_patch(\d+)(?:_\d+)?(?:\..*)?", s)
        key = f"ViT-{_TIMM_SIZES[m.group(1).lower()]}/{m.group(2)}" if m else s
    if key not in VARIANTS:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(VARIANTS)}")
    return key


def list_models() -> list[str]:
    """Names of the built-in variants, smallest first."""
    return list(VARIANTS)
