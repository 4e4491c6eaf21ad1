"""The original DINOv2 layout (facebookresearch/dinov2's torch.hub files, `dinov2_vits14_pretrain.pth` and the
`_reg4_` ones) in our names.

Their `DinoVisionTransformer` shares timm's block names (`norm1`, `attn.qkv`, `attn.proj`, `ls1.gamma`, `norm2`,
`mlp.fc1/fc2`, `ls2.gamma`) and adds: `mask_token` (iBOT's masked-patch token, unused at inference: dropped),
`register_tokens` (1, R, D), blocks grouped for FSDP as `blocks.{chunk}.{i}.` (i counts over all blocks), and for
ViT-g the SwiGLU FFN `mlp.w12` (2H, D) / `mlp.w3` (D, H), whose forward is silu(first half of w12 x) * second
half -> w3: exactly our mlp="swiglu" with fc1 = w12, fc2 = w3, act="silu".

Registers. DINOv2 adds its table (class row included) to [cls, patches] and inserts the registers after the
class token without a position; we store it as timm's `vit_*_reg4_dinov2` does: `no_embed_class`, the class row
added into `cls_token` once (cls + pos[0] is what the class token always carries), the table left with the patch
rows. At another input size both resample only the patch rows, so the two agree at every size.

What the tensors do not fix: the number of heads (the published models have 64-wide heads: 384 -> 6,
768 -> 12, 1024 -> 16, 1536 -> 24, dinov2/models/vision_transformer.py's vit_small/base/large/giant2; for another
width `vitlab.weights.infer` decides or asks for `num_heads=`), and how the table is resampled at another input
size: the hub builds the models without registers with `interpolate_offset=0.1, interpolate_antialias=False` (our
mode "dinov2") and those with registers with `interpolate_offset=0.0, interpolate_antialias=True` (timm's
antialiased bicubic, "bicubic") (dinov2/hub/backbones.py).
"""

from __future__ import annotations

import math
import re

import torch

from ..models import preprocess as pp
from .converted import Converted
from .report import WeightsError

# DINOv2's widths -> heads (dinov2/models/vision_transformer.py: vit_small, vit_base, vit_large, vit_giant2).
HEADS = {384: 6, 768: 12, 1024: 16, 1536: 24}
_ARCH = {384: "vit_small", 768: "vit_base", 1024: "vit_large", 1536: "vit_giant2"}
_CHUNKED = re.compile(r"blocks\.(\d+)\.(\d+)\.(.+)")
_PLAIN = re.compile(r"blocks\.(\d+)\.(.+)")
# names inside a block that we have a place for (after w12 / w3 -> fc1 / fc2)
_BLOCK_PARTS = ("norm1.", "attn.qkv.", "attn.proj.", "ls1.gamma", "norm2.", "mlp.fc1.", "mlp.fc2.", "ls2.gamma")
_TOP = ("cls_token", "pos_embed", "register_tokens", "mask_token", "patch_embed.proj.weight", "patch_embed.proj.bias",
        "norm.weight", "norm.bias")
# dinov2/data/transforms.py make_classification_eval_transform: Resize(256, bicubic), CenterCrop(224), ImageNet
_CROP = 224 / 256


def matches(keys: set[str]) -> bool:
    """True for the original layout: a mask token beside LayerScale, or register tokens (not timm's names)."""
    if "patch_embed.proj.weight" not in keys:
        return False
    return "register_tokens" in keys or ("mask_token" in keys and any(k.endswith(".ls1.gamma") for k in keys))


