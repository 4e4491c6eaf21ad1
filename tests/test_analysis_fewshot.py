"""Few-shot linear evaluation: closed-form ridge against scipy's least squares, and separable data."""

import numpy as np
import pytest
import scipy.linalg
import torch

import vitlab
from vitlab.analysis import draw_shots, extract_features, fewshot_evaluate, fit_ridge
from vitlab.analysis.fewshot import BIAS_FEATURE

from .conftest import perturb_


@pytest.mark.parametrize("n", [8, 40])  # fewer examples than features (dual form) and more (primal form)
def test_ridge_matches_augmented_least_squares(n):
    rng = np.random.default_rng(0)
    F, K, l2 = 12, 3, 2.5
    x = rng.standard_normal((n, F)) * 3 + 1
    y = rng.integers(0, K, n)
    clf = fit_ridge(x, y, K, l2)
    # independent reference: ridge as ordinary least squares on [A; sqrt(l2) I] against [Y; 0]
    a = (x - x.mean(0)) / (x.std(0) + 1e-5)
    a = np.concatenate([a, np.full((n, 1), BIAS_FEATURE)], axis=1)
    t = 2.0 * np.eye(K)[y] - 1.0
    aug_a = np.concatenate([a, np.sqrt(l2) * np.eye(F + 1)])
    aug_t = np.concatenate([t, np.zeros((F + 1, K))])
    w, *_ = scipy.linalg.lstsq(aug_a, aug_t)
    np.testing.assert_allclose(clf.weight, w, rtol=1e-7, atol=1e-9)
    np.testing.assert_array_equal(clf.predict(x), (a @ w).argmax(1))


def test_fewshot_reaches_100_percent_on_separable_features():
    rng = np.random.default_rng(1)
    K, F = 5, 32
    centres = rng.standard_normal((K, F)) * 5

    def sample(n):
        y = rng.integers(0, K, n)
        return centres[y] + rng.standard_normal((n, F)) * 0.3, y

    tr_x, tr_y = sample(500)
    te_x, te_y = sample(300)
    results = fewshot_evaluate(tr_x, tr_y, te_x, te_y, shots=(1, 5, 10), seeds=3)
    assert [r.shots for r in results] == [1, 5, 10]
    for r in results:
        assert r.accuracies.shape == (3,)
        assert r.mean == 1.0 and r.std == 0.0


def test_fewshot_is_at_chance_on_random_labels():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2000, 16))
    y = rng.integers(0, 4, 2000)
    (r,) = fewshot_evaluate(x[:1000], y[:1000], x[1000:], y[1000:], shots=(10,), seeds=5)
    assert abs(r.mean - 0.25) < 0.06 and r.std > 0


def test_draw_shots_is_per_class_and_without_replacement():
    labels = np.repeat(np.arange(4), 7)
    idx = draw_shots(labels, 5, 4, np.random.default_rng(0))
    assert len(set(idx.tolist())) == 20
    np.testing.assert_array_equal(np.bincount(labels[idx]), [5, 5, 5, 5])
    with pytest.raises(ValueError, match="class 0 has 7 training examples, fewer than 8 shots"):
        draw_shots(labels, 8, 4, np.random.default_rng(0))


def test_bad_inputs_are_named():
    x = np.zeros((4, 3))
    with pytest.raises(ValueError, match="labels must be in"):
        fit_ridge(x, np.array([0, 1, 2, 5]), 3)
    with pytest.raises(ValueError, match="differ in width"):
        fewshot_evaluate(x, np.array([0, 1, 0, 1]), np.zeros((2, 4)), np.array([0, 1]), shots=(1,))
    with pytest.raises(ValueError, match="shots must be positive"):
        fewshot_evaluate(x, np.array([0, 1, 0, 1]), x, np.array([0, 1, 0, 1]), shots=(0,))


@pytest.mark.parametrize("representation_size", [None, 24])
def test_extract_features_are_pre_logits(representation_size):
    model = perturb_(vitlab.create_model("ViT-Ti/16", depth=2, img_size=16, patch_size=4, in_chans=1, num_classes=3,
                                         embed_dim=32, num_heads=2, mlp_dim=64,
                                         representation_size=representation_size))
    x, y = torch.randn(6, 1, 16, 16), torch.arange(6) % 3
    feats, labels = extract_features(model, [(x[:4], y[:4]), (x[4:], y[4:])])
    assert feats.shape == (6, representation_size or 32)
    np.testing.assert_array_equal(labels, y.numpy())
    model.eval()
    with torch.no_grad():  # the head applied to these features gives the model's logits
        logits = model.head(torch.from_numpy(feats))
        torch.testing.assert_close(logits, model(x), rtol=1e-5, atol=1e-5)
