"""In-memory datasets: IDX parsing, the batch augmentation against closed forms and torchvision, resume
determinism, rank splitting, hold-out split, configuration errors."""

import gzip
import os
import struct

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms.v2 as T
import torchvision.transforms.v2.functional as TF
from hypothesis import given, settings
from hypothesis import strategies as st
from torchvision.datasets.mnist import read_sn3_pascalvincent_tensor

from vitlab.data import DataConfig, build_eval_data, build_train_stream, parse_data_spec
from vitlab.data.arrays import stratified_holdout
from vitlab.data.batch_augment import (
    center_crop_batch,
    full_boxes,
    normalize_255,
    resized_crop_batch,
    sample_crop_boxes,
)
from vitlab.data.idx import read_idx
from vitlab.data.images import eval_transform

# ---------------------------------------------------------------------------------------------- IDX format


def _idx_bytes(type_byte: int, shape: tuple[int, ...], payload: bytes) -> bytes:
    # Written by hand from the format description: 0, 0, type, ndim, big-endian uint32 sizes, data.
    return bytes([0, 0, type_byte, len(shape)]) + b"".join(struct.pack(">I", s) for s in shape) + payload


def test_idx_handwritten_plain_and_gzip(tmp_path):
    images = bytes(range(2 * 3 * 4))  # 2 images of 3x4, values 0..23
    plain = tmp_path / "imgs-idx3-ubyte"
    plain.write_bytes(_idx_bytes(0x08, (2, 3, 4), images))
    gz = tmp_path / "imgs.bin"  # gzip recognised by magic bytes, not by the name
    gz.write_bytes(gzip.compress(_idx_bytes(0x08, (2, 3, 4), images)))
    expected = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    np.testing.assert_array_equal(read_idx(str(plain)), expected)
    np.testing.assert_array_equal(read_idx(str(gz)), expected)

    ints = tmp_path / "ints-idx1"
    ints.write_bytes(_idx_bytes(0x0C, (3,), struct.pack(">iii", -1, 258, 70000)))
    a = read_idx(str(ints))
    assert a.dtype == np.int32 and a.tolist() == [-1, 258, 70000]
    floats = tmp_path / "f-idx2"
    floats.write_bytes(_idx_bytes(0x0D, (1, 2), struct.pack(">ff", 1.5, -2.25)))
    assert read_idx(str(floats)).tolist() == [[1.5, -2.25]]


def test_idx_errors_name_the_file(tmp_path):
    trunc = tmp_path / "trunc-idx3"
    trunc.write_bytes(_idx_bytes(0x08, (2, 3, 4), bytes(23)))
    with pytest.raises(ValueError, match=r"trunc-idx3.*truncated"):
        read_idx(str(trunc))
    extra = tmp_path / "extra"
    extra.write_bytes(_idx_bytes(0x08, (2,), bytes(3)))
    with pytest.raises(ValueError, match="trailing"):
        read_idx(str(extra))
    bad = tmp_path / "notidx.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(ValueError, match=r"notidx.png.*not an IDX"):
        read_idx(str(bad))
    badgz = tmp_path / "bad.gz"
    badgz.write_bytes(gzip.compress(_idx_bytes(0x08, (4,), bytes(4)))[:-6])
    with pytest.raises(ValueError, match=r"bad.gz.*gzip"):
        read_idx(str(badgz))


def _gunzip(path):
    with gzip.open(path, "rb") as f:
        return f.read()