def convert(tensors: dict[str, torch.Tensor], source: str) -> Converted:
    """DINOv2's state dict in our names, with the ViTConfig fields it fixes.

    Raises:
        WeightsError: a tensor we have no place for (e.g. biases switched off, a patch-embedding norm), a position
            table that is not a square grid, or blocks that are neither plain nor chunked.
    """
    state = _rename(tensors, source)
    for need in ("cls_token", "pos_embed", "blocks.0.attn.proj.bias", "blocks.0.mlp.fc1.bias", "blocks.0.mlp.fc2.bias"):
        if need not in state:
            raise WeightsError(f"{source}: DINOv2 layout without {need!r} (proj_bias / ffn_bias False, or a damaged "
                               "file); vitlab's ViT has these biases")
    out = Converted(state)
    tensors_src = "the tensors (DINOv2 layout)"
    pos = state["pos_embed"]
    if pos.dim() != 3 or state["cls_token"].shape != (1, 1, pos.shape[-1]):
        raise WeightsError(f"{source}: pos_embed {tuple(pos.shape)} / cls_token {tuple(state['cls_token'].shape)} "
                           "are not DINOv2's (1, 1 + N, D) / (1, 1, D)")
    n = pos.shape[1] - 1
    side = math.isqrt(n)
    if side * side != n or n == 0:
        raise WeightsError(f"{source}: pos_embed has {n} patch rows, not a square grid (DINOv2's tables are square)")
    width = int(pos.shape[-1])
    patch = int(state["patch_embed.proj.weight"].shape[-1])
    regs = int(state["reg_token"].shape[1]) if "reg_token" in state else 0
    if regs:
        # timm's vit_*_reg4_dinov2 layout: the class row folded into the class token, registers get no position
        state["cls_token"] = state["cls_token"] + pos[:, :1]
        state["pos_embed"] = pos[:, 1:]
    out.fix("no_embed_class", bool(regs), "DINOv2's layout (registers get no position; the class token's row "
                                          "is folded into cls_token when there are registers)")
    out.fix("reg_tokens", regs, tensors_src)
    out.fix("class_token", True, tensors_src)
    out.fix("pool", "token", "DINOv2's output: the normalised class token (x_norm_clstoken)")
    out.fix("img_size", side * patch, f"pos_embed ({side}x{side} grid of {patch}-pixel patches)")
    out.fix("layer_norm_eps", 1e-6, "DinoVisionTransformer's norm_layer (LayerNorm, eps=1e-6)")
    if "blocks.0.ls1.gamma" in state:
        out.fix("layer_scale", 1.0, "ls1.gamma (torch.hub init_values=1.0; the init value does not change the "
                                    "loaded model)")
    if any(".mlp.w12." in k for k in tensors):
        out.fix("mlp", "swiglu", "mlp.w12 / mlp.w3 (SwiGLUFFNFused)")
        out.fix("act", "silu", "SwiGLUFFN: silu(x1) * x2")
    else:
        out.fix("act", "gelu", "DinoVisionTransformer's act_layer (nn.GELU)")
    if width in HEADS:
        out.fix("num_heads", HEADS[width], f"DINOv2's {_ARCH[width]} (width {width}, 64-wide heads)")
    mode = "bicubic" if regs else "dinov2"
    out.default_resize = mode
    why = ("interpolate_antialias=True, offset 0 (hub _reg models)" if regs else
           "interpolate_offset=0.1, no antialias (hub models without registers)")
    out.fix("pos_embed_resize", mode, f"DINOv2's interpolate_pos_encoding, {why}")
    out.preprocess = pp.Preprocess(side * patch, pp.IMAGENET.mean, pp.IMAGENET.std, "center_crop", _CROP, "bicubic",
                                   "rgb", "DINOv2 convention (dinov2/data/transforms.py "
                                   "make_classification_eval_transform: resize 256, crop 224, bicubic)")
    return out


def _rename(tensors: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """Our names: chunks flattened, w12 / w3 -> fc1 / fc2, register_tokens -> reg_token, mask_token dropped."""
    chunked = any(_CHUNKED.match(k) for k in tensors)
    state: dict[str, torch.Tensor] = {}
    for key, t in tensors.items():
        if key == "mask_token":
            continue  # iBOT's token for masked patches: training only
        if key.startswith("blocks."):
            m = _CHUNKED.fullmatch(key) if chunked else _PLAIN.fullmatch(key)
            if m is None:
                raise WeightsError(f"{source}: {key!r} mixes chunked (blocks.{{chunk}}.{{i}}.) and plain block names")
            index, rest = m.groups()[-2:]  # chunked: (chunk, i, rest), i counting over all blocks
            rest = rest.replace("mlp.w12.", "mlp.fc1.").replace("mlp.w3.", "mlp.fc2.")
            if not rest.startswith(_BLOCK_PARTS):
                raise WeightsError(f"{source}: tensor {key!r} has no place in vitlab's ViT")
            name = f"blocks.{index}.{rest}"
            if name in state:
                raise WeightsError(f"{source}: block tensor {name!r} appears twice")
            state[name] = t
        elif key in _TOP:
            state["reg_token" if key == "register_tokens" else key] = t
        else:
            raise WeightsError(f"{source}: tensor {key!r} has no place in vitlab's ViT")
    return state
