"""`vitlab analyze` on models with prefix tokens (class, DeiT's distillation token, registers): attention distance and
rollout over the patch tokens only for any prefix count, the distillation token's own rollout, position-embedding
similarity with or without prefix rows in the table, the prefix-token statistics against hand-built attention, and
`forward_intermediates` on every family (against a walk through the model's blocks, and against timm's own)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import vitlab
from vitlab.analysis import (
    analyze_attention,
    layer_token_stats,
    mean_attention_distance,
    position_embedding_grid,
    token_layout,
    token_maps,
)
from vitlab.analysis.families import FAMILIES, family_model
from vitlab.analysis.report import analyze, write_report

from .conftest import perturb_


def tiny(**fields) -> vitlab.models.vit.VisionTransformer:
    cfg = dict(depth=3, img_size=24, patch_size=6, in_chans=1, num_classes=5, embed_dim=32, num_heads=2, mlp_dim=64)
    return perturb_(vitlab.create_model("ViT-Ti/16", **{**cfg, **fields}), scale=0.3).eval()


def _rollout_np(maps: dict[int, torch.Tensor]) -> np.ndarray:
    """Rollout written out in numpy: per layer rownorm(mean_heads(A) + I), multiplied first layer first."""
    out = None
    for i in sorted(maps):
        a = maps[i].double().numpy().mean(1)
        a = a + np.eye(a.shape[-1])
        a = a / a.sum(-1, keepdims=True)
        out = a if out is None else np.einsum("bij,bjk->bik", a, out)
    assert out is not None
    return out


# -- attention distance and rollout over the patch tokens, whatever the prefix -----------------------------------------
def test_distance_leaves_out_any_number_of_prefix_tokens():
    """Attention that sends most of its weight to six prefix tokens and the rest to the right-hand neighbour: the
    distance is one patch step, as if the prefix were not there."""
    grid, P, prefix = (3, 4), 8, 6
    N = grid[0] * grid[1]
    T = prefix + N
    a = torch.zeros(2, 3, T, T)
    a[..., :, :prefix] = 0.9 / prefix
    for q in range(N):
        r, c = divmod(q, grid[1])
        a[..., prefix + q, prefix + r * grid[1] + (c + 1 if c + 1 < grid[1] else c - 1)] = 0.1
    got = mean_attention_distance(a, grid, P, prefix)
    torch.testing.assert_close(got, torch.full((2, 3), float(P), dtype=torch.float64))


@pytest.mark.parametrize("fields", [dict(distilled=True, reg_tokens=3), dict(reg_tokens=2, no_embed_class=True),
                                    dict(pool="gap", class_token=False, reg_tokens=2),
                                    dict(pool="map", class_token=False)])
def test_rollout_and_distance_on_models_with_prefix_tokens(fields):
    model = tiny(**fields)
    x = torch.randn(3, 1, 24, 24)
    res = analyze_attention(model, x, batch_size=2, layer_maps=[0])
    with torch.no_grad():
        _, maps = model.forward_attention(x)
    prefix, N = model.num_prefix_tokens, 16
    roll = _rollout_np(maps)  # (B, T, T)
    cls_row = roll[:, 0] if model.cfg.class_token else roll[:, prefix:].mean(1)  # patch rows' mean without one
    np.testing.assert_allclose(res.rollout, cls_row[:, prefix:].reshape(3, 4, 4), rtol=1e-4, atol=1e-6)
    if model.cfg.distilled:
        np.testing.assert_allclose(res.rollout_dist, roll[:, 1, prefix:].reshape(3, 4, 4), rtol=1e-4, atol=1e-6)
    else:
        assert res.rollout_dist is None
    a0 = maps[0].double().numpy()  # layer 1, per head: the query's row over the patch keys
    q0 = a0[:, :, 0] if model.cfg.class_token else a0[:, :, prefix:].mean(2)
    np.testing.assert_allclose(res.layer_maps[0], q0[..., prefix:].reshape(3, 2, 4, 4), rtol=1e-4, atol=1e-6)
    # distance: patch queries over patch keys renormalised, against the pairwise pixel distances
    pos = np.array([(6 * (i // 4), 6 * (i % 4)) for i in range(N)], dtype=float)
    d = np.sqrt(((pos[:, None] - pos[None]) ** 2).sum(-1))
    p = a0[:, :, prefix:, prefix:]
    p = p / p.sum(-1, keepdims=True)
    np.testing.assert_allclose(res.distance_per_image[:, 0], (p * d).sum(-1).mean(-1), rtol=1e-5)


def test_token_maps_reads_the_asked_row():
    rows = torch.arange(3 * 7 * 7, dtype=torch.float64).reshape(3, 7, 7)  # prefix 3, 2x2 patches
    torch.testing.assert_close(token_maps(rows, (2, 2), 3, 1), rows[:, 1, 3:].reshape(3, 2, 2))
    torch.testing.assert_close(token_maps(rows, (2, 2), 3, None), rows[:, 3:, 3:].mean(1).reshape(3, 2, 2))
    torch.testing.assert_close(token_maps(rows[:, 3:, 3:], (2, 2), 0), rows[:, 3:, 3:].mean(1).reshape(3, 2, 2))


@pytest.mark.parametrize("fields", [dict(reg_tokens=3), dict(reg_tokens=3, no_embed_class=True),
                                    dict(distilled=True), dict(no_embed_class=True)])
def test_position_similarity_reads_the_patch_rows(fields):
    model = tiny(**fields)
    table = model.pos_embed.detach()[0]
    expected_rows = table[-16:]  # the patch rows: the table's last N, with or without prefix rows
    assert table.shape[0] == 16 + (0 if model.cfg.no_embed_class else model.num_prefix_tokens)
    np.testing.assert_array_equal(position_embedding_grid(model), expected_rows.numpy().reshape(4, 4, -1))


# -- the prefix tokens' statistics ------------------------------------------------------------------------------------
def test_token_stats_on_hand_built_attention_and_outputs():
    cfg = vitlab.models.config.ViTConfig(img_size=16, patch_size=4, embed_dim=8, depth=1, num_heads=2, mlp_dim=16,
                                         distilled=True, reg_tokens=2)
    layout = token_layout(cfg)
    assert layout == {"class": slice(0, 1), "distillation": slice(1, 2), "registers": slice(2, 4),
                      "patches": slice(4, None)}
    N, T = 16, 20
    attn = torch.full((1, 2, T, T), 1.0 / T)  # uniform everywhere ...
    attn[0, 0, 0] = torch.tensor([0.1, 0.2, 0.15, 0.15] + [0.4 / N] * N)  # ... but head 1 of the class token
    x = torch.zeros(1, T, 8)
    x[0, :, 0] = 1.0  # every token of norm 1 ...
    x[0, 2:4, 0] = 7.0  # ... registers of norm 7
    x[0, 4 + 5, 0] = 10.0  # ... and one high-norm patch token
    s = layer_token_stats(x, attn, cfg)
    u = 1.0 / T  # head 2's share per key
    expected = {"class": (0.1 + u) / 2, "distillation": (0.2 + u) / 2, "registers": (0.3 + 2 * u) / 2,
                "patches": (0.4 + N * u) / 2}
    for kind, share in expected.items():
        assert s[f"attn_{kind}"].item() == pytest.approx(share)
    assert s["norm_registers"].item() == pytest.approx(7.0)
    assert s["norm_patches"].item() == pytest.approx((15 + 10) / 16)
    assert s["patch_outliers"].item() == pytest.approx(1 / 16) and s["patch_max_ratio"].item() == pytest.approx(10)
    assert s["entropy"].item() == pytest.approx(math.log(T))  # the patch queries attend uniformly


def test_report_has_the_distillation_rollout_and_the_prefix_tokens(tmp_path):
    model = tiny(distilled=True, reg_tokens=4, no_embed_class=True)
    result = analyze(model, torch.randn(2, 1, 24, 24), batch_size=2, num_components=4, source="tiny")
    files = {p.name for p in write_report(result, tmp_path)}
    assert {"attention_rollout_distillation.json", "prefix_tokens.png", "prefix_tokens.json"} <= files
    t = json.loads((tmp_path / "prefix_tokens.json").read_text())
    assert t["counts"] == {"class": 1, "distillation": 1, "registers": 4, "patches": 16}
    shares = np.array([t["attention_share"][k] for k in ("class", "distillation", "registers", "patches")])
    np.testing.assert_allclose(shares.sum(0), 1.0, atol=1e-5)
    html = (tmp_path / "report.html").read_text()
    assert "class and distillation tokens and 4 registers left out" in html
    assert "distillation token" in html and "Prefix tokens" in html


# -- forward_intermediates on every family ----------------------------------------------------------------------------
@pytest.mark.parametrize("family", list(FAMILIES))
def test_forward_intermediates_walks_the_blocks(family):
    model = perturb_(family_model(family), scale=0.05)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        z, _ = model.embed(x)
        walk = []
        for block in model.blocks:
            z, _ = block(z)
            walk.append(z)
        final, inter = model.forward_intermediates(x, indices=[0, 2], norm=True, return_prefix_tokens=True)
        torch.testing.assert_close(final, model.forward_features(x))
        prefix = model.num_prefix_tokens
        for (tokens, pre), i in zip(inter, [0, 2]):
            y = model.norm(walk[i])
            assert pre.shape == (2, prefix, 64) and tokens.shape == (2, 64, 4, 4)
            torch.testing.assert_close(pre, y[:, :prefix])
            torch.testing.assert_close(tokens, y[:, prefix:].transpose(1, 2).reshape(2, 64, 4, 4))
        last = model.forward_intermediates(x, indices=1, output_fmt="NLC", intermediates_only=True)
        torch.testing.assert_close(last[0], walk[-1][:, prefix:])
        torch.testing.assert_close(model.forward_head(final), model(x))


TIMM = {  # family: (timm architecture, its extra kwargs)
    "deit_distilled": ("deit_base_distilled_patch16_224", {}),
    "deit3": ("deit3_base_patch16_224", {}),
    "dinov2_reg4": ("vit_base_patch14_reg4_dinov2", {}),
    "clip": ("vit_base_patch16_clip_quickgelu_224", {}),
    "siglip_map": ("vit_base_patch16_siglip_224", {}),
    "mae_gap_fc_norm": ("vit_base_patch16_224", {"global_pool": "avg", "fc_norm": True}),
    "eva02_rope": ("eva02_tiny_patch14_224", {}),
    "dinov3_rope_reg4": ("vit_small_patch16_dinov3", {}),
}


@pytest.mark.parametrize("family", sorted(TIMM))
def test_forward_intermediates_matches_timm(tmp_path, family):
    timm = pytest.importorskip("timm")
    from timm.models._hub import save_for_hf

    arch, extra = TIMM[family]
    args = dict(img_size=28, patch_size=7, embed_dim=192, depth=3, num_heads=3, num_classes=5, **extra)
    torch.manual_seed(0)
    theirs = timm.create_model(arch, pretrained=False, **args).eval()
    with torch.no_grad():  # parameters only: timm's RoPE caches its frequencies in buffers that are not saved
        for p in theirs.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    save_for_hf(theirs, tmp_path / "hub", model_args=args, safe_serialization=True)  # timm's Hub folder
    ours = vitlab.load_model(tmp_path / "hub")
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        for kw in (dict(indices=[0, 2], norm=True, return_prefix_tokens=True), dict(indices=2, output_fmt="NLC")):
            a_final, a = ours.forward_intermediates(x, **kw)
            b_final, b = theirs.forward_intermediates(x, **kw)
            torch.testing.assert_close(a_final, b_final, atol=1e-5, rtol=1e-5)
            for u, v in zip(a, b):
                for s, t in zip(u if isinstance(u, tuple) else (u,), v if isinstance(v, tuple) else (v,)):
                    torch.testing.assert_close(s, t, atol=1e-5, rtol=1e-5)
