"""ImageFolder trees: bad files (corrupt, truncated, non-image, decompression bomb) skipped with a warning and
counted, or errors in strict mode; image modes converted as PIL/torchvision do; missing root and empty class
errors; deterministic, resumable, rank-splittable file streams; load_images."""

import io
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.datasets.folder import pil_loader

from vitlab.data import (
    BadImageError,
    BadImageWarning,
    DataConfig,
    DataError,
    build_eval_data,
    build_train_stream,
    load_images,
)
from vitlab.data.folder import scan_tree
from vitlab.data.images import decode_image, pil_to_tensor


def _rgb(seed: int, size=(20, 16)) -> Image.Image:
    a = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(a, "RGB")


def _bomb_png() -> bytes:
    """A tiny PNG whose header declares 30000 x 30000 pixels (a decompression bomb)."""
    buf = io.BytesIO()
    Image.new("L", (1, 1)).save(buf, "PNG")
    raw = bytearray(buf.getvalue())
    ihdr = raw.index(b"IHDR")
    raw[ihdr + 4 : ihdr + 12] = struct.pack(">II", 30000, 30000)
    raw[ihdr + 17 : ihdr + 21] = struct.pack(">I", zlib.crc32(bytes(raw[ihdr : ihdr + 17])))
    return bytes(raw)


