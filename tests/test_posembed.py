"""Position-embedding resampling against the libraries each mode is named after, square and non-square grids:
"jax" vs scipy.ndimage.zoom(order=1) (Google's vit_jax), "bicubic" vs timm's resample_abs_pos_embed
(antialiased, so PIL's cubic a=-0.5, not transformers' plain bicubic a=-0.75), "bilinear" vs F.interpolate.
Tables are resampled in fp32, hence atol 1e-6 against float64 references."""

import numpy as np
import pytest
import scipy.ndimage
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from timm.layers import resample_abs_pos_embed as timm_resample

from vitlab.models.posembed import resample_pos_embed

D = 8
GRIDS = [((4, 4), (7, 7)), ((4, 4), (3, 3)), ((4, 4), (6, 9)), ((3, 5), (5, 4)), ((6, 2), (3, 7)), ((2, 2), (2, 5))]


def table(old, prefix=1):
    return torch.randn(1, prefix + old[0] * old[1], D, dtype=torch.float64)


@pytest.mark.parametrize(("old", "new"), GRIDS)
def test_jax_mode_is_scipy_zoom_order_1(old, new):
    pos = table(old)
    ours = resample_pos_embed(pos, new, old, num_prefix_tokens=1, mode="jax")
    grid = pos[0, 1:].reshape(*old, D).numpy()
    zoom = (new[0] / old[0], new[1] / old[1], 1)
    expected = scipy.ndimage.zoom(grid, zoom, order=1)
    assert expected.shape[:2] == tuple(new)
    torch.testing.assert_close(ours[0, 1:], torch.from_numpy(expected.reshape(-1, D)), atol=1e-6, rtol=0)
    assert torch.equal(ours[:, :1], pos[:, :1])  # the class token's row is kept


@pytest.mark.parametrize(("old", "new"), GRIDS)
@pytest.mark.parametrize("prefix", [0, 1])
def test_bicubic_mode_is_timm(old, new, prefix):
    pos = table(old, prefix).float()
    ours = resample_pos_embed(pos, new, old, num_prefix_tokens=prefix, mode="bicubic")
    theirs = timm_resample(pos, list(new), list(old), num_prefix_tokens=prefix)  # timm: bicubic, antialias
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)


@pytest.mark.parametrize(("old", "new"), GRIDS)
def test_bilinear_mode_is_interpolate_without_aligned_corners(old, new):
    pos = table(old)
    ours = resample_pos_embed(pos, new, old, num_prefix_tokens=1, mode="bilinear")
    grid = pos[:, 1:].reshape(1, *old, D).permute(0, 3, 1, 2)
    expected = F.interpolate(grid, size=new, mode="bilinear", align_corners=False).permute(0, 2, 3, 1)
    torch.testing.assert_close(ours[:, 1:], expected.reshape(1, -1, D), atol=1e-6, rtol=0)
    if new[0] >= old[0] and new[1] >= old[1]:  # and not the corner-aligned map of "jax"
        assert not torch.allclose(ours, resample_pos_embed(pos, new, old, 1, "jax"))


@settings(max_examples=25, deadline=None)
@given(gh=st.integers(1, 6), gw=st.integers(1, 6), nh=st.integers(1, 8), nw=st.integers(1, 8),
       mode=st.sampled_from(["jax", "bilinear", "bicubic"]))
def test_constant_tables_stay_constant(gh, gw, nh, nw, mode):
    """Every mode is an interpolation: a constant grid resamples to the same constant."""
    pos = torch.cat([torch.full((1, 1, D), 7.0), torch.full((1, gh * gw, D), 0.25)], dim=1)
    out = resample_pos_embed(pos, (nh, nw), (gh, gw), 1, mode)
    assert out.shape == (1, 1 + nh * nw, D)
    torch.testing.assert_close(out[:, 1:], torch.full((1, nh * nw, D), 0.25), atol=1e-6, rtol=0)
    assert torch.equal(out[:, :1], pos[:, :1])


def test_errors():
    with pytest.raises(ValueError, match="not a square grid"):
        resample_pos_embed(torch.zeros(1, 1 + 12, D), (4, 4))
    with pytest.raises(ValueError, match="does not fit grid"):
        resample_pos_embed(torch.zeros(1, 1 + 12, D), (4, 4), old_size=(3, 3))
    with pytest.raises(ValueError, match="resize mode"):
        resample_pos_embed(torch.zeros(1, 1 + 16, D), (5, 5), mode="nearest")
    assert np.isfinite(resample_pos_embed(torch.zeros(1, 17, D), (1, 1), mode="jax").numpy()).all()


# --- "dinov2" and "hf": DINOv2's and transformers' interpolate_pos_encoding ---------------------------------------


def _cubic(t: np.ndarray, a: float = -0.75) -> np.ndarray:
    """Keys' cubic convolution kernel with a = -0.75 (PyTorch's plain bicubic; OpenCV's)."""
    t = np.abs(t)
    return np.where(t <= 1, ((a + 2) * t - (a + 3)) * t * t + 1,
                    np.where(t < 2, ((a * t - 5 * a) * t + 8 * a) * t - 4 * a, 0.0))


def _bicubic_1d(n_in: int, n_out: int, cells: float) -> np.ndarray:
    """(n_out, n_in) matrix of plain bicubic resampling when the output grid spans `cells` output cells over the
    input (half-pixel centres, borders replicated): output i reads input (i + 0.5) * n_in / cells - 0.5."""
    m = np.zeros((n_out, n_in))
    for i in range(n_out):
        x = (i + 0.5) * n_in / cells - 0.5
        f = np.floor(x)
        for k in range(-1, 3):
            m[i, int(np.clip(f + k, 0, n_in - 1))] += _cubic(x - (f + k))
    return m


