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