def _truncated_jpeg(seed: int) -> bytes:
    buf = io.BytesIO()
    _rgb(seed, (64, 64)).save(buf, "JPEG", quality=95)
    return buf.getvalue()[: len(buf.getvalue()) // 2]


@pytest.fixture
def tree(tmp_path):
    """root/train/{cat,dog,fish}, root/test/{cat,dog}: every image mode, and one of each kind of bad file."""
    root = tmp_path / "data"
    cat, dog, fish = (root / "train" / c for c in ("cat", "dog", "fish"))
    for d in (cat, dog, fish, root / "test" / "cat", root / "test" / "dog"):
        d.mkdir(parents=True)
    for i in range(4):
        _rgb(i).save(cat / f"rgb{i}.png")
        _rgb(10 + i).save(dog / f"rgb{i}.jpg", quality=95)
    _rgb(20).convert("L").save(fish / "grey.png")
    _rgb(21).convert("P", palette=Image.Palette.ADAPTIVE).save(fish / "palette.png")
    pt = _rgb(22).convert("P", palette=Image.Palette.ADAPTIVE)
    pt.info["transparency"] = 0
    pt.save(fish / "palette_transparent.png", transparency=0)
    _rgb(23).convert("RGBA").save(fish / "rgba.png")
    _rgb(24).convert("CMYK").save(fish / "cmyk.jpg")
    Image.fromarray(np.arange(320, dtype=np.uint16).reshape(16, 20) * 200).save(fish / "sixteen.png")
    (cat / "notes.txt").write_text("not an image")
    (cat / "corrupt.jpg").write_bytes(b"\xff\xd8\xff\xe0" + bytes(np.random.default_rng(0).integers(0, 256, 500)))
    png = io.BytesIO()
    _rgb(30).save(png, "PNG")
    (dog / "truncated.png").write_bytes(png.getvalue()[:-40])
    (dog / "bomb.png").write_bytes(_bomb_png())
    (dog / "truncated_body.jpg").write_bytes(_truncated_jpeg(31))  # passes the scan, fails at decode
    (cat / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    _rgb(40).save(root / "test" / "cat" / "a.png")
    _rgb(41).save(root / "test" / "dog" / "b.png")
    return root


BAD_AT_SCAN = {"notes.txt", "corrupt.jpg", "truncated.png", "bomb.png"}


def test_scan_skips_bad_files_with_named_warnings(tree):
    with pytest.warns(BadImageWarning) as rec:
        index = scan_tree(str(tree / "train"))
    messages = " ".join(str(w.message) for w in rec)
    for name in BAD_AT_SCAN:
        assert name in messages
    assert "decompression bomb" in messages
    assert {s["path"].rsplit("/", 1)[1] for s in index.skipped} == BAD_AT_SCAN
    assert index.classes == ["cat", "dog", "fish"] and index.hidden == 1
    assert len(index.paths) == 4 + 5 + 6  # truncated_body.jpg is only found when decoded
    assert np.bincount(index.labels).tolist() == [4, 5, 6]


def test_strict_mode_raises_naming_the_file(tree):
    with pytest.raises(BadImageError, match=r"cat/corrupt.jpg"):
        scan_tree(str(tree / "train"), strict=True)


def test_decompression_bomb_refused():
    with pytest.raises(BadImageError, match="decompression bomb"):
        decode_image(_bomb_png(), 3)
    with pytest.raises(BadImageError, match="decompression bomb"):
        decode_image(_png_bytes(_rgb(0, (100, 100))), 3, max_pixels=5000)


def _png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("name", ["grey.png", "palette.png", "rgba.png", "cmyk.jpg"])
def test_modes_convert_like_torchvision_loader(tree, name):
    path = str(tree / "train" / "fish" / name)
    ours = np.asarray(decode_image(path, 3))
    np.testing.assert_array_equal(ours, np.asarray(pil_loader(path)))  # torchvision's ImageFolder loader
    with Image.open(path) as im:
        np.testing.assert_array_equal(np.asarray(decode_image(path, 1)), np.asarray(im.convert("L")))


def test_palette_transparency_and_16_bit(tree):
    path = str(tree / "train" / "fish" / "palette_transparent.png")
    with Image.open(path) as im:
        ref = np.asarray(im.convert("RGBA").convert("RGB"))
    np.testing.assert_array_equal(np.asarray(decode_image(path, 3)), ref)
    sixteen = np.asarray(decode_image(str(tree / "train" / "fish" / "sixteen.png"), 1))
    expected = np.round((np.arange(320).reshape(16, 20) * 200) / 257.0).astype(np.uint8)  # 16 -> 8 bit
    np.testing.assert_array_equal(sixteen, expected)


def test_missing_root_and_empty_class(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        scan_tree(str(tmp_path / "nope"))
    (tmp_path / "t" / "a").mkdir(parents=True)
    (tmp_path / "t" / "b").mkdir()
    _rgb(0).save(tmp_path / "t" / "a" / "x.png")
    with pytest.raises(DataError, match=r".*t/b: class folder has no usable images \(it is empty\)"):
        scan_tree(str(tmp_path / "t"))
    (tmp_path / "t" / "b" / "junk.jpg").write_bytes(b"junk")
    with pytest.warns(BadImageWarning), pytest.raises(ValueError, match=r"1 bad files skipped"):
        scan_tree(str(tmp_path / "t"))
    (tmp_path / "flat").mkdir()
    with pytest.raises(ValueError, match="no class sub-folders"):
        scan_tree(str(tmp_path / "flat"))
    with pytest.raises(FileNotFoundError):
        build_train_stream(DataConfig(dataset="imagefolder", root=str(tmp_path / "nope")), img_size=8, in_chans=3,
                           batch_size=2, seed=0)


def _cfg(tree, **kw):
    return DataConfig(dataset="imagefolder", root=str(tree), crop_scale=(0.3, 1.0), **kw)


def _take(stream, n):
    return [next(stream) for _ in range(n)]


@pytest.mark.filterwarnings("ignore::vitlab.data.BadImageWarning")
def test_train_stream_replaces_bad_file_and_resumes_exactly(tree):
    cfg = _cfg(tree)
    s = build_train_stream(cfg, img_size=16, in_chans=3, batch_size=4, seed=3)
    assert s.epoch_size == 15 and s.steps_per_epoch == 3 and s.num_classes == 3
    assert s.report["num_skipped"] == 4
    torch.manual_seed(5)
    full = _take(s, 6)
    for x, y in full:
        assert x.shape == (4, 3, 16, 16) and y.shape == (4,) and x.min() >= -1 and x.max() <= 1
    assert [d["path"].rsplit("/", 1)[1] for d in s.report["replaced_at_load"]] == ["truncated_body.jpg"]
    assert "truncated" in s.report["replaced_at_load"][0]["reason"]

    run = build_train_stream(cfg, img_size=16, in_chans=3, batch_size=4, seed=3)
    _take(run, 3)
    state = run.state_dict()
    torch.manual_seed(77)
    resumed = build_train_stream(cfg, img_size=16, in_chans=3, batch_size=4, seed=3)
    resumed.load_state_dict(state)
    for (xa, ya), (xb, yb) in zip(_take(resumed, 3), full[3:]):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.filterwarnings("ignore::vitlab.data.BadImageWarning")
def test_file_stream_ranks_and_workers(tree):
    cfg = _cfg(tree, randaugment="2-9")
    single = build_train_stream(cfg, img_size=16, in_chans=3, batch_size=4, seed=1)
    ranks = [build_train_stream(cfg.replace(num_workers=2 if r else 0), img_size=16, in_chans=3, batch_size=2,
                                seed=1, rank=r, world_size=2) for r in range(2)]
    for _ in range(5):  # crosses an epoch boundary
        x, y = next(single)
        parts = [next(r) for r in ranks]
        assert torch.equal(torch.cat([p[0] for p in parts]), x)
        assert torch.equal(torch.cat([p[1] for p in parts]), y)


@pytest.mark.filterwarnings("ignore::vitlab.data.BadImageWarning")
def test_eval_splits(tree):
    cfg = _cfg(tree, val_fraction=0.25)
    test = build_eval_data(cfg, "test", img_size=(12, 10), in_chans=3, batch_size=8)
    assert test.classes == ["cat", "dog", "fish"] and test.num_samples == 2
    (x, y), = list(test)
    assert x.shape == (2, 3, 12, 10) and y.tolist() == [0, 1]
    val = build_eval_data(cfg, "val", img_size=8, in_chans=1, batch_size=3)
    train = build_train_stream(cfg, img_size=8, in_chans=1, batch_size=2, seed=0)
    assert val.num_samples == 4 and train.epoch_size == 11  # round(0.25 n) of each class: 1 + 1 + 2
    assert sum(len(y) for _, y in val) <= 4  # truncated_body.jpg is dropped if it fell into val
    (tree / "test" / "bird").mkdir()
    _rgb(0).save(tree / "test" / "bird" / "x.png")
    with pytest.raises(ValueError, match=r"classes \['bird'\] that the training set does not have"):
        build_eval_data(cfg, "test", img_size=8, in_chans=3, batch_size=2)


def test_load_images(tree):
    paths = [str(tree / "train" / "cat" / "rgb0.png"), str(tree / "train" / "fish" / "cmyk.jpg")]
    x = load_images(paths, img_size=(16, 20), in_chans=3)
    assert x.shape == (2, 3, 16, 20) and x.min() >= -1 and x.max() <= 1
    # at the native size nothing is resampled: exactly the pixels mapped to [-1, 1]
    ref = pil_to_tensor(pil_loader(paths[0])).float() / 127.5 - 1
    torch.testing.assert_close(x[0], ref)
    assert load_images(paths[:1], img_size=8, in_chans=1).shape == (1, 1, 8, 8)
    with pytest.raises(BadImageError, match=r"notes\.txt"):
        load_images([paths[0], str(tree / "train" / "cat" / "notes.txt")], img_size=8, in_chans=3)
    with pytest.raises(BadImageError, match=r"missing\.png: no such file"):
        load_images([str(tree / "missing.png")], img_size=8, in_chans=3)


def test_unverified_tree_handles_bad_files_at_load(tree):
    import os

    os.symlink(tree / "train" / "cat", tree / "train" / "cat" / "loop")  # a symlink cycle is read once
    cfg = _cfg(tree, verify_files=False)
    with pytest.warns(BadImageWarning) as rec:
        s = build_train_stream(cfg, img_size=8, in_chans=3, batch_size=4, seed=0)
        n = s.epoch_size
        for _ in range(2 * s.steps_per_epoch):  # two epochs: every file is decoded at least once
            x, _ = next(s)
            assert x.shape == (4, 3, 8, 8) and torch.isfinite(x).all()
    assert n == 6 + 7 + 6  # nothing dropped up front; the symlinked cat folder is not counted twice
    replaced = {d["path"].rsplit("/", 1)[1] for d in s.report["replaced_at_load"]}
    assert replaced <= BAD_AT_SCAN | {"truncated_body.jpg"} and len(replaced) >= 3
    assert all(any(name in str(w.message) for w in rec) for name in replaced)