def test_fashion_mnist_real_files(fmnist_root, tmp_path):
    for name, n in (("train", 60000), ("t10k", 10000)):
        ours = read_idx(os.path.join(fmnist_root, f"{name}-labels-idx1-ubyte.gz"))
        assert ours.shape == (n,)
        # torchvision's own IDX reader on the decompressed file is the independent reference
        raw = tmp_path / f"{name}-labels"
        raw.write_bytes(_gunzip(os.path.join(fmnist_root, f"{name}-labels-idx1-ubyte.gz")))
        np.testing.assert_array_equal(ours, read_sn3_pascalvincent_tensor(str(raw)).numpy())
    imgs = tmp_path / "t10k-images"
    imgs.write_bytes(_gunzip(os.path.join(fmnist_root, "t10k-images-idx3-ubyte.gz")))
    np.testing.assert_array_equal(
        read_idx(os.path.join(fmnist_root, "t10k-images-idx3-ubyte.gz")), read_sn3_pascalvincent_tensor(str(imgs))
    )

    cfg = DataConfig()
    train = build_train_stream(cfg, img_size=28, in_chans=1, batch_size=100, seed=0)
    test = build_eval_data(cfg, "test", img_size=28, in_chans=1, batch_size=1000)
    assert train.epoch_size == 60000 and test.num_samples == 10000 and len(test) == 10
    assert train.num_classes == test.num_classes == 10
    assert train.classes[0] == "T-shirt/top" and train.classes[9] == "Ankle boot"
    # The first labels of the published files (Xiao et al. 2017; github.com/zalandoresearch/fashion-mnist)
    assert read_idx(os.path.join(fmnist_root, "train-labels-idx1-ubyte.gz"))[:10].tolist() == [
        9, 0, 0, 3, 0, 2, 7, 2, 5, 5,
    ]  # fmt: skip
    x, y = next(iter(test))
    assert y[:10].tolist() == [9, 2, 1, 1, 6, 1, 4, 6, 5, 7]
    assert x.shape == (1000, 1, 28, 28) and x.dtype == torch.float32
    # eval at the native size is exactly the normalised pixels
    torch.testing.assert_close(x, torch.from_numpy(read_idx(str(imgs))[:1000, None]).float() / 127.5 - 1)


def test_holdout_split():
    cfg = DataConfig(dataset="synthetic", val_fraction=0.02)
    val = build_eval_data(cfg, "val", img_size=28, in_chans=1, batch_size=600)
    train = build_train_stream(cfg, img_size=28, in_chans=1, batch_size=100, seed=0)
    assert val.num_samples == 1200 and train.epoch_size == 58800  # 2% of each class of 6000
    labels = torch.cat([y for _, y in val])
    assert torch.bincount(labels).tolist() == [120] * 10
    with pytest.raises(ValueError, match="val_fraction"):
        build_eval_data(DataConfig(dataset="synthetic"), "val", img_size=28, in_chans=1, batch_size=10)


def test_stratified_holdout_properties():
    labels = np.repeat(np.arange(5), [10, 20, 30, 1, 50])
    tr, va = stratified_holdout(labels, 0.1, seed=0)
    assert len(np.intersect1d(tr, va)) == 0 and len(tr) + len(va) == len(labels)
    assert np.bincount(labels[va], minlength=5).tolist() == [1, 2, 3, 0, 5]
    _, va2 = stratified_holdout(labels, 0.1, seed=0)
    np.testing.assert_array_equal(va, va2)
    assert not np.array_equal(va, stratified_holdout(labels, 0.1, seed=1)[1])


# ------------------------------------------------------------------------------- augmentation, closed forms


def test_full_crop_equals_interpolate_and_flip_equals_torch_flip():
    x = torch.rand(4, 3, 28, 28) * 255
    for out in ((28, 28), (56, 56), (48, 32), (14, 14)):
        plain = resized_crop_batch(x, full_boxes(4, 28, 28), out)
        ref = F.interpolate(x, size=out, mode="bilinear", align_corners=False)
        torch.testing.assert_close(plain, ref, atol=1e-3, rtol=1e-5)
        flipped = resized_crop_batch(x, full_boxes(4, 28, 28), out, flip=torch.tensor([True, False, True, False]))
        torch.testing.assert_close(flipped[0::2], torch.flip(ref[0::2], dims=[-1]), atol=1e-3, rtol=1e-5)
        torch.testing.assert_close(flipped[1::2], ref[1::2], atol=1e-3, rtol=1e-5)
    same = resized_crop_batch(x, full_boxes(4, 28, 28), (28, 28))
    torch.testing.assert_close(same, x, atol=1e-3, rtol=1e-5)  # identity


