"""The Vision Transformer, top to bottom as in the paper (Dosovitskiy et al., ICLR 2021, Sec. 3.1).

    z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos          (Eq. 1)
    z'_l = MSA(LN(z_{l-1})) + z_{l-1}                      (Eq. 2)
    z_l = MLP(LN(z'_l)) + z'_l                             (Eq. 3)
    y = LN(z_L^0)                                          (Eq. 4)

Parameter names follow timm, so state dicts interchange without renaming.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .config import ViTConfig
from .hybrid import backbone_channels, build_backbone, init_backbone
from .layers import check_images, zero_head
from .posembed import resample_pos_embed, sincos_2d

if TYPE_CHECKING:
    from .preprocess import Preprocess


class PatchEmbed(nn.Module):
    """Cut the image into P x P patches and project each with E (a stride-P convolution is the same map).
    For the hybrid (Sec. 3.1), the patches are cut from a ResNet feature map instead (`vitlab.models.hybrid`)."""

    backbone: nn.Module | None

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.pixel_patch = cfg.pixel_patch
        self.in_chans = cfg.in_chans
        cin = cfg.in_chans
        if cfg.hybrid_layers is not None:
            self.backbone = build_backbone(cfg.in_chans, cfg.hybrid_layers, cfg.hybrid_width, cfg.hybrid_eps)
            cin = backbone_channels(cfg.hybrid_layers, cfg.hybrid_width)
        else:
            self.backbone = None
        self.proj = nn.Conv2d(cin, cfg.embed_dim, cfg.patch_size, stride=cfg.patch_size)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        check_images(x, self.proj.weight)
        _, c, h, w = x.shape
        p = self.pixel_patch
        if c != self.in_chans:
            raise ValueError(f"model expects {self.in_chans} input channels, got {c}")
        if h % p or w % p:
            kind = "pixels per token (ResNet stride x patch size)" if self.backbone is not None else "patch size"
            raise ValueError(f"input size {h}x{w} is not a multiple of the {kind} {p}")
        if self.backbone is not None:
            x = self.backbone(x)  # (B, C', H/s, W/s): the ResNet feature map
        x = self.proj(x)  # (B, D, H/P, W/P)
        return x.flatten(2).transpose(1, 2), (h // p, w // p)  # (B, N, D), grid


class Attention(nn.Module):
    """Multi-head self-attention (Appendix A, Eq. 5-8), fused through scaled_dot_product_attention."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.head_dim = cfg.head_dim
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(cfg.embed_dim, 3 * cfg.embed_dim, bias=cfg.qkv_bias)
        self.attn_drop = cfg.attn_dropout
        self.proj = nn.Linear(cfg.embed_dim, cfg.embed_dim)
        self.proj_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, return_attn: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, N, D = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each (B, heads, N, hd)
        attn = None
        if return_attn or _explicit_is_faster(q):  # maps asked for, or bf16 training on a CPU (docs/speed.md)
            attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
            out = F.dropout(attn, self.attn_drop, self.training) @ v  # attn: (B, heads, N, N)
        else:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop if self.training else 0.0)
        out = out.transpose(1, 2).reshape(B, N, D)  # (B, N, D): heads concatenated
        return self.proj_drop(self.proj(out)), attn if return_attn else None


def _explicit_is_faster(q: torch.Tensor) -> bool:
    """softmax(QK^T)V beats the fused kernel for bf16 training on CPU: the flash kernel's forward + backward is
    2-6x slower there for N <= 577 (benchmarks/attention_cpu.py); with fp32, on GPU, or without gradients the fused
    kernel stays."""
    return q.device.type == "cpu" and q.dtype == torch.bfloat16 and q.requires_grad and q.shape[-2] <= 640


class Mlp(nn.Module):
    """Two Dense layers with a GELU between (Sec. 3.1)."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.embed_dim, cfg.mlp_dim)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(cfg.dropout)
        self.fc2 = nn.Linear(cfg.mlp_dim, cfg.embed_dim)
        self.drop2 = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


def drop_path(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Stochastic depth: drop the whole residual branch per sample."""
    if p == 0.0 or not training:
        return x
    keep = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(1 - p)
    return x * keep / (1 - p)


