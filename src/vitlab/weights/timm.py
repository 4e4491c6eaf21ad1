"""timm's ViT state dicts (`.pth` / `.bin` / `.safetensors`): the same tensor names as ours.

timm's `VisionTransformer` and ours share `patch_embed.proj`, `cls_token`, `pos_embed`, `blocks.{i}.norm1`,
`blocks.{i}.attn.qkv`, `blocks.{i}.attn.proj`, `blocks.{i}.norm2`, `blocks.{i}.mlp.fc1/fc2`, `norm`, `head`
(and older timm's `pre_logits.fc`), and the later families' `ls1/ls2.gamma`, `reg_token`, `dist_token` /
`head_dist`, `norm_pre`, `fc_norm`, `attn_pool.*`, so nothing is renamed; neither are the hybrids' ResNetV2 tensors
(`patch_embed.backbone.*`). Options of timm's that change the function and that our model does not have are
refused by name rather than silently ignored.
"""

from __future__ import annotations

import torch

from .report import WeightsError

# timm-only tensors whose presence means a different network (key fragment -> what it is).
_UNSUPPORTED = {
    "attn.q_norm.": "QK normalisation",
    "attn.k_norm.": "QK normalisation",
    "attn.norm.": "a LayerNorm inside attention (scale_attn_norm)",
    "patch_embed.norm.": "a LayerNorm after the patch embedding (embed_norm)",
    "attn_pool.q_norm.": "QK normalisation in the MAP head",
    "attn_pool.pos_embed": "a position embedding inside the MAP head",
}


def matches(keys: set[str]) -> bool:
    """True for a timm (or vitlab) ViT state dict."""
    return "patch_embed.proj.weight" in keys


def to_ours(state: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """Check a timm state dict for options we do not implement; the names need no change."""
    for key in state:
        for frag, what in _UNSUPPORTED.items():
            if frag in key:
                raise WeightsError(f"{source}: tensor {key!r} belongs to {what}, which vitlab's ViT does not have")
    return dict(state)
