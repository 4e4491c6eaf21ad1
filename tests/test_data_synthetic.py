"""The `synthetic` dataset the plumbing tests train on: Fashion-MNIST's shapes, dtypes, sizes and class balance,
the same bytes on every call, and learnable (so "the loss falls" still means something) but not trivially."""

from __future__ import annotations

import numpy as np
import pytest

from vitlab.data import DataConfig, build_eval_data, parse_data_spec
from vitlab.data.synthetic import SYNTHETIC_CLASSES, load_synthetic


def test_shapes_sizes_and_balance_are_fashion_mnists():
    for split, n in (("train", 60_000), ("test", 10_000)):
        d = load_synthetic(split)
        assert d.images.shape == (n, 1, 28, 28) and d.images.dtype == np.uint8
        assert d.labels.shape == (n,) and d.labels.dtype == np.int64
        assert np.bincount(d.labels).tolist() == [n // 10] * 10 and d.classes == list(SYNTHETIC_CLASSES)
        assert d.images.min() == 0 and d.images.max() == 255  # the whole uint8 range is used
    small = load_synthetic("train", 500)
    assert len(small) == 500 and len(load_synthetic("test", 500)) == 83
    with pytest.raises(ValueError, match="split"):
        load_synthetic("val")


def test_same_bytes_every_time_and_splits_differ():
    a = load_synthetic("test")
    load_synthetic.cache_clear()
    b = load_synthetic("test")
    assert a is not b and np.array_equal(a.images, b.images) and np.array_equal(a.labels, b.labels)
    assert not np.array_equal(load_synthetic("train").images[:100], a.images[:100])


def test_recipes_and_the_cli_name_it_without_a_root():
    assert DataConfig(dataset="synthetic").root is None
    assert parse_data_spec("synthetic") == DataConfig(dataset="synthetic")
    ev = build_eval_data(DataConfig(dataset="synthetic"), "test", img_size=28, in_chans=1, batch_size=1000)
    assert ev.num_samples == 10_000 and ev.num_classes == 10


def test_learnable_but_not_trivial():
    """Class means of the training images classify most test images (signal), yet images of one class differ
    from one another about as much as from other classes' means (noise, shifts, contrast)."""
    train, test = load_synthetic("train", 6000), load_synthetic("test")
    x_tr = train.images.reshape(len(train), -1).astype(np.float32) / 255
    x_te = test.images.reshape(len(test), -1).astype(np.float32) / 255
    means = np.stack([x_tr[train.labels == c].mean(0) for c in range(10)])
    d = ((x_te[:, None, :] - means[None]) ** 2).sum(-1)  # (N, 10) squared distances
    acc = (d.argmin(1) == test.labels).mean()
    assert 0.7 < acc < 1.0, acc
    same = np.linalg.norm(x_tr[train.labels == 0][:50] - x_tr[train.labels == 0][50:100], axis=1).mean()
    assert same > 3.0  # two images of one class are far apart pixel-wise (28 px images, values in [0, 1])


@pytest.mark.slow
def test_loss_falls_on_synthetic(tmp_path):
    from vitlab.train import Recipe, train

    losses: list[float] = []
    r = Recipe.from_dict({
        "model": {"name": "ViT-Ti/16", "embed_dim": 64, "depth": 2, "num_heads": 2, "mlp_dim": 128, "img_size": 28,
                  "patch_size": 7, "in_chans": 1},
        "data": {"dataset": "synthetic", "inception_crop": False},
        "optim": {"name": "adamw", "lr": 3e-3, "weight_decay": 0.05, "clip_grad_norm": 1.0},
        "schedule": {"name": "cosine", "warmup_steps": 2},
        "train": {"batch_size": 64, "steps": 40, "precision": "fp32", "log_every": 1,
                  "evaluators": {"eval": {"type": "classification", "batch_size": 500, "max_samples": 1000}}},
    })
    summary = train(r, tmp_path / "run", progress=False, on_step=lambda step, res: losses.append(res.loss))
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert first > 2.0 and last < first - 0.5, (first, last)
    assert summary["eval"]["top1"] > 0.4  # chance is 10%