class Block(nn.Module):
    """One pre-norm Transformer block: Eq. 2 then Eq. 3."""

    def __init__(self, cfg: ViTConfig, drop_path_rate: float = 0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.embed_dim, eps=cfg.layer_norm_eps)
        self.attn = Attention(cfg)
        self.norm2 = nn.LayerNorm(cfg.embed_dim, eps=cfg.layer_norm_eps)
        self.mlp = Mlp(cfg)
        self.drop_path = drop_path_rate

    def forward(self, x: torch.Tensor, return_attn: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        y, attn = self.attn(self.norm1(x), return_attn)
        x = x + drop_path(y, self.drop_path, self.training)  # Eq. 2
        x = x + drop_path(self.mlp(self.norm2(x)), self.drop_path, self.training)  # Eq. 3
        return x, attn


class PreLogits(nn.Module):
    """The pre-training head's hidden layer: Dense + tanh (Sec. 3.1, "MLP with one hidden layer")."""

    def __init__(self, dim: int, representation_size: int):
        super().__init__()
        self.fc = nn.Linear(dim, representation_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


class VisionTransformer(nn.Module):
    """ViT for image classification. Build with `vitlab.create_model(name, **overrides)`. Besides timm's surface
    (`forward_features`, `forward_head`, `forward_intermediates`, ...), walk it layer by layer with public names:
        z, grid = model.embed(images)               # Eq. 1: (B, prefix + N, D), (gh, gw)
        for block in model.blocks:                  # Eq. 2-3
            z, attn = block(z, return_attn=True)    # attn: (B, heads, T, T), T = prefix + N
        logits = model.forward_head(model.norm(z))  # Eq. 4
    A Hub folder: `vitlab.weights.save_pretrained(model, dir)`, `vitlab.load_model(dir)`.
    """

    # declared for the type checker (nn.Module's attribute lookup would type them Tensor | Module)
    preprocess: Preprocess | None
    cls_token: nn.Parameter | None
    pos_embed: nn.Parameter | None
    blocks: Sequence[Block]  # an nn.ModuleList
    pre_logits: PreLogits | None
    head: nn.Linear | nn.Identity

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        D = cfg.embed_dim
        self.num_prefix_tokens = cfg.num_prefix_tokens
        self.grid_size = cfg.grid_size
        self.grad_checkpointing = False
        self.preprocess = None  # the Preprocess the weights expect; set by load_model, None = unknown

        self.patch_embed = PatchEmbed(cfg)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.class_token else None
        if cfg.pos_embed == "learned":  # Eq. 1: E_pos, one row per token, class token first
            self.pos_embed = nn.Parameter(torch.zeros(1, cfg.seq_len, D))
        else:
            self.pos_embed = None
        self.pos_drop = nn.Dropout(cfg.dropout)
        rates = [cfg.drop_path * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]
        self.blocks = nn.ModuleList([Block(cfg, r) for r in rates])  # type: ignore[assignment]
        self.norm = nn.LayerNorm(D, eps=cfg.layer_norm_eps)
        self.pre_logits = PreLogits(D, cfg.representation_size) if cfg.representation_size else None
        self.num_features = cfg.representation_size or D
        self.head = nn.Linear(self.num_features, cfg.num_classes) if cfg.num_classes else nn.Identity()
        self.init_weights()

    # -- Eq. 1 --------------------------------------------------------------------------------------
    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """Eq. 1: (B, C, H, W) images -> z_0 (B, prefix + N, D) and the (gh, gw) patch grid (E_pos resampled to it)."""
        x, grid = self.patch_embed(x)  # (B, N, D)
        if self.cfg.pos_embed == "sincos2d":
            x = x + sincos_2d(grid[0], grid[1], self.cfg.embed_dim).to(x.device, x.dtype)  # patches only
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # (B, 1+N, D): class token first
        if self.pos_embed is not None:  # learned E_pos: one row per token, class row first
            pos: torch.Tensor = self.pos_embed  # (1, prefix + gh * gw, D)
            if grid != self.grid_size:  # other input size: resample on the 2-D grid, class row kept
                pos = resample_pos_embed(pos, grid, self.grid_size, self.num_prefix_tokens, self.cfg.pos_embed_resize)
            x = x + pos
        return self.pos_drop(x), grid

    def _run_block(self, block: Block, x: torch.Tensor, return_attn: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.grad_checkpointing and self.training and not torch.jit.is_scripting():
            return checkpoint(block, x, return_attn, use_reentrant=False)
        return block(x, return_attn)

    # -- Eq. 2-4 ------------------------------------------------------------------------------------
    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) images -> (B, prefix + N, D) normalised tokens."""
        x, _ = self.embed(x)  # (B, prefix + N, D)
        for block in self.blocks:
            x, _ = self._run_block(block, x, False)
        return self.norm(x)  # Eq. 4's LN, applied to every token

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """(B, prefix + N, D) -> (B, D): the class token (Eq. 4) or the mean of the patch tokens."""
        if self.cfg.pool == "token":
            return x[:, 0]
        return x[:, self.num_prefix_tokens :].mean(dim=1)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.pool(x)  # (B, D)
        if self.pre_logits is not None:
            x = self.pre_logits(x)  # (B, representation_size)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    # -- initialisation as in Google's vit_jax ------------------------------------------------------
    @torch.no_grad()
    def init_weights(self) -> None:
        """Xavier-uniform Dense kernels (q, k, v each on its own), N(0, 1e-6) MLP biases, N(0, 0.02) position
        embeddings, zero class token, LeCun-normal patch embedding and pre-logits, zero head."""
        D = self.cfg.embed_dim
        for block in self.blocks:
            for i in range(3):  # Google keeps q, k, v as three D x D kernels
                nn.init.xavier_uniform_(block.attn.qkv.weight[i * D : (i + 1) * D])
            for lin in (block.attn.proj, block.mlp.fc1, block.mlp.fc2):
                nn.init.xavier_uniform_(lin.weight)
            if block.attn.qkv.bias is not None:
                nn.init.zeros_(block.attn.qkv.bias)
            nn.init.zeros_(block.attn.proj.bias)
            nn.init.normal_(block.mlp.fc1.bias, std=1e-6)
            nn.init.normal_(block.mlp.fc2.bias, std=1e-6)
        _lecun_normal_(self.patch_embed.proj.weight)
        if self.patch_embed.proj.bias is not None:
            nn.init.zeros_(self.patch_embed.proj.bias)
        if self.patch_embed.backbone is not None:
            init_backbone(self.patch_embed.backbone)
        if self.pos_embed is not None:
            nn.init.normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.zeros_(self.cls_token)
        if self.pre_logits is not None:
            _lecun_normal_(self.pre_logits.fc.weight)
            nn.init.zeros_(self.pre_logits.fc.bias)
        if isinstance(self.head, nn.Linear):
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)

    # -- timm's small surface -----------------------------------------------------------------------
    def no_weight_decay(self) -> set[str]:
        return {"pos_embed", "cls_token"}

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def reset_classifier(self, num_classes: int, pool: str | None = None) -> None:
        """Replace the head by a zero-initialised one with `num_classes` outputs (paper Sec. 3.2)."""
        if pool is not None:
            self.cfg = self.cfg.replace(pool=pool)
        self.cfg = self.cfg.replace(num_classes=num_classes)
        self.head = zero_head(self.num_features, num_classes, like=self.norm.weight)

    # -- looking inside -----------------------------------------------------------------------------
    def forward_attention(
        self, x: torch.Tensor, layers: Iterable[int] | None = None
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Logits plus the attention weights of the asked-for layers (all when None), each (B, heads, T, T).

        Only those layers take the explicit softmax path; the rest keep the fused kernel.
        """
        wanted = self.layer_indices(layers)
        x, _ = self.embed(x)  # (B, prefix + N, D)
        maps: dict[int, torch.Tensor] = {}
        for i, block in enumerate(self.blocks):
            x, attn = block(x, i in wanted)
            if attn is not None:
                maps[i] = attn
        return self.forward_head(self.norm(x)), maps

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | Sequence[int] | None = None,
        norm: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
        return_prefix_tokens: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """Block outputs as in timm: `indices` an int (the last n blocks) or a list of block indices.

        Returns the intermediates as (B, D, gh, gw) ("NCHW") or (B, N, D) ("NLC"), optionally with their
        prefix tokens as (tokens, prefix) pairs, and unless `intermediates_only` the final features first.
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        check_images(x, self.patch_embed.proj.weight)  # before x.shape below
        if indices is None:
            wanted = set(range(len(self.blocks)))
        elif isinstance(indices, int):
            if not 0 < indices <= len(self.blocks):
                raise ValueError(f"indices={indices} must be in 1..{len(self.blocks)}")
            wanted = set(range(len(self.blocks) - indices, len(self.blocks)))
        else:
            wanted = self.layer_indices(indices)
        B = x.shape[0]
        x, grid = self.embed(x)  # (B, prefix + N, D)
        out: list = []
        for i, block in enumerate(self.blocks):
            x, _ = self._run_block(block, x, False)
            if i in wanted:
                y = self.norm(x) if norm else x
                prefix, tokens = y[:, : self.num_prefix_tokens], y[:, self.num_prefix_tokens :]
                if output_fmt == "NCHW":
                    tokens = tokens.reshape(B, grid[0], grid[1], -1).permute(0, 3, 1, 2).contiguous()
                out.append((tokens, prefix) if return_prefix_tokens else tokens)
            if intermediates_only and i >= max(wanted):
                break
        if intermediates_only:
            return out
        return self.norm(x), out

    def layer_indices(self, layers: Iterable[int] | None) -> set[int]:
        """Block indices (negative from the end, None = all) as a set of 0..depth-1; ValueError if out of range."""
        n = len(self.blocks)
        if layers is None:
            return set(range(n))
        result = set()
        for i in layers:
            j = i + n if i < 0 else i
            if not 0 <= j < n:
                raise ValueError(f"layer index {i} out of range for a model with {n} blocks")
            result.add(j)
        return result


def _lecun_normal_(w: torch.Tensor) -> None:
    """jax.nn.initializers.lecun_normal: truncated normal, variance 1/fan_in (fan_in of a conv: C * kh * kw)."""
    fan_in = w[0].numel()
    std = math.sqrt(1.0 / fan_in) / 0.87962566103423978  # std of a unit normal truncated at +-2
    nn.init.trunc_normal_(w, std=std, a=-2 * std, b=2 * std)