def test_random_crops_equal_torchvision_resized_crop():
    rng = np.random.default_rng(0)
    x = torch.randint(0, 256, (32, 3, 24, 30), dtype=torch.uint8)
    boxes = sample_crop_boxes(rng, 32, 24, 30, (0.08, 1.0), (3 / 4, 4 / 3))
    flip = torch.from_numpy(rng.random(32) < 0.5)
    for out in ((24, 30), (48, 48), (12, 10)):
        ours = resized_crop_batch(x, boxes, out, flip)
        for i in range(32):
            top, left, h, w = boxes[i].tolist()
            ref = TF.resized_crop(x[i].float(), top, left, h, w, list(out), antialias=False)
            ref = torch.flip(ref, dims=[-1]) if flip[i] else ref
            torch.testing.assert_close(ours[i], ref, atol=2e-3, rtol=1e-5)


def test_antialiased_downsample_equals_torchvision_resize_and_crops_come_close():
    x = torch.randint(0, 256, (6, 1, 28, 28), dtype=torch.uint8)
    flip = torch.tensor([True, False, True, False, False, True])
    for out in ((16, 16), (14, 20), (12, 12)):
        ours = resized_crop_batch(x, full_boxes(6, 28, 28), out, flip, antialias=True)
        ref = TF.resize(x.float(), list(out), antialias=True)  # torchvision's Resize
        ref = torch.where(flip[:, None, None, None], torch.flip(ref, dims=[-1]), ref)
        torch.testing.assert_close(ours, ref, atol=1e-3, rtol=1e-5)
        aliased = resized_crop_batch(x, full_boxes(6, 28, 28), out, flip)
        assert (aliased - ref).abs().mean() > 5  # without antialiasing it is a different (sampled) image
    # crops that all shrink: the batch pre-shrink lands near torchvision's per-image antialiased resized_crop,
    # far nearer than the plain bilinear sample
    rng = np.random.default_rng(0)
    boxes = sample_crop_boxes(rng, 6, 28, 28, (0.6, 1.0), (0.8, 1.25))
    ours = resized_crop_batch(x, boxes, (12, 12), antialias=True)
    plain = resized_crop_batch(x, boxes, (12, 12))
    ref = torch.stack([TF.resized_crop(x[i].float(), *boxes[i].tolist(), [12, 12], antialias=True) for i in range(6)])
    assert (ours - ref).abs().mean() < 0.5 * (plain - ref).abs().mean()
    # upsampling is untouched
    torch.testing.assert_close(resized_crop_batch(x, boxes, (40, 40), antialias=True),
                               resized_crop_batch(x, boxes, (40, 40)))


def test_center_crop_eval_equals_torchvision_resize_then_center_crop():
    # the in-memory eval "center_crop" must be what file datasets get image by image (Resize + CenterCrop)
    from vitlab.data.synthetic import load_synthetic

    cfg = DataConfig(dataset="synthetic", eval_resize="center_crop", eval_crop_fraction=0.875)
    ev = build_eval_data(cfg, "test", img_size=56, in_chans=1, batch_size=64)
    x, _ = next(iter(ev))  # (64, 1, 56, 56)
    raw = torch.from_numpy(load_synthetic("test").images[:64])
    tf = eval_transform(56, 1, normalize="inception", resize="center_crop", crop_fraction=0.875)
    ref = torch.stack([tf(img) for img in raw])
    grey_level = 1.01 / 127.5  # torchvision resizes uint8 to uint8; a geometry error would differ by far more
    torch.testing.assert_close(x, ref, atol=grey_level, rtol=0)
    # the crop is real: it differs from the plain resize of the whole image
    plain, _ = next(iter(build_eval_data(cfg.replace(eval_resize="resize"), "test", img_size=56, in_chans=1,
                                         batch_size=64)))
    assert (x - plain).abs().max() > 0.5
    # any shapes and fractions (upsampling, where torchvision's antialiasing does nothing)
    imgs = torch.randint(0, 256, (3, 3, 20, 26), dtype=torch.uint8)
    for out, frac in (((40, 40), 0.9), ((32, 48), 0.8), ((26, 30), 1.0), ((50, 36), 0.95)):
        tf = eval_transform(out, 3, normalize="inception", resize="center_crop", crop_fraction=frac)
        ref = torch.stack([tf(img) for img in imgs])
        ours = normalize_255(center_crop_batch(imgs, out, frac), "inception")
        torch.testing.assert_close(ours, ref, atol=grey_level, rtol=0)
    with pytest.raises(ValueError, match="crop_fraction"):
        center_crop_batch(imgs, (20, 20), 0.0)


