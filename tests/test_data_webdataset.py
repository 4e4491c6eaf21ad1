"""WebDataset shards written with webdataset.TarWriter: counting, one epoch visits every sample once, bad
samples skipped and reported, exact resume (with and without workers), ranks read disjoint shards."""

import io

import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image

from vitlab.data import BadImageError, BadImageWarning, DataConfig, build_eval_data, build_train_stream

SHARDS, PER_SHARD = 4, 8


def _png(value: int) -> bytes:
    buf = io.BytesIO()
    Image.new("L", (12, 10), color=value).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture
def shards(tmp_path):
    """Sample i of shard s is a flat grey image of value 7 * (s * PER_SHARD + i) with label s."""
    for s in range(SHARDS):
        with wds.TarWriter(str(tmp_path / f"train-{s:03d}.tar")) as w:
            for i in range(PER_SHARD):
                w.write({"__key__": f"s{s}_{i:03d}", "png": _png(7 * (s * PER_SHARD + i)), "cls": str(s)})
            if s == 1:
                w.write({"__key__": "s1_bad", "jpg": b"\xff\xd8 not a jpeg", "cls": "1"})
    with wds.TarWriter(str(tmp_path / "test-000.tar")) as w:
        for i in range(5):
            w.write({"__key__": f"t{i}", "png": _png(50 * i), "cls": str(i % SHARDS)})
    return tmp_path


def _cfg(root, **kw):
    base = dict(dataset="webdataset", root=str(root / "train-{000..003}.tar"), test_root=str(root / "test-000.tar"),
                inception_crop=False, hflip=False, shuffle_buffer=5)
    return DataConfig(**{**base, **kw})


def _ids(x):
    """Recover each flat image's id from its pixel value ([-1, 1] -> 0..255 -> id)."""
    return torch.round((x[:, 0, 0, 0] + 1) * 127.5 / 7).long().tolist()


@pytest.mark.filterwarnings("ignore::vitlab.data.BadImageWarning")
def test_epoch_visits_every_sample_once(shards):
    s = build_train_stream(_cfg(shards), img_size=8, in_chans=1, batch_size=8, seed=0)
    assert s.epoch_size == SHARDS * PER_SHARD + 1 and s.num_classes == SHARDS and s.steps_per_epoch == 4
    seen = []
    for _ in range(4):
        x, y = next(s)
        assert x.shape == (8, 1, 8, 8) and x.dtype == torch.float32
        ids = _ids(x)
        assert [i // PER_SHARD for i in ids] == y.tolist()  # labels travel with their images
        seen += ids
    assert sorted(seen) == list(range(SHARDS * PER_SHARD))
    assert s.report["num_skipped"] == 1 and "s1_bad" in s.report["skipped"][0]["path"]


def test_bad_sample_warns_or_raises(shards):
    s = build_train_stream(_cfg(shards), img_size=8, in_chans=1, batch_size=8, seed=0)
    with pytest.warns(BadImageWarning, match="s1_bad"):
        for _ in range(4):
            next(s)
    strict = build_train_stream(_cfg(shards, strict=True), img_size=8, in_chans=1, batch_size=8, seed=0)
    with pytest.raises(BadImageError, match="s1_bad"):
        for _ in range(4):
            next(strict)


@pytest.mark.filterwarnings("ignore::vitlab.data.BadImageWarning")
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_is_exact(shards, workers):
    cfg = _cfg(shards, inception_crop=True, hflip=True, num_workers=workers)
    kw = dict(img_size=8, in_chans=1, batch_size=4, seed=5)
    full = build_train_stream(cfg, **kw)
    ref = [next(full) for _ in range(11)]  # 8 steps per epoch: crosses into epoch 1
    for cut in (3, 8, 9):
        run = build_train_stream(cfg, **kw)
        for _ in range(cut):
            next(run)
        resumed = build_train_stream(cfg, **kw)
        resumed.load_state_dict(run.state_dict())
        for xr, yr in ref[cut:]:
            x, y = next(resumed)
            assert torch.equal(x, xr) and torch.equal(y, yr)


@pytest.mark.filterwarnings("ignore::vitlab.data.BadImageWarning")
def test_ranks_read_disjoint_shards(shards):
    ranks = [build_train_stream(_cfg(shards), img_size=8, in_chans=1, batch_size=4, seed=2, rank=r, world_size=2)
             for r in range(2)]
    assert ranks[0].steps_per_epoch == ranks[1].steps_per_epoch == 4
    labels = [set(), set()]
    for _ in range(4):
        for r in range(2):
            labels[r] |= set(next(ranks[r])[1].tolist())
    assert labels[0].isdisjoint(labels[1]) and labels[0] | labels[1] == set(range(SHARDS))
    with pytest.raises(ValueError, match="shards cannot feed"):
        build_train_stream(_cfg(shards, num_workers=3), img_size=8, in_chans=1, batch_size=4, seed=2, rank=0,
                           world_size=2)


def test_eval_reads_test_shards_in_order(shards):
    ev = build_eval_data(_cfg(shards), "test", img_size=(10, 12), in_chans=3, batch_size=2)
    assert ev.num_samples == 5 and len(ev) == 3 and ev.num_classes == SHARDS
    xs, ys = zip(*ev)
    x = torch.cat(xs)
    assert x.shape == (5, 3, 10, 12)
    np.testing.assert_allclose(x[:, 0, 0, 0].numpy(), np.arange(5) * 50 / 127.5 - 1, atol=1e-6)
    assert torch.cat(ys).tolist() == [0, 1, 2, 3, 0]
    with pytest.raises(ValueError, match="val_fraction"):
        build_train_stream(_cfg(shards, val_fraction=0.1), img_size=8, in_chans=1, batch_size=4, seed=0)
    with pytest.raises(FileNotFoundError, match=r"2 of 2 shards do not exist, e.g. '.*nope-0.tar'"):
        build_train_stream(_cfg(shards).replace(root=str(shards / "nope-{0..1}.tar")), img_size=8, in_chans=1,
                           batch_size=4, seed=0)
