"""Random erasing on whole batches: the box distribution against torchvision's v2.RandomErasing rule, the fill
against closed forms, and the stream guarantees (rank slices, resume, other draws untouched)."""

import numpy as np
import pytest
import torch
import torchvision.transforms.v2 as T

from vitlab.data import DataConfig, build_train_stream
from vitlab.data.batch_erasing import erase_batch, sample_erase_boxes
from vitlab.data.images import train_transform


def _torchvision_boxes(n, height, width, scale, ratio):
    """n draws of torchvision's own rule (p=1), as (n, 4) top, left, h, w; h = w = 0 where nothing fits."""
    op = T.RandomErasing(p=1.0, scale=scale, ratio=ratio, value="random")
    img = torch.zeros(1, height, width)
    out = []
    torch.manual_seed(0)
    for _ in range(n):
        prm = op.make_params([img])
        out.append((prm["i"], prm["j"], prm["h"], prm["w"]) if prm["v"] is not None else (0, 0, 0, 0))
    return np.array(out)


def _close(a, b, what):
    """Means of two samples agree within 4.5 standard errors of their difference."""
    se = np.sqrt(a.var() / len(a) + b.var() / len(b))
    assert abs(a.mean() - b.mean()) < 4.5 * se + 1e-9, f"{what}: ours {a.mean():.4f} vs torchvision {b.mean():.4f}"


@pytest.mark.parametrize("height,width,scale,ratio",
                         [(32, 24, (0.02, 0.4), (0.3, 3.3)), (7, 7, (0.1, 0.6), (0.5, 2.0))])
def test_boxes_follow_torchvision_rule(height, width, scale, ratio):
    ours = sample_erase_boxes(np.random.default_rng(0), 40000, height, width, 1.0, scale, ratio)
    ref = _torchvision_boxes(2000, height, width, scale, ratio)
    for boxes in (ours, ref):
        top, left, h, w = boxes.T
        assert (top >= 0).all() and (left >= 0).all() and (top + h <= height).all() and (left + w <= width).all()
        assert ((h > 0) == (w > 0)).all() and (h < height).all() and (w < width).all()
    _close((ours[:, 2] > 0).astype(float), (ref[:, 2] > 0).astype(float), "fraction erased")
    a, b = ours[ours[:, 2] > 0], ref[ref[:, 2] > 0]
    _close(a[:, 2] * a[:, 3] / (height * width), b[:, 2] * b[:, 3] / (height * width), "area fraction")
    _close(np.log(a[:, 2] / a[:, 3]), np.log(b[:, 2] / b[:, 3]), "log aspect ratio")
    _close(a[:, 0] + a[:, 2] / 2, b[:, 0] + b[:, 2] / 2, "vertical centre")
    _close(a[:, 1] + a[:, 3] / 2, b[:, 1] + b[:, 3] / 2, "horizontal centre")


def test_probability_and_boxes_that_never_fit():
    boxes = sample_erase_boxes(np.random.default_rng(1), 20000, 56, 56, 0.25, (0.02, 0.33), (0.3, 3.3))
    frac = (boxes[:, 2] > 0).mean()
    assert abs(frac - 0.25) < 4.5 * np.sqrt(0.25 * 0.75 / 20000)
    # on a 4x4 image no box of 90-99% of the area has both sides below 4: torchvision then leaves the image
    # alone, and so do we
    assert (_torchvision_boxes(50, 4, 4, (0.9, 0.99), (0.3, 3.3)) == 0).all()
    assert (sample_erase_boxes(np.random.default_rng(2), 500, 4, 4, 1.0, (0.9, 0.99), (0.3, 3.3)) == 0).all()
    assert (sample_erase_boxes(np.random.default_rng(3), 500, 28, 28, 0.0, (0.02, 0.33), (0.3, 3.3)) == 0).all()


def test_fill_is_exactly_the_box():
    x = torch.rand(3, 2, 10, 12)
    boxes = np.array([[1, 2, 3, 4], [0, 0, 0, 0], [5, 0, 5, 12 - 1]])
    zero = erase_batch(x.clone(), boxes, "zero", (0, 0, 0), 0)
    expect = x.clone()
    expect[0, :, 1:4, 2:6] = 0
    expect[2, :, 5:10, 0:11] = 0
    assert torch.equal(zero, expect)

    noise = erase_batch(x.clone(), boxes, "random", (5, 1, 2), 0)
    inside = torch.zeros_like(x, dtype=torch.bool)
    inside[0, :, 1:4, 2:6] = True
    inside[2, :, 5:10, 0:11] = True
    assert torch.equal(noise[~inside], x[~inside])  # nothing outside the boxes changes
    assert (noise[inside] != x[inside]).all()
    # the same (seeds, global index) gives the same noise; a slice that starts later draws its own images' noise
    again = erase_batch(x.clone(), boxes, "random", (5, 1, 2), 0)
    assert torch.equal(noise, again)
    shifted = erase_batch(x[2:].clone(), boxes[2:], "random", (5, 1, 2), 2)
    assert torch.equal(shifted, noise[2:])
    with pytest.raises(ValueError, match="erasing_value"):
        erase_batch(x.clone(), boxes, "mean", (0, 0, 0), 0)


