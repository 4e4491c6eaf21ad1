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
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .config import ViTConfig
from .hybrid import backbone_channels, build_backbone, init_backbone
from .layers import AttentionPool, LayerScale, SwiGLU, activation, check_images, zero_head
from .posembed import resample_pos_embed, sincos_2d
from .rope import RoPE

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
        self.proj = nn.Conv2d(cin, cfg.embed_dim, cfg.patch_size, stride=cfg.patch_size, bias=cfg.patch_bias)

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
    """Multi-head self-attention (Appendix A, Eq. 5-8), fused through scaled_dot_product_attention. With `rope` (the
    model's one RoPE module, EVA-02 / DINOv3) the patch tokens' queries and keys are turned first."""

    def __init__(self, cfg: ViTConfig, rope: RoPE | None = None):
        super().__init__()
        self.rope = rope
        self.num_heads = cfg.num_heads
        self.head_dim = cfg.head_dim
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(cfg.embed_dim, 3 * cfg.embed_dim, bias=cfg.qkv_bias)
        self.attn_drop = cfg.attn_dropout
        self.proj = nn.Linear(cfg.embed_dim, cfg.embed_dim)
        self.proj_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, return_attn: bool = False,
                rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, N, D) tokens -> (B, N, D), or (B, rows, D) with `rows`: only the first `rows` tokens' queries (they
        still attend to all N); with `return_attn` also the attention weights (B, heads, N or rows, N)."""
        B, N, D = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each (B, heads, N, hd)
        if self.rope is not None:  # rotary position embeddings (vitlab.models.rope); the paper's ViT: no
            q, k = self.rope(q, k)
        if rows is not None:
            q = q[:, :, :rows]  # (B, heads, rows, hd)
        attn = None
        if return_attn or _explicit_is_faster(q):  # maps asked for, or bf16 training on a CPU (docs/speed.md)
            attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
            out = F.dropout(attn, self.attn_drop, self.training) @ v  # attn: (B, heads, N, N)
        else:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop if self.training else 0.0)
        out = out.transpose(1, 2).reshape(B, q.shape[2], D)  # (B, N or rows, D): heads concatenated
        return self.proj_drop(self.proj(out)), attn if return_attn else None


def _explicit_is_faster(q: torch.Tensor) -> bool:
    """softmax(QK^T)V beats the fused kernel for bf16 training on CPU: the flash kernel's forward + backward is
    2-6x slower there for N <= 577 (benchmarks/attention_cpu.py); with fp32, on GPU, or without gradients the fused
    kernel stays."""
    return q.device.type == "cpu" and q.dtype == torch.bfloat16 and q.requires_grad and q.shape[-2] <= 640


class Mlp(nn.Module):
    """Two Dense layers with a GELU between (Sec. 3.1); `cfg.act` picks another nonlinearity for CLIP / SigLIP2."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.embed_dim, cfg.mlp_dim)
        self.act = activation(cfg.act)
        self.drop1 = nn.Dropout(cfg.dropout)
        self.norm = nn.LayerNorm(cfg.mlp_dim, eps=cfg.layer_norm_eps) if cfg.mlp_norm else nn.Identity()
        self.fc2 = nn.Linear(cfg.mlp_dim, cfg.embed_dim)
        self.drop2 = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(self.fc1(x))))))


