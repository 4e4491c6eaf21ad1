"""Analysis functions against closed-form answers and against an independent all-at-once computation."""

import numpy as np
import pytest
import torch
from scipy.spatial.distance import cdist
from scipy.stats import ortho_group

import vitlab
from vitlab.analysis import (
    analyze_attention,
    attention_rollout,
    components_to_images,
    filter_pca,
    mean_attention_distance,
    pos_embed_similarity,
    position_embedding_grid,
    reduce_batch,
    similarity_by_distance,
    token_maps,
)
from vitlab.models.posembed import sincos_2d

from .conftest import perturb_


def _with_prefix(patch_attn: torch.Tensor, prefix: int) -> torch.Tensor:
    """Embed (B, H, N, N) patch-to-patch attention in (B, H, prefix+N, prefix+N), prefix rows/cols filled."""
    B, H, N, _ = patch_attn.shape
    T = prefix + N
    a = torch.full((B, H, T, T), 1.0 / T, dtype=patch_attn.dtype)
    # patch queries give some weight to the class token too: the distance must ignore it
    a[:, :, prefix:, :prefix] = 0.3 / max(prefix, 1)
    a[:, :, prefix:, prefix:] = 0.7 * patch_attn
    return a


# -- mean attention distance ------------------------------------------------------------------------------
@pytest.mark.parametrize("prefix", [0, 1])
def test_distance_of_self_attention_is_zero(prefix):
    grid, N = (3, 5), 15
    a = _with_prefix(torch.eye(N).expand(2, 4, N, N), prefix)
    torch.testing.assert_close(mean_attention_distance(a, grid, 16, prefix), torch.zeros(2, 4, dtype=torch.float64))


@pytest.mark.parametrize("grid", [(1, 7), (4, 6), (5, 5)])
def test_distance_of_uniform_attention_is_mean_pairwise_distance(grid):
    P, N = 8, grid[0] * grid[1]
    a = _with_prefix(torch.full((1, 2, N, N), 1.0 / N), 1)
    got = mean_attention_distance(a, grid, P, 1)
    # reference: scipy's pairwise distances between patch centres, averaged over all (query, key) pairs
    centres = np.array([(P * i, P * j) for i in range(grid[0]) for j in range(grid[1])], dtype=float)
    expected = cdist(centres, centres).mean()
    torch.testing.assert_close(got, torch.full((1, 2), expected, dtype=torch.float64))
    if grid[0] == 1:  # on a line of n patches the mean |i - j| over all pairs is (n^2 - 1) / (3n)
        n = grid[1]
        assert got[0, 0].item() == pytest.approx(P * (n * n - 1) / (3 * n))


def test_distance_of_neighbour_attention_is_one_patch():
    grid, P = (4, 5), 16
    N = grid[0] * grid[1]
    a = torch.zeros(1, 3, N, N)
    for q in range(N):
        r, c = divmod(q, grid[1])
        a[..., q, r * grid[1] + (c + 1 if c + 1 < grid[1] else c - 1)] = 1.0  # right neighbour (left on the edge)
    got = mean_attention_distance(_with_prefix(a, 1), grid, P, 1)
    torch.testing.assert_close(got, torch.full((1, 3), float(P), dtype=torch.float64))


def test_distance_rejects_wrong_shape():
    with pytest.raises(ValueError, match=r"T = 0 \+ 3\*3"):
        mean_attention_distance(torch.ones(1, 1, 10, 10) / 10, (3, 3), 16, 0)


# -- rollout -----------------------------------------------------------------------------------------------
def test_rollout_of_identity_attention_is_identity():
    T = 10
    out = attention_rollout([torch.eye(T).expand(2, 3, T, T)] * 4)
    torch.testing.assert_close(out, torch.eye(T, dtype=torch.float64).expand(2, T, T))