def test_random_fill_is_standard_normal():
    x = torch.zeros(64, 1, 56, 56)
    boxes = np.tile([0, 0, 40, 40], (64, 1))
    v = erase_batch(x, boxes, "random", (0, 0, 0), 0)[:, :, :40, :40].flatten()
    # 102,400 draws: the sample mean is within 5e-3 * 4.5 of 0, the std within 1% of 1
    assert abs(v.mean().item()) < 0.015 and abs(v.std().item() - 1) < 0.01


def _stream(cfg, **kw):
    return build_train_stream(cfg, **{**dict(img_size=32, in_chans=1, batch_size=64, seed=3), **kw})


def test_stream_erases_only_and_keeps_other_draws():
    base = DataConfig(dataset="synthetic", val_fraction=0.99, crop_scale=(0.5, 1.0))
    plain, erased = _stream(base), _stream(base.replace(random_erasing=0.5, erasing_value="zero"))
    changed = []
    for _ in range(10):
        (xa, ya), (xb, yb) = next(plain), next(erased)
        assert torch.equal(ya, yb)
        diff = xa != xb  # (B, 1, 32, 32)
        hit = diff.flatten(1).any(1)
        changed.append(hit)
        for i in hit.nonzero().flatten().tolist():  # what changed is a rectangle set to zero
            rows, cols = diff[i, 0].any(1).nonzero().flatten(), diff[i, 0].any(0).nonzero().flatten()
            box = xb[i, 0, rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
            assert (box == 0).all()
    frac = torch.cat(changed).float().mean().item()
    assert 0.38 < frac < 0.6  # p = 0.5 (a box over pixels already at 0 changes nothing: rare)


def test_stream_rank_slices_and_resume():
    cfg = DataConfig(dataset="synthetic", val_fraction=0.99, random_erasing=0.7)
    single = _stream(cfg, batch_size=8)
    ranks = [_stream(cfg, batch_size=4, rank=r, world_size=2) for r in range(2)]
    for _ in range(4):
        x, _ = next(single)
        assert torch.equal(torch.cat([next(r)[0] for r in ranks]), x)
    state = single.state_dict()
    later = [next(single)[0] for _ in range(3)]
    resumed = _stream(cfg, batch_size=8)
    resumed.load_state_dict(state)
    for x in later:
        assert torch.equal(next(resumed)[0], x)


@pytest.mark.parametrize("key,value,match", [
    ("random_erasing", 1.5, "random_erasing"), ("random_erasing", True, "random_erasing"),
    ("erasing_scale", (0.4, 0.2), "erasing_scale"), ("erasing_scale", (0.1, 1.0), "erasing_scale"),
    ("erasing_ratio", (0.0, 2.0), "erasing_ratio"), ("erasing_value", "mean", "erasing_value"),
])
def test_config_errors_name_the_field(key, value, match):
    with pytest.raises(ValueError, match=match):
        DataConfig(**{key: value})


def test_config_round_trip_through_yaml_lists():
    cfg = DataConfig(random_erasing=0.25, erasing_scale=(0.05, 0.2))
    d = cfg.to_dict()
    assert d["erasing_scale"] == [0.05, 0.2] and d["erasing_ratio"] == [0.3, 3.3]
    assert DataConfig.from_dict(d) == cfg and DataConfig.from_dict(d).erasing_scale == (0.05, 0.2)


def test_file_pipeline_uses_torchvision_random_erasing():
    cfg = DataConfig(dataset="imagefolder", root="/nonexistent", inception_crop=False, hflip=False,
                     random_erasing=1.0, erasing_value="zero", erasing_scale=(0.1, 0.3))
    tf = train_transform(cfg, 40, 3)
    assert isinstance(tf.transforms[-1], T.RandomErasing)
    white = torch.full((3, 40, 40), 255, dtype=torch.uint8)  # normalised to 1.0 everywhere
    torch.manual_seed(0)
    for _ in range(20):
        out = tf(white)
        zero = out[0] == 0
        rows, cols = zero.any(1).nonzero().flatten(), zero.any(0).nonzero().flatten()
        h, w = len(rows), len(cols)
        assert zero.sum() == h * w and 0.1 * 1600 - 40 <= h * w <= 0.3 * 1600 + 40  # one rectangle, in scale
        assert (out[:, ~zero] == 1).all()
    off = train_transform(cfg.replace(random_erasing=0.0), 40, 3)
    assert not any(isinstance(t, T.RandomErasing) for t in off.transforms)