def drop_path(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Stochastic depth: drop the whole residual branch per sample."""
    if p == 0.0 or not training:
        return x
    keep = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(1 - p)
    return x * keep / (1 - p)


class Block(nn.Module):
    """One pre-norm Transformer block: Eq. 2 then Eq. 3."""

    def __init__(self, cfg: ViTConfig, drop_path_rate: float = 0.0, rope: RoPE | None = None):
        super().__init__()
        D, eps, ls = cfg.embed_dim, cfg.layer_norm_eps, cfg.layer_scale
        self.norm1 = nn.LayerNorm(D, eps=eps)
        self.attn = Attention(cfg, rope)
        self.ls1 = LayerScale(D, ls) if ls else nn.Identity()  # CaiT / DeiT-III / DINOv2
        self.norm2 = nn.LayerNorm(D, eps=eps)
        self.mlp = SwiGLU(D, cfg.mlp_dim, cfg.act, cfg.mlp_norm, eps, cfg.dropout) if cfg.mlp == "swiglu" else Mlp(cfg)
        self.ls2 = LayerScale(D, ls) if ls else nn.Identity()
        self.drop_path = drop_path_rate

    def forward(self, x: torch.Tensor, return_attn: bool = False,
                rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, N, D) -> (B, N, D); with `rows`, the first `rows` tokens' outputs alone, (B, rows, D): the same values
        as the full block's first rows (each token's MLP and residual are its own; attention reads all N)."""
        y, attn = self.attn(self.norm1(x), return_attn, rows)
        if rows is not None:
            x = x[:, :rows]  # (B, rows, D)
        x = x + drop_path(self.ls1(y), self.drop_path, self.training)  # Eq. 2
        x = x + drop_path(self.ls2(self.mlp(self.norm2(x))), self.drop_path, self.training)  # Eq. 3
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
    dist_token: nn.Parameter | None
    reg_token: nn.Parameter | None
    pos_embed: nn.Parameter | None
    rope: RoPE | None
    blocks: Sequence[Block]  # an nn.ModuleList
    attn_pool: AttentionPool | None
    pre_logits: PreLogits | None
    head: nn.Linear | nn.Identity
    head_dist: nn.Linear | nn.Identity | None

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        D = cfg.embed_dim
        self.num_prefix_tokens = cfg.num_prefix_tokens
        self.grid_size = cfg.grid_size
        self.grad_checkpointing = False
        self.preprocess = None  # the Preprocess the weights expect; set by load_model, None = unknown

        eps = cfg.layer_norm_eps
        self.patch_embed = PatchEmbed(cfg)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.distilled else None  # DeiT
        self.reg_token = nn.Parameter(torch.zeros(1, cfg.reg_tokens, D)) if cfg.reg_tokens else None  # registers
        if cfg.pos_embed == "learned":  # Eq. 1: E_pos, one row per token, class token first
            self.pos_embed = nn.Parameter(torch.zeros(1, cfg.num_patches + cfg.pos_prefix_rows, D))
        else:
            self.pos_embed = None
        self.pos_drop = nn.Dropout(cfg.dropout)
        self.norm_pre = nn.LayerNorm(D, eps=eps) if cfg.pre_norm else nn.Identity()  # CLIP's ln_pre
        self.rope = RoPE(cfg) if cfg.rope else None  # EVA-02 / DINOv3: one, shared by the blocks' attention
        rates = [cfg.drop_path * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]
        self.blocks = nn.ModuleList([Block(cfg, r, self.rope) for r in rates])  # type: ignore[assignment]
        self.norm = nn.Identity() if cfg.fc_norm else nn.LayerNorm(D, eps=eps)  # Eq. 4's LN, on every token
        self.attn_pool = AttentionPool(D, cfg.num_heads, cfg.mlp_dim, cfg.act, eps) if cfg.pool == "map" else None
        self.fc_norm = nn.LayerNorm(D, eps=eps) if cfg.fc_norm else nn.Identity()  # MAE / BEiT: LN after pooling
        self.pre_logits = PreLogits(D, cfg.representation_size) if cfg.representation_size else None
        self.num_features = cfg.representation_size or D
        self.head = nn.Linear(self.num_features, cfg.num_classes) if cfg.num_classes else nn.Identity()
        self.head_dist = (nn.Linear(self.num_features, cfg.num_classes) if cfg.num_classes else nn.Identity()) \
            if cfg.distilled else None
        self.distilled_training = False  # DeiT: forward returns (class logits, distillation logits) while training
        # forward() runs the last block for the tokens the head reads alone (`head_rows`): the same logits with
        # ~3/4 of one block's work left out; off by default, so hooks and exports see every token (vitlab.optimize
        # turns it on in its copies)
        self.prune_last_block = False
        self.init_weights()

    # -- Eq. 1 --------------------------------------------------------------------------------------
    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """Eq. 1: (B, C, H, W) images -> z_0 (B, prefix + N, D) and the (gh, gw) patch grid (E_pos resampled to it).
        The prefix is [class][distillation][registers], as many as the config has."""
        cfg = self.cfg
        x, grid = self.patch_embed(x)  # (B, N, D)
        if self.rope is not None:  # the blocks turn q and k for this grid
            self.rope.set_grid(grid)
        if cfg.pos_embed == "sincos2d":
            x = x + sincos_2d(grid[0], grid[1], cfg.embed_dim).to(x.device, x.dtype)  # patches only
        pos: torch.Tensor | None = self.pos_embed  # learned E_pos: (1, prefix rows + gh * gw, D), prefix rows first
        if pos is not None and grid != self.grid_size:  # other input size: resample on the 2-D grid, prefix rows kept
            pos = resample_pos_embed(pos, grid, self.grid_size, cfg.pos_prefix_rows, cfg.pos_embed_resize)
        if pos is not None and cfg.no_embed_class:  # DeiT-III, DINOv2 with registers: patches only
            x = x + pos
        prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.dist_token, self.reg_token)
                  if t is not None]
        if prefix:
            x = torch.cat([*prefix, x], dim=1)  # (B, prefix + N, D): class token first, as in BERT
        if pos is not None and not cfg.no_embed_class:
            x = x + pos
        return self.norm_pre(self.pos_drop(x)), grid  # norm_pre: CLIP's ln_pre, else identity

    def _run_block(self, block: Block, x: torch.Tensor, return_attn: bool,
                   rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.grad_checkpointing and self.training and not torch.jit.is_scripting():
            return checkpoint(block, x, return_attn, rows, use_reentrant=False)
        return block(x, return_attn, rows)

    # -- Eq. 2-4 ------------------------------------------------------------------------------------
    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) images -> (B, prefix + N, D) normalised tokens."""
        x, _ = self.embed(x)  # (B, prefix + N, D)
        for block in self.blocks:
            x, _ = self._run_block(block, x, False)
        return self.norm(x)  # Eq. 4's LN, applied to every token

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """(B, prefix + N, D) -> (B, D): the class token (Eq. 4), the mean of the patch tokens, or the MAP head's
        attention over them (SigLIP); then fc_norm (MAE) where the config has it."""
        if self.cfg.pool == "token":
            x = x[:, 0]
        elif self.attn_pool is not None:
            x = self.attn_pool(x[:, self.num_prefix_tokens :])
        else:
            x = x[:, self.num_prefix_tokens :].mean(dim=1)
        return self.fc_norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if self.head_dist is not None:  # DeiT: class and distillation tokens, a head each
            return self._distilled_head(x, pre_logits)
        x = self.pool(x)  # (B, D)
        if self.pre_logits is not None:
            x = self.pre_logits(x)  # (B, representation_size)
        return x if pre_logits else self.head(x)

    def _distilled_head(self, x: torch.Tensor, pre_logits: bool) -> Any:
        """DeiT (Touvron et al. 2021, Sec. 4): the two heads' logits averaged; both while distilled_training."""
        assert self.head_dist is not None
        cls, dist = self.fc_norm(x[:, 0]), self.fc_norm(x[:, 1])  # (B, D) each
        if pre_logits:
            return (cls + dist) / 2
        cls, dist = self.head(cls), self.head_dist(dist)
        if self.distilled_training and self.training:
            return cls, dist
        return (cls + dist) / 2

    @property
    def head_rows(self) -> int | None:
        """How many leading tokens the head reads: 1 (the class token, Eq. 4), 2 (DeiT's class and distillation
        tokens), or None when it reads them all (mean pooling, the MAP head)."""
        if self.head_dist is not None:
            return 2
        return 1 if self.cfg.pool == "token" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = self.head_rows if self.prune_last_block else None
        if rows is None:
            return self.forward_head(self.forward_features(x))
        x, _ = self.embed(x)  # (B, prefix + N, D)
        for block in self.blocks[:-1]:
            x, _ = self._run_block(block, x, False)
        x, _ = self._run_block(self.blocks[-1], x, False, rows)  # (B, rows, D): all tokens' keys and values
        return self.forward_head(self.norm(x))  # Eq. 4's LN is per token

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
            for ls in (block.ls1, block.ls2):
                if isinstance(ls, LayerScale):
                    nn.init.constant_(ls.gamma, ls.init)
        _lecun_normal_(self.patch_embed.proj.weight)
        if self.patch_embed.proj.bias is not None:
            nn.init.zeros_(self.patch_embed.proj.bias)
        if self.patch_embed.backbone is not None:
            init_backbone(self.patch_embed.backbone)
        if self.pos_embed is not None:
            nn.init.normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.zeros_(self.cls_token)
        for token in (self.dist_token, self.reg_token):  # as timm: small random, so they differ from each other
            if token is not None:
                nn.init.normal_(token, std=1e-6 if token is self.reg_token else 0.02)
        if self.attn_pool is not None:
            nn.init.trunc_normal_(self.attn_pool.latent, std=D**-0.5)
            for lin in (self.attn_pool.q, self.attn_pool.kv, self.attn_pool.proj, self.attn_pool.mlp.fc1,
                        self.attn_pool.mlp.fc2):
                nn.init.xavier_uniform_(lin.weight)
                if lin.bias is not None:
                    nn.init.zeros_(lin.bias)
        if self.pre_logits is not None:
            _lecun_normal_(self.pre_logits.fc.weight)
            nn.init.zeros_(self.pre_logits.fc.bias)
        for head in (self.head, self.head_dist):
            if isinstance(head, nn.Linear):
                nn.init.zeros_(head.weight)
                nn.init.zeros_(head.bias)

    # -- timm's small surface -----------------------------------------------------------------------
    def no_weight_decay(self) -> set[str]:
        names = {n for n, _ in self.named_parameters()}
        return {"pos_embed", "cls_token", "dist_token", "reg_token", "attn_pool.latent"} & names

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def reset_classifier(self, num_classes: int, pool: str | None = None) -> None:
        """Replace the head by a zero-initialised one with `num_classes` outputs (paper Sec. 3.2)."""
        if pool is not None:
            if (pool == "map") != (self.attn_pool is not None):
                raise ValueError(f"reset_classifier(pool={pool!r}): the MAP head is built with the model; rebuild it "
                                 f"with pool={pool!r} (create_model(..., pool={pool!r})) instead")
            self.cfg = self.cfg.replace(pool=pool)
        self.cfg = self.cfg.replace(num_classes=num_classes)
        like = self.patch_embed.proj.weight
        self.head = zero_head(self.num_features, num_classes, like=like)
        if self.head_dist is not None:
            self.head_dist = zero_head(self.num_features, num_classes, like=like)

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
