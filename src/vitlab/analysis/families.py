"""The ViT families' insides side by side: the same measurements on each (mean attention distance by depth,
attention entropy, position-embedding similarity, what the class / distillation / register tokens do and the
patch-token norms), from random-init models of every family built at one small size (`FAMILIES`, what CI draws),
and from real checkpoints where they are already on this machine (nothing is downloaded: `cached_models`).

    results = [measure(family_model(name), noise_images(family_model(name).cfg)) for name in FAMILIES]
    html = vitlab.analysis.familypage.families_page(results)         # or `vitlab analyze --compare-families`

At random init the numbers say what each family's architecture does before any training (LayerScale's tiny
residual branches, registers' share of attention, a MAP head's missing class token); a trained checkpoint's say
what training made of it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..models.config import ViTConfig
from ..models.vit import VisionTransformer
from ..weights import WeightsError, load_model
from .attention import analyze_attention
from .posembed_sim import pos_embed_similarity, position_embedding_grid, similarity_by_distance
from .tokens import TokenStats

# One small size for every family: a 4x4 grid of 8 px patches, 4 blocks of width 64 (seconds on a CPU).
SMALL: dict[str, Any] = dict(img_size=32, patch_size=8, in_chans=3, embed_dim=64, depth=4, num_heads=4, mlp_dim=128,
                             num_classes=10)
# Each family's ViTConfig fields, as timm's architectures set them (vitlab.weights.timm_arch).
FAMILIES: dict[str, dict[str, Any]] = {
    "ViT (paper)": {},
    "DeiT distilled": {"distilled": True},
    "DeiT-III": {"layer_scale": 1e-6, "no_embed_class": True},
    "MAE (fine-tuned)": {"pool": "gap", "fc_norm": True},
    "DINOv2": {"layer_scale": 1e-5},
    "DINOv2 + registers": {"layer_scale": 1e-5, "reg_tokens": 4, "no_embed_class": True},
    "CLIP": {"pre_norm": True, "act": "quick_gelu", "patch_bias": False, "layer_norm_eps": 1e-5},
    "SigLIP": {"pool": "map", "class_token": False, "act": "gelu_tanh"},
    "EVA-02": {"mlp": "swiglu", "mlp_norm": True, "act": "silu", "pool": "gap", "fc_norm": True, "rope": "eva02"},
    "DINOv3": {"layer_scale": 1e-5, "reg_tokens": 4, "pos_embed": "none", "rope": "dinov3", "qkv_bias": False,
               "layer_norm_eps": 1e-5},
}


def family_model(name: str, seed: int = 0, **size: Any) -> VisionTransformer:
    """A random-init model of family `name` (`FAMILIES`) at `SMALL` size (fields in `size` change it), eval mode."""
    if name not in FAMILIES:
        raise ValueError(f"unknown family {name!r}; the families: {', '.join(FAMILIES)}")
    torch.manual_seed(seed)
    cfg = ViTConfig.from_name("ViT-Ti/16", **{**SMALL, **FAMILIES[name], **size})
    return VisionTransformer(cfg).eval()


def noise_images(cfg: ViTConfig, n: int = 8, seed: int = 0) -> torch.Tensor:
    """(n, C, H, W) standard-normal images at the model's size: the inputs when no images are given (their
    statistics match normalised pixels; their attention patterns describe the weights, not a scene)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, cfg.in_chans, *cfg.img_hw, generator=g)


@dataclass
class FamilyInsides:
    """One model's measurements (numpy arrays, one value per layer unless said).

    Attributes:
        name: The family or checkpoint name shown; source: "random init" or the checkpoint.
        config: The model's ViTConfig as a dict.
        head_distance: (L, heads) mean attention distance in pixels; uniform_distance: uniform attention's.
        entropy: (L,) mean attention entropy of the patch queries (nats); uniform_entropy: log T.
        pos_similarity: (gh, gw, gh, gw) cosine similarity of the position embeddings (None without any);
            pos_summary: its `similarity_by_distance` numbers.
        tokens: What the prefix tokens do and the token norms (`vitlab.analysis.tokens`).
        num_images: Images the attention was averaged over.
    """

    name: str
    source: str
    config: dict[str, Any]
    head_distance: np.ndarray
    uniform_distance: float
    entropy: np.ndarray
    uniform_entropy: float
    pos_similarity: np.ndarray | None
    pos_summary: dict[str, Any] | None
    tokens: TokenStats
    num_images: int

    @property
    def distance(self) -> np.ndarray:
        """(L,) mean attention distance per layer (heads averaged), pixels."""
        return self.head_distance.mean(1)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready numbers (the similarity grid itself left out: its summary stays)."""
        r = lambda a: np.round(np.asarray(a, dtype=np.float64), 6).tolist()  # noqa: E731
        pos = None if self.pos_summary is None else {k: v for k, v in self.pos_summary.items()
                                                     if not isinstance(v, list)}
        return {"name": self.name, "source": self.source, "config": self.config, "num_images": self.num_images,
                "mean_distance": r(self.distance), "head_distance": r(self.head_distance),
                "uniform_distance": self.uniform_distance, "entropy": r(self.entropy),
                "uniform_entropy": self.uniform_entropy, "pos_embed": pos, "tokens": self.tokens.to_dict()}


@torch.no_grad()
def measure(model: VisionTransformer, images: torch.Tensor, name: str, source: str = "random init",
            batch_size: int = 16) -> FamilyInsides:
    """Every measurement of the comparison for one model on (n, C, H, W) normalised `images`."""
    att = analyze_attention(model, images, batch_size=batch_size)
    assert att.tokens is not None
    sim = pos_embed_similarity(position_embedding_grid(model)) if model.cfg.pos_embed != "none" else None
    return FamilyInsides(
        name=name, source=source, config=model.cfg.to_dict(), head_distance=att.mean_distance,
        uniform_distance=att.uniform_distance, entropy=att.tokens.entropy, uniform_entropy=att.tokens.uniform_entropy,
        pos_similarity=sim, pos_summary=similarity_by_distance(sim) if sim is not None else None, tokens=att.tokens,
        num_images=len(images))


def random_init_families(names: Sequence[str] | None = None, num_images: int = 8,
                         seed: int = 0) -> list[FamilyInsides]:
    """`measure` of each family's random-init model (all `FAMILIES` by default) on the same noise images."""
    out = []
    for name in names or list(FAMILIES):
        model = family_model(name, seed)
        out.append(measure(model, noise_images(model.cfg, num_images, seed), name))
    return out


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """VITLAB_OFFLINE=1 for the block: `vitlab.weights` then reads only what is on disk or cached."""
    old = os.environ.get("VITLAB_OFFLINE")
    os.environ["VITLAB_OFFLINE"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["VITLAB_OFFLINE"]
        else:
            os.environ["VITLAB_OFFLINE"] = old


def cached_models(names: Sequence[str]) -> tuple[dict[str, VisionTransformer], dict[str, str]]:
    """The checkpoints of `names` (paths, registry names, hf-hub:...) that load without a download, in eval mode,
    and for each of the others why it was skipped (not on disk or in the cache, or not a ViT)."""
    models: dict[str, VisionTransformer] = {}
    skipped: dict[str, str] = {}
    for name in names:
        try:
            with offline():
                model = load_model(name)
        except (FileNotFoundError, WeightsError) as e:
            skipped[name] = str(e).splitlines()[0]
            continue
        if not isinstance(model, VisionTransformer):
            skipped[name] = f"a {type(model).__name__}, not a ViT"
            continue
        models[name] = model.eval()
    return models, skipped
