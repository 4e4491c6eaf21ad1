"""Analytic parameter and FLOP counts (paper Table 1, plus sequence length and compute at any size).

FLOPs count a multiply-add as two operations and include attention's QK^T and AV products.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import resnet
from .config import ViTConfig, list_models, to_hw
from .hybrid import backbone_channels, backbone_macs
from .resnet import ResNetConfig


def _backbone_params(cfg: ViTConfig) -> int:
    """Parameters of the hybrid's ResNet: bias-free convolutions, GroupNorm scale and shift."""
    layers, width = cfg.hybrid_layers or (), cfg.hybrid_width
    n = cfg.in_chans * width * 49 + 2 * width  # stem
    cin = width
    for i, depth in enumerate(layers):
        cout = 4 * width * 2**i
        mid = cout // 4
        for b in range(depth):
            n += cin * mid + mid * mid * 9 + mid * cout + 2 * (mid + mid + cout)
            if b == 0:
                n += cin * cout + 2 * cout  # projection shortcut
            cin = cout
    return n


def count_params(cfg: ViTConfig | ResNetConfig) -> int:
    """Exact trainable parameter count of `VisionTransformer(cfg)` (or of a BiT ResNet), without building it."""
    if isinstance(cfg, ResNetConfig):
        return resnet.count_params(cfg)
    D, M, P, C = cfg.embed_dim, cfg.mlp_dim, cfg.patch_size, cfg.in_chans
    if cfg.hybrid_layers is not None:  # the ResNet's convolutions and GroupNorms, then E over its channels
        n, C = _backbone_params(cfg), backbone_channels(cfg.hybrid_layers, cfg.hybrid_width)
    else:
        n = 0
    n += C * P * P * D + (D if cfg.patch_bias else 0)  # patch projection E and its bias
    n += (int(cfg.class_token) + int(cfg.distilled) + cfg.reg_tokens) * D  # class, distillation, register tokens
    n += (cfg.num_patches + cfg.pos_prefix_rows) * D if cfg.pos_embed == "learned" else 0
    n += 2 * D if cfg.pre_norm else 0  # norm_pre
    qkv = 3 * D * D + (3 * D if cfg.qkv_bias else 0)
    hidden = M // 2 if cfg.mlp == "swiglu" else M  # what fc2 (and the sub-LN) see: SwiGLU's fc1 holds gate + value
    mlp = D * M + M + hidden * D + D + (2 * hidden if cfg.mlp_norm else 0)
    block = 2 * 2 * D + qkv + D * D + D + mlp + (2 * D if cfg.layer_scale else 0)
    n += cfg.depth * block + 2 * D  # blocks and the final LayerNorm (or fc_norm, the same LayerNorm after pooling)
    if cfg.pool == "map":  # latent, q, kv, proj, norm, MLP
        n += D + (D * D + D) + (2 * D * D + 2 * D) + (D * D + D) + 2 * D + (D * M + M + M * D + D)
    feat = D
    if cfg.representation_size:
        n += D * cfg.representation_size + cfg.representation_size
        feat = cfg.representation_size
    if cfg.num_classes:  # DeiT's distillation head beside the class head
        n += (2 if cfg.distilled else 1) * (feat * cfg.num_classes + cfg.num_classes)
    return n


def count_flops(cfg: ViTConfig | ResNetConfig, img_size: int | tuple[int, int] | None = None,
                backward: bool = False) -> int:
    """FLOPs of one forward pass for one image (x3 with `backward`: forward + backward); a BiT ResNet's config
    counts its convolutions and head (`vitlab.models.resnet.count_flops`)."""
    if isinstance(cfg, ResNetConfig):
        return resnet.count_flops(cfg, img_size, backward)
    h, w = cfg.img_hw if img_size is None else to_hw(img_size)
    P, D, M = cfg.patch_size, cfg.embed_dim, cfg.mlp_dim
    N = (h // cfg.pixel_patch) * (w // cfg.pixel_patch)
    T = N + cfg.num_prefix_tokens
    if cfg.hybrid_layers is not None:
        macs = backbone_macs(cfg.in_chans, cfg.hybrid_layers, cfg.hybrid_width, h, w)
        macs += N * backbone_channels(cfg.hybrid_layers, cfg.hybrid_width) * P * P * D
    else:
        macs = N * cfg.in_chans * P * P * D  # patch embedding
    per_block = T * D * 3 * D + T * T * D + T * T * D + T * D * D + 2 * T * D * M
    macs += cfg.depth * per_block
    feat = D
    if cfg.representation_size:
        macs += D * cfg.representation_size
        feat = cfg.representation_size
    macs += feat * cfg.num_classes
    flops = 2 * macs
    return 3 * flops if backward else flops


@dataclass
class TableRow:
    name: str
    layers: int
    width: int
    mlp: int
    heads: int
    params: int
    seq_224: int
    gflops_224: float
    seq_384: int
    gflops_384: float


def table1(num_classes: int = 1000) -> list[TableRow]:
    """The paper's Table 1 for every built-in variant, with exact counts and compute at 224 and 384 px."""
    rows = []
    for name in list_models():
        cfg = ViTConfig.from_name(name, num_classes=num_classes)
        # A size that is not a multiple of P (384 for /14) is taken to the nearest multiple (378).
        pp = cfg.pixel_patch
        res = {s: round(s / pp) * pp for s in (224, 384)}
        seq = {s: (r // pp) ** 2 + cfg.num_prefix_tokens for s, r in res.items()}
        rows.append(
            TableRow(
                name=name, layers=cfg.depth, width=cfg.embed_dim, mlp=cfg.mlp_dim, heads=cfg.num_heads,
                params=count_params(cfg),
                seq_224=seq[224], gflops_224=count_flops(cfg, res[224]) / 1e9,
                seq_384=seq[384], gflops_384=count_flops(cfg, res[384]) / 1e9,
            )
        )
    return rows


def format_table1(rows: list[TableRow]) -> str:
    head = f"{'Model':<13} {'Layers':>6} {'Width':>6} {'MLP':>6} {'Heads':>5} {'Params':>13} " \
           f"{'Seq@224':>8} {'GFLOPs@224':>11} {'Seq@384':>8} {'GFLOPs@384':>11}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.name:<13} {r.layers:>6} {r.width:>6} {r.mlp:>6} {r.heads:>5} {r.params:>13,} "
            f"{r.seq_224:>8} {r.gflops_224:>11.2f} {r.seq_384:>8} {r.gflops_384:>11.2f}"
        )
    lines.append("Params with 1000 classes; FLOPs count a multiply-add as 2 and include attention; "
                 "a size that is not a multiple of P is taken to the nearest one (H/14: 378 px).")
    return "\n".join(lines)