def test_crop_boxes_follow_the_distribution():
    boxes = sample_crop_boxes(np.random.default_rng(1), 20000, 100, 100, (0.08, 1.0), (3 / 4, 4 / 3))
    top, left, h, w = boxes.T.numpy()
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= 100).all() and (left + w <= 100).all()
    area = h * w / 1e4
    # area ~ U(0.08, 1) restricted to boxes that fit: the mean is a bit below 0.54; never below 0.07
    assert area.min() > 0.07 and 0.45 < area.mean() < 0.56
    ratio = w / h
    assert np.quantile(ratio, 0.01) > 0.7 and np.quantile(ratio, 0.99) < 1.4
    one = sample_crop_boxes(np.random.default_rng(1), 100, 28, 28, (1.0, 1.0), (1.0, 1.0))
    assert (one == torch.tensor([0, 0, 28, 28])).all()


def test_normalisation_ranges():
    x = torch.tensor([0, 255, 128], dtype=torch.uint8).view(1, 3, 1, 1).expand(2, 3, 4, 4)
    inc = normalize_255(x, "inception")
    assert inc.min() == -1 and inc.max() == 1 and inc.dtype == torch.float32
    ref = T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))(x.float() / 255)
    torch.testing.assert_close(normalize_255(x, "imagenet"), ref)


# ------------------------------------------------------------------------------- streams: resume, ranks


def _take(stream, n):
    return [next(stream) for _ in range(n)]


def _assert_batches_equal(a, b):
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.parametrize("randaugment", [None, "2-10"])
def test_resume_mid_epoch_and_across_epochs(randaugment):
    # 120 train samples
    cfg = DataConfig(dataset="synthetic", crop_scale=(0.5, 1.0), randaugment=randaugment, val_fraction=0.998)
    kw = dict(img_size=32, in_chans=1, batch_size=16, seed=7)
    ref = build_train_stream(cfg, **kw)
    assert ref.steps_per_epoch == 7
    torch.manual_seed(123)
    full = _take(ref, 10)  # crosses into epoch 1
    for cut in (3, 7, 8):
        run = build_train_stream(cfg, **kw)
        _take(run, cut)
        state = run.state_dict()
        torch.manual_seed(999)  # global RNG state must not matter
        resumed = build_train_stream(cfg, **kw)
        resumed.load_state_dict(state)
        _assert_batches_equal(_take(resumed, 10 - cut), full[cut:])
    assert not torch.equal(full[0][1], full[7][1])  # a fresh permutation in epoch 1
    with pytest.raises(ValueError, match="global_batch"):
        build_train_stream(cfg, img_size=32, in_chans=1, batch_size=8, seed=7).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        build_train_stream(cfg, img_size=32, in_chans=1, batch_size=16, seed=8).load_state_dict(state)