def _dinov2_reference(pos: torch.Tensor, old: tuple[int, int], new: tuple[int, int]) -> torch.Tensor:
    """DINOv2's interpolate_pos_encoding (interpolate_offset 0.1, no antialias) written out in float64 from its
    definition: F.interpolate(scale_factor=(n' + 0.1) / n) places outputs as on a grid of n' + 0.1 cells."""
    grid = pos[0, 1:].reshape(*old, D).double().numpy()
    rows, cols = _bicubic_1d(old[0], new[0], new[0] + 0.1), _bicubic_1d(old[1], new[1], new[1] + 0.1)
    out = np.einsum("ih,jw,hwd->ijd", rows, cols, grid)
    return torch.cat([pos[:, :1].double(), torch.from_numpy(out.reshape(1, -1, D))], dim=1)


@pytest.mark.parametrize(("old", "new"), GRIDS)
def test_dinov2_mode_is_interpolate_offset_formula(old, new):
    pos = table(old).float()
    ours = resample_pos_embed(pos, new, old, num_prefix_tokens=1, mode="dinov2")
    torch.testing.assert_close(ours.double(), _dinov2_reference(pos, old, new), atol=1e-5, rtol=0)
    assert torch.equal(ours[:, :1], pos[:, :1])
    # the offset moves the samples: not transformers' plain bicubic to the same size, nor timm's antialiased one
    assert not torch.allclose(ours, resample_pos_embed(pos, new, old, 1, "hf"), atol=1e-3)
    assert not torch.allclose(ours, resample_pos_embed(pos, new, old, 1, "bicubic"), atol=1e-3)


def test_dinov2_mode_is_upstream_call():
    """The call facebookresearch/dinov2's DinoVisionTransformer.interpolate_pos_encoding makes on a square table
    (M x M to w0 x h0 with scale_factor ((w0 + 0.1) / M, (h0 + 0.1) / M), bicubic, antialias False)."""
    m, dim = 5, D
    pos = torch.randn(1, 1 + m * m, dim)
    for w0, h0 in ((7, 7), (3, 8), (37, 37), (4, 2)):
        patch = pos[:, 1:].reshape(1, m, m, dim).permute(0, 3, 1, 2)
        theirs = F.interpolate(patch, mode="bicubic", antialias=False,
                               scale_factor=((w0 + 0.1) / m, (h0 + 0.1) / m)).permute(0, 2, 3, 1).reshape(1, -1, dim)
        ours = resample_pos_embed(pos, (w0, h0), (m, m), num_prefix_tokens=1, mode="dinov2")
        assert torch.equal(ours[:, 1:], theirs)


def _hf_embeddings(kind: str, grid: int, dim: int):
    """transformers' Dinov2Embeddings / ViTEmbeddings with a random position table on a grid x grid patch grid."""
    if kind == "dinov2":
        from transformers import Dinov2Config
        from transformers.models.dinov2.modeling_dinov2 import Dinov2Embeddings
        emb = Dinov2Embeddings(Dinov2Config(hidden_size=dim, patch_size=2, image_size=2 * grid, num_channels=3))
    else:
        from transformers import ViTConfig
        from transformers.models.vit.modeling_vit import ViTEmbeddings
        emb = ViTEmbeddings(ViTConfig(hidden_size=dim, patch_size=2, image_size=2 * grid, num_channels=3))
    with torch.no_grad():
        emb.position_embeddings.normal_()
    return emb


@pytest.mark.parametrize("kind", ["dinov2", "vit"])
@pytest.mark.parametrize(("old", "new"), [(4, (7, 7)), (4, (3, 3)), (4, (6, 9)), (5, (2, 5)), (3, (5, 4))])
def test_hf_mode_is_transformers_interpolate_pos_encoding(kind, old, new):
    emb = _hf_embeddings(kind, old, D)
    tokens = torch.zeros(1, 1 + new[0] * new[1], D)
    with torch.no_grad():
        theirs = emb.interpolate_pos_encoding(tokens, 2 * new[0], 2 * new[1])
    pos = emb.position_embeddings.detach()
    ours = resample_pos_embed(pos, new, (old, old), num_prefix_tokens=1, mode="hf")
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
    if (old, old) != new:  # plain bicubic: not timm's antialiased kernel, not DINOv2's offset grid
        assert not torch.allclose(ours, resample_pos_embed(pos, new, (old, old), 1, "bicubic"), atol=1e-3)
        assert not torch.allclose(ours, resample_pos_embed(pos, new, (old, old), 1, "dinov2"), atol=1e-3)


@pytest.mark.parametrize("mode", ["dinov2", "hf"])
def test_new_modes_keep_constants_and_same_grid(mode):
    pos = torch.cat([torch.full((1, 1, D), 7.0), torch.full((1, 12, D), 0.25)], dim=1)
    out = resample_pos_embed(pos, (5, 7), (3, 4), 1, mode)
    torch.testing.assert_close(out[:, 1:], torch.full((1, 35, D), 0.25), atol=1e-6, rtol=0)
    same = table((3, 4)).float()
    assert resample_pos_embed(same, (3, 4), (3, 4), 1, mode) is same  # DINOv2 and transformers: table unchanged