@pytest.mark.parametrize("depth", [1, 3, 6])
def test_rollout_of_uniform_attention_is_closed_form(depth):
    # A = rownorm(U + I) = (U + I) / 2 with U = 1/T; U is idempotent, so A^L = 2^-L I + (1 - 2^-L) U.
    T, prefix = 17, 1
    out = attention_rollout([torch.full((1, 2, T, T), 1.0 / T)] * depth)
    c = 0.5**depth
    expected = c * torch.eye(T, dtype=torch.float64) + (1 - c) / T
    torch.testing.assert_close(out[0], expected)
    maps = token_maps(out, (4, 4), prefix)  # the class token reads every patch equally
    torch.testing.assert_close(maps, torch.full((1, 4, 4), (1 - c) / T, dtype=torch.float64))


def test_rollout_matches_explicit_matrix_product():
    rng = np.random.default_rng(0)
    attns = [torch.from_numpy(rng.dirichlet(np.ones(6), size=(2, 3, 6))) for _ in range(4)]  # (B, H, T, T)
    expected = np.stack([np.eye(6)] * 2)
    for a in attns:
        m = a.numpy().mean(1) + np.eye(6)
        m = m / m.sum(-1, keepdims=True)
        expected = np.einsum("bij,bjk->bik", m, expected)
    np.testing.assert_allclose(attention_rollout(attns).numpy(), expected, rtol=1e-12)


# -- the memory-bounded walk equals the all-at-once computation -------------------------------------------
@pytest.mark.parametrize("overrides", [dict(), dict(pool="gap", class_token=False, img_size=(24, 32))])
def test_analyze_attention_matches_all_at_once(overrides):
    model = create_tiny(**overrides)
    x = torch.randn(5, 1, *model.cfg.img_hw)
    res = analyze_attention(model, x, batch_size=2, layer_maps=[0, -1])
    model.eval()
    with torch.no_grad():
        _, maps = model.forward_attention(x)  # every layer at once, from the model's own API
    prefix, grid, P = model.num_prefix_tokens, model.cfg.grid_size, model.cfg.patch_size
    assert res.grid == grid
    dist = torch.stack([mean_attention_distance(maps[i], grid, P, prefix) for i in range(len(maps))], dim=1)
    np.testing.assert_allclose(res.distance_per_image, dist.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res.mean_distance, dist.mean(0).numpy(), rtol=1e-5, atol=1e-6)
    roll = token_maps(attention_rollout([maps[i] for i in range(len(maps))]), grid, prefix)
    np.testing.assert_allclose(res.rollout, roll.float().numpy(), rtol=1e-4, atol=1e-6)
    assert sorted(res.layer_maps) == [0, len(maps) - 1]
    np.testing.assert_allclose(res.layer_maps[0], token_maps(maps[0], grid, prefix).numpy(), rtol=1e-4, atol=1e-6)
    assert res.mean_distance.shape == (model.cfg.depth, model.cfg.num_heads)
    assert (res.mean_distance > 0).all() and (res.mean_distance < res.uniform_distance * 2).all()


def test_reduced_batch_holds_no_attention_tensor():
    # what a batch leaves behind must own its memory: a view into a layer's (b, heads, T, T) maps would keep
    # every batch's attention alive (this once tripled the peak memory of a ViT-B/16 run)
    model = create_tiny().eval()
    x = torch.randn(4, 1, 28, 28)
    per_layer, roll, kept = reduce_batch(model, x, model.cfg.grid_size, keep_layers=[0, 2])[:3]
    assert per_layer.shape == (4, 3, 3) and roll.shape == (4, 7, 7) and sorted(kept) == [0, 2]
    for t in (per_layer, roll, *kept.values()):
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size()


def create_tiny(**overrides):
    cfg = dict(depth=3, img_size=28, patch_size=4, in_chans=1, num_classes=10, embed_dim=48, num_heads=3,
               mlp_dim=96)
    cfg.update(overrides)
    return perturb_(vitlab.create_model("ViT-Ti/16", **cfg), scale=0.5)