def test_rank_slices_concatenate_to_the_single_process_batch():
    cfg = DataConfig(dataset="synthetic", val_fraction=0.99)
    single = build_train_stream(cfg, img_size=40, in_chans=1, batch_size=24, seed=1)
    ranks = [build_train_stream(cfg, img_size=40, in_chans=1, batch_size=8, seed=1, rank=r, world_size=3)
             for r in range(3)]
    assert single.steps_per_epoch == ranks[0].steps_per_epoch
    for _ in range(single.steps_per_epoch + 2):
        x, y = next(single)
        parts = [next(r) for r in ranks]
        assert torch.equal(torch.cat([p[0] for p in parts]), x)
        assert torch.equal(torch.cat([p[1] for p in parts]), y)


def test_stream_augments_and_covers_the_epoch():
    cfg = DataConfig(dataset="synthetic", val_fraction=0.99)
    s = build_train_stream(cfg, img_size=28, in_chans=1, batch_size=100, seed=0)
    plain = build_train_stream(cfg.replace(inception_crop=False, hflip=False), img_size=28, in_chans=1,
                               batch_size=100, seed=0)
    labels = torch.cat([next(s)[1] for _ in range(s.steps_per_epoch)])
    x_aug, _ = next(s)
    x_plain, _ = next(plain)
    assert x_aug.shape == x_plain.shape == (100, 1, 28, 28)
    assert x_plain.min() >= -1 and x_plain.max() <= 1 and x_aug.min() >= -1 and x_aug.max() <= 1
    eval_labels = torch.cat([y for _, y in build_eval_data(cfg, "train", img_size=28, in_chans=1, batch_size=600)])
    # one epoch visits every training sample exactly once
    assert torch.equal(torch.bincount(labels, minlength=10), torch.bincount(eval_labels, minlength=10))


