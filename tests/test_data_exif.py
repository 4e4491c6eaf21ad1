"""EXIF orientation: a camera JPEG stored sideways with Orientation=6 ("rotate 90 degrees clockwise to view") is
read upright, as PIL's `ImageOps.exif_transpose` shows it, by every image reader vitlab has: the folder dataset,
WebDataset shards, `load_images` / `predict`, and `transforms_for` applied to an opened PIL image.

Each reader gets two files holding the same picture: `rotated.jpg` (sideways pixels + the EXIF tag) and
`upright.png` (what exif_transpose makes of it, stored losslessly, no tag); it must give identical tensors."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

import vitlab
from vitlab.data import DataConfig, build_eval_data, load_images, transforms_for

ORIENTATION = 0x0112  # the EXIF tag; 6 = the stored image must be turned 90 degrees clockwise


@pytest.fixture
def pair(tmp_path):
    """(rotated.jpg, upright.png): a 24 x 16 (W x H) picture, no symmetry, stored sideways with Orientation=6."""
    rng = np.random.default_rng(0)
    a = np.zeros((16, 24, 3), np.uint8)
    a[:, :8] = (255, 0, 0)  # a red band on the left, a bright top row: any turn or flip shows
    a[:2] = 255
    a += rng.integers(0, 40, a.shape, dtype=np.uint8)
    stored = Image.fromarray(a).transpose(Image.Transpose.ROTATE_90)  # 16 x 24: how the camera wrote it
    exif = Image.Exif()
    exif[ORIENTATION] = 6
    rotated = tmp_path / "rotated.jpg"
    stored.save(rotated, "JPEG", quality=95, exif=exif.tobytes())
    with Image.open(rotated) as img:
        assert img.getexif()[ORIENTATION] == 6 and img.size == (16, 24)
        upright_img = ImageOps.exif_transpose(img)
    assert upright_img.size == (24, 16) and ORIENTATION not in upright_img.getexif()
    upright = tmp_path / "upright.png"
    upright_img.save(upright)
    return rotated, upright


def _tree(root, files):
    for cls, (name, src) in zip(("a", "b"), files):
        (root / cls).mkdir(parents=True)
        (root / cls / name).write_bytes(src.read_bytes())
    return root


def test_load_images_and_transforms_for(pair):
    rotated, upright = pair
    for size in ((16, 24), (32, 32)):  # native (H, W), and a squash that an unturned image would fill differently
        x = load_images([str(rotated), str(upright)], img_size=size, in_chans=3)
        assert x.shape == (2, 3, *size)
        torch.testing.assert_close(x[0], x[1], atol=0, rtol=0)
    model = vitlab.create_model("ViT-Ti/16", img_size=32, patch_size=8, depth=1, num_classes=3)
    tf = transforms_for(model)
    with Image.open(rotated) as a, Image.open(upright) as b:
        ta, tb = tf(a), tf(b)
    assert ta.shape == (3, 32, 32)
    torch.testing.assert_close(ta, tb, atol=0, rtol=0)


def test_predict(pair, tmp_path):
    rotated, upright = pair
    model = vitlab.create_model("ViT-Ti/16", img_size=32, patch_size=8, depth=1, embed_dim=32, num_heads=2,
                                mlp_dim=64, num_classes=3)
    torch.nn.init.normal_(model.head.weight)
    ckpt = tmp_path / "m.safetensors"
    vitlab.save_weights(model, ckpt)
    a, b = vitlab.predict(str(ckpt), [str(rotated), str(upright)], top_k=3)
    # the same ranking and the same probabilities (two rows of one batch may differ in the last float bits)
    assert [t["index"] for t in a["top"]] == [t["index"] for t in b["top"]]
    assert [t["prob"] for t in a["top"]] == pytest.approx([t["prob"] for t in b["top"]], rel=1e-5, abs=1e-7)


def test_folder_dataset(pair, tmp_path):
    rotated, upright = pair
    root = _tree(tmp_path / "tree", [("x.jpg", rotated), ("x.png", upright)])
    cfg = DataConfig(dataset="imagefolder", root=str(root), train_subdir="none", test_subdir="none")
    x, y = next(iter(build_eval_data(cfg, "train", img_size=(16, 24), in_chans=3, batch_size=2)))
    assert x.shape == (2, 3, 16, 24) and y.tolist() == [0, 1]
    torch.testing.assert_close(x[0], x[1], atol=0, rtol=0)


def test_webdataset_shard(pair, tmp_path):
    wds = pytest.importorskip("webdataset")
    rotated, upright = pair
    shard = tmp_path / "test-000.tar"
    with wds.TarWriter(str(shard)) as w:
        w.write({"__key__": "a", "jpg": rotated.read_bytes(), "cls": "0"})
        w.write({"__key__": "b", "png": upright.read_bytes(), "cls": "1"})
    cfg = DataConfig(dataset="webdataset", root=str(shard), test_root=str(shard))
    x = torch.cat([xb for xb, _ in build_eval_data(cfg, "test", img_size=(16, 24), in_chans=3, batch_size=2)])
    assert x.shape == (2, 3, 16, 24)
    torch.testing.assert_close(x[0], x[1], atol=0, rtol=0)


def test_upright_image_is_untouched():
    """No tag, or Orientation=1: the pixels come through as stored (exif_transpose is not a resampling)."""
    img = Image.fromarray(np.arange(48, dtype=np.uint8).reshape(6, 8))
    exif = Image.Exif()
    exif[ORIENTATION] = 1
    buf = io.BytesIO()
    img.save(buf, "PNG", exif=exif.tobytes())
    from vitlab.data.images import decode_image

    assert np.array_equal(np.asarray(decode_image(buf.getvalue(), 1)), np.asarray(img))