# -- patch-embedding PCA -------------------------------------------------------------------------------------
@pytest.mark.parametrize("chans", [1, 3])
def test_filter_pca_recovers_known_components(chans):
    rng = np.random.default_rng(0)
    D, P, K = 64, 4, 5
    dim = chans * P * P
    V = ortho_group.rvs(dim, random_state=1)[:, :K]  # (CPP, K) orthonormal directions
    Z = rng.standard_normal((D, K))
    Z, _ = np.linalg.qr(Z - Z.mean(0))  # centred, orthonormal coefficient columns
    sd = np.array([10.0, 6.0, 4.0, 2.0, 1.0])
    E = (Z * sd) @ V.T + rng.standard_normal(dim)  # plus a shared offset that PCA must remove
    res = filter_pca(E.reshape(D, chans, P, P), num_components=K)
    got = res.components.reshape(K, -1)
    for k in range(K):
        assert abs(got[k] @ V[:, k]) == pytest.approx(1.0, abs=1e-8)  # same direction up to sign
    np.testing.assert_allclose(res.explained_variance, sd**2 / (D - 1), rtol=1e-8)
    np.testing.assert_allclose(res.explained_variance_ratio, np.ones(K) * sd**2 / (sd**2).sum(), rtol=1e-8)
    imgs = components_to_images(res.components)
    assert imgs.shape == (K, P, P, chans) and imgs.min() == 0.0 and imgs.max() == 1.0


def test_filter_pca_of_a_model():
    model = vitlab.create_model("ViT-Ti/16", depth=1, img_size=32, patch_size=8)
    res = filter_pca(model, num_components=28)
    assert res.components.shape == (28, 3, 8, 8)
    norms = np.linalg.norm(res.components.reshape(28, -1), axis=1)
    np.testing.assert_allclose(norms, 1.0, rtol=1e-6)
    assert (np.diff(res.explained_variance) <= 0).all()


# -- position-embedding similarity --------------------------------------------------------------------------
def test_sincos_similarity_peaks_on_the_diagonal_and_falls_with_distance():
    gh, gw, D = 6, 9, 64  # a non-square grid
    table = sincos_2d(gh, gw, D).numpy()
    sim = pos_embed_similarity(table.reshape(gh, gw, D))
    assert sim.shape == (gh, gw, gh, gw)
    np.testing.assert_allclose(sim.reshape(gh * gw, -1), 1 - cdist(table, table, metric="cosine"), atol=1e-12)
    for i in range(gh):
        for j in range(gw):
            m = sim[i, j]
            assert m[i, j] == pytest.approx(1.0) and (np.delete(m.ravel(), i * gw + j) < 1 - 1e-6).all()
            for dj in range(1, min(4, gw - j)):  # falls along the row for the first patches
                assert m[i, j + dj] < m[i, j + dj - 1]
            for di in range(1, min(4, gh - i)):  # and along the column
                assert m[i + di, j] < m[i + di - 1, j]
    summary = similarity_by_distance(sim)
    assert summary["distance"][0] == 0 and summary["mean_similarity"][0] == pytest.approx(1.0)
    assert summary["correlation"] < -0.5


def test_position_embedding_grid_of_models():
    model = vitlab.create_model("ViT-Ti/16", depth=1, img_size=(32, 48), patch_size=8)
    grid = position_embedding_grid(model)
    assert grid.shape == (4, 6, 192)
    np.testing.assert_array_equal(grid.reshape(24, -1), model.pos_embed[0, 1:].detach().numpy())
    sincos = vitlab.create_model("ViT-Ti/16", depth=1, img_size=32, patch_size=8, pos_embed="sincos2d",
                                 pool="gap", class_token=False)
    np.testing.assert_allclose(position_embedding_grid(sincos).reshape(16, -1), sincos_2d(4, 4, 192).numpy())
    none = vitlab.create_model("ViT-Ti/16", depth=1, img_size=32, patch_size=8, pos_embed="none")
    with pytest.raises(ValueError, match="no position embeddings"):
        position_embedding_grid(none)
