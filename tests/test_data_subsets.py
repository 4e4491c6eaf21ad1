"""The `digits` dataset (against scikit-learn's own copy), `data.classes`, `data.train_subset` and
`data.labels_per_class`: sizes, class balance, nesting, relabelling, and the errors for impossible requests."""

import sys

import numpy as np
import pytest

from vitlab.data import DataConfig, DataError, build_eval_data, build_train_stream, parse_data_spec
from vitlab.utils.extras import MissingExtraError

sklearn_datasets = pytest.importorskip("sklearn.datasets")


def _arrays(cfg: DataConfig, split: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The uint8 images and labels of a split, straight from the stream / eval data (no augmentation)."""
    if split == "train":
        s = build_train_stream(cfg, img_size=28, in_chans=1, batch_size=1, seed=0)
        return s.images.numpy(), s.labels.numpy(), s.classes
    e = build_eval_data(cfg, split, img_size=28, in_chans=1, batch_size=64)
    return e.images.numpy(), e.labels.numpy(), e.classes


def _keys(images: np.ndarray, labels: np.ndarray) -> list[bytes]:
    return sorted(img.tobytes() + bytes([int(y)]) for img, y in zip(images, labels))


def test_digits_is_scikit_learns_data_split_in_two():
    ref = sklearn_datasets.load_digits()
    train_x, train_y, classes = _arrays(DataConfig(dataset="digits"), "train")
    test_x, test_y, _ = _arrays(DataConfig(dataset="digits"), "test")
    assert classes == [str(i) for i in range(10)]
    assert train_x.shape == (1297, 1, 8, 8) and test_x.shape == (500, 1, 8, 8) and train_x.dtype == np.uint8
    # the two splits together are exactly scikit-learn's 1,797 images (16 levels scaled to 0..255) with their labels
    scaled = np.rint(ref.images * 255 / 16).astype(np.uint8)[:, None]
    assert _keys(np.concatenate([train_x, test_x]), np.concatenate([train_y, test_y])) == _keys(scaled, ref.target)
    assert scaled.max() == 255 and train_x.max() == 255
    # stratified: every class's share of the test split within one image of its share of the whole set
    for c in range(10):
        expected = 500 * (ref.target == c).sum() / len(ref.target)
        assert abs((test_y == c).sum() - expected) <= 1
    # fixed: a second load gives the same split
    again_x, again_y, _ = _arrays(DataConfig(dataset="digits"), "test")
    assert np.array_equal(again_x, test_x) and np.array_equal(again_y, test_y)
    assert parse_data_spec("digits").dataset == "digits"


def test_digits_batches_are_upsampled_to_the_model_size():
    s = build_train_stream(DataConfig(dataset="digits", hflip=False), img_size=32, in_chans=1, batch_size=8, seed=0)
    x, _ = next(iter(s))
    assert tuple(x.shape) == (8, 1, 32, 32) and float(x.min()) >= -1 and float(x.max()) <= 1


def test_classes_keep_and_relabel_in_the_given_order():
    base = DataConfig(dataset="synthetic", num_samples=600)
    names = _arrays(base, "test")[2]
    cfg = base.replace(classes=[7, 2, 5])
    for split in ("train", "test"):
        x, y, classes = _arrays(cfg, split)
        x_ref, y_ref, _ = _arrays(base, split)
        assert classes == [names[7], names[2], names[5]]
        for new, old in enumerate((7, 2, 5)):
            assert np.array_equal(x[y == new], x_ref[y_ref == old])  # same images, same order, new label
        assert set(np.unique(y)) == {0, 1, 2}


def test_train_subset_is_nested_stratified_and_only_on_train():
    base = DataConfig(dataset="synthetic", num_samples=3000, hflip=False)
    full_x, full_y, _ = _arrays(base, "train")
    subsets = {}
    for n in (100, 1000, 3000):
        x, y, _ = _arrays(base.replace(train_subset=n), "train")
        assert len(x) == n
        counts = np.bincount(y, minlength=10)
        share = np.bincount(full_y, minlength=10) * n / len(full_y)
        assert np.all(np.abs(counts - share) <= 1), (n, counts, share)
        subsets[n] = set(_keys(x, y))
    assert subsets[100] <= subsets[1000] <= subsets[3000] == set(_keys(full_x, full_y))
    other_x, other_y, _ = _arrays(base.replace(train_subset=100, subset_seed=1), "train")
    assert set(_keys(other_x, other_y)) != subsets[100]  # the seed matters
    # the test split is untouched
    assert len(_arrays(base.replace(train_subset=100), "test")[0]) == len(_arrays(base, "test")[0])


def test_labels_per_class_is_exact_and_nested():
    base = DataConfig(dataset="digits", classes=[0, 1, 2, 3, 4])
    seen: set[bytes] = set()
    for k in (1, 5, 10, 25):
        x, y, classes = _arrays(base.replace(labels_per_class=k), "train")
        assert classes == ["0", "1", "2", "3", "4"]
        assert np.array_equal(np.bincount(y, minlength=5), np.full(5, k))
        keys = set(_keys(x, y))
        assert seen <= keys
        seen = keys


def test_subset_with_val_holdout_draws_from_the_training_part():
    cfg = DataConfig(dataset="synthetic", num_samples=1000, val_fraction=0.1, train_subset=200)
    tx, ty, _ = _arrays(cfg, "train")
    vx, vy, _ = _arrays(cfg, "val")
    assert len(tx) == 200 and len(vx) == 100
    assert not set(_keys(tx, ty)) & set(_keys(vx, vy))


@pytest.mark.parametrize("overrides, match", [
    ({"train_subset": 2000}, r"train_subset=2000 but the training split has only 1297"),
    ({"labels_per_class": 200}, r"labels_per_class=200 but classes \[.*\] have only"),
    ({"classes": [0, 12]}, r"names classes \[12\] but the dataset has classes 0..9"),
])
def test_impossible_subsets_name_the_problem(overrides, match):
    with pytest.raises(DataError, match=match):
        build_train_stream(DataConfig(dataset="digits", **overrides), img_size=8, in_chans=1, batch_size=1, seed=0)


@pytest.mark.parametrize("overrides, match", [
    ({"classes": [3]}, "at least two class indices"),
    ({"classes": [1, 1]}, "lists a class twice"),
    ({"classes": [1, -2]}, r"data.classes\[1\] must be a class index"),
    ({"classes": "0,1"}, "data.classes must be a list"),
    ({"train_subset": 0}, "data.train_subset must be None or a positive int"),
    ({"labels_per_class": 2.5}, "data.labels_per_class must be None or a positive int"),
    ({"train_subset": 10, "labels_per_class": 1}, "choose one"),
    ({"subset_seed": -1}, "data.subset_seed must be an int >= 0"),
    ({"dataset": "imagefolder", "root": "/x", "train_subset": 10}, "in-memory datasets"),
])
def test_bad_subset_config_is_refused(overrides, match):
    with pytest.raises(ValueError, match=match):
        DataConfig(**{"dataset": "digits", **overrides})


def test_digits_without_scikit_learn_names_the_extra(monkeypatch):
    from vitlab.data import digits

    digits.load_digits_split.cache_clear()
    for name in [n for n in sys.modules if n == "sklearn" or n.startswith("sklearn.")] + ["sklearn"]:
        monkeypatch.setitem(sys.modules, name, None)
    try:
        with pytest.raises(MissingExtraError, match=r"pip install 'vitlab\[paper\]'"):
            build_eval_data(DataConfig(dataset="digits"), "test", img_size=8, in_chans=1, batch_size=8)
    finally:
        digits.load_digits_split.cache_clear()