def test_channels():
    with pytest.raises(ValueError, match="expand_channels"):
        build_train_stream(DataConfig(dataset="synthetic"), img_size=28, in_chans=3, batch_size=8, seed=0)
    cfg = DataConfig(dataset="synthetic", expand_channels=True, normalize="imagenet", inception_crop=False,
                     hflip=False)
    x3, _ = next(build_train_stream(cfg, img_size=28, in_chans=3, batch_size=8, seed=0))
    x1, _ = next(build_train_stream(cfg.replace(expand_channels=False), img_size=28, in_chans=1, batch_size=8,
                                    seed=0))
    assert x3.shape == (8, 3, 28, 28)
    grey = (x1 * ((0.229 + 0.224 + 0.225) / 3) + (0.485 + 0.456 + 0.406) / 3)  # back to [0, 1]
    ref = T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))(grey.expand(-1, 3, -1, -1))
    torch.testing.assert_close(x3, ref, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------ config, spec


def test_data_config_round_trip_and_errors():
    cfg = DataConfig(dataset="cifar10", root="/x", crop_scale=[0.3, 1.0], randaugment="2-10")
    assert DataConfig.from_dict(cfg.to_dict()) == cfg and cfg.crop_scale == (0.3, 1.0)
    with pytest.raises(ValueError, match=r"unknown data key\(s\) \['shuffle'\]; valid keys: \['dataset'"):
        DataConfig.from_dict({"shuffle": True})
    for bad, match in (
        (dict(dataset="imagenet"), "data.dataset"),
        (dict(dataset="imagefolder"), "root is required"),
        (dict(val_fraction=1.0), "val_fraction"),
        (dict(normalize="zscore"), "normalize"),
        (dict(crop_scale=(0.5, 0.1)), "crop_scale"),
        (dict(randaugment="two"), "randaugment"),
        (dict(randaugment="2-15"), "above 10"),
        (dict(num_workers=-1), "num_workers"),
    ):
        with pytest.raises(ValueError, match=match):
            DataConfig(**bad)


def test_parse_data_spec():
    assert parse_data_spec("fashion_mnist") == DataConfig()
    assert parse_data_spec("fashion-mnist:/data/fm").root == "/data/fm"
    assert parse_data_spec("imagefolder:/data/tree") == DataConfig(dataset="imagefolder", root="/data/tree")
    wds = parse_data_spec("webdataset:/d/shard-{000..009}.tar")
    assert wds.dataset == "webdataset" and wds.root == "/d/shard-{000..009}.tar"
    assert parse_data_spec("cifar100:/c").dataset == "cifar100"
    for bad in ("", "imagenet:/x", "imagefolder:", "imagefolder"):
        with pytest.raises(ValueError):
            parse_data_spec(bad)


# ------------------------------------------------------------------------------------ batch RandAugment


def test_batch_randaugment_matches_torchvision_per_image():
    from vitlab.data.batch_randaugment import BatchRandAugment

    x = torch.randint(0, 256, (64, 3, 20, 20), dtype=torch.uint8)
    bra = BatchRandAugment(num_ops=2, magnitude=9)
    ops, neg = bra.draw(np.random.default_rng(0), 64)
    out = bra(x, ops, neg)
    for i in range(64):  # grouping by op changes nothing: image i got exactly its own two ops
        ref = x[i : i + 1]
        for layer in range(2):
            op = bra.ops[ops[layer, i]]
            ref = bra.apply_one(ref, op, bra.magnitude_of(op, bool(neg[layer, i]), 20, 20))
        assert torch.equal(out[i : i + 1], ref), (i, [bra.ops[o] for o in ops[:, i]])
    # and every output of torchvision's own per-image RandAugment is one of our candidate (op, sign) outputs
    tv = T.RandAugment(num_ops=1, magnitude=9, num_magnitude_bins=11, fill=128)
    img = x[:1]
    candidates = [bra.apply_one(img, op, bra.magnitude_of(op, s, 20, 20)) for op in bra.ops for s in (False, True)]
    for seed in range(30):
        torch.manual_seed(seed)
        y = tv(img)
        assert any(torch.equal(y, c) for c in candidates)


@pytest.mark.parametrize("randaugment", [None, "2-10"])
def test_rank_slices_with_randaugment(randaugment):
    cfg = DataConfig(dataset="synthetic", val_fraction=0.99, randaugment=randaugment)
    single = build_train_stream(cfg, img_size=32, in_chans=1, batch_size=8, seed=4)
    ranks = [build_train_stream(cfg, img_size=32, in_chans=1, batch_size=4, seed=4, rank=r, world_size=2)
             for r in range(2)]
    for _ in range(3):
        x, _ = next(single)
        assert torch.equal(torch.cat([next(r)[0] for r in ranks]), x)


def test_pipeline_leaves_thread_count_alone():
    n = torch.get_num_threads()
    cfg = DataConfig(dataset="synthetic", val_fraction=0.99)
    s = build_train_stream(cfg, img_size=32, in_chans=1, batch_size=8, seed=0)
    next(s)
    for _ in build_eval_data(cfg, "val", img_size=32, in_chans=1, batch_size=4000):
        assert torch.get_num_threads() == n
    assert torch.get_num_threads() == n


@settings(max_examples=40, deadline=None)
@given(
    h=st.integers(1, 40), w=st.integers(1, 40), oh=st.integers(1, 50), ow=st.integers(1, 50),
    seed=st.integers(0, 2**31), scale_lo=st.floats(0.01, 1.0),
)
def test_resized_crop_matches_torchvision_for_any_shape(h, w, oh, ow, seed, scale_lo):
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.integers(0, 256, (3, 2, h, w), dtype=np.uint8))
    boxes = sample_crop_boxes(rng, 3, h, w, (scale_lo, 1.0), (0.5, 2.0))
    top, left, bh, bw = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + bh <= h).all() and (left + bw <= w).all()
    assert (bh >= 1).all() and (bw >= 1).all()
    flip = torch.from_numpy(rng.random(3) < 0.5)
    ours = resized_crop_batch(x, boxes, (oh, ow), flip)
    for i in range(3):
        ref = TF.resized_crop(x[i].float(), *boxes[i].tolist(), [oh, ow], antialias=False)
        ref = torch.flip(ref, dims=[-1]) if flip[i] else ref
        torch.testing.assert_close(ours[i], ref, atol=2e-3, rtol=1e-5)
