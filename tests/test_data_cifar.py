"""CIFAR-10/100 binary parsing on synthetic files written in the exact published record format."""

import numpy as np
import pytest
import torch
from PIL import Image

from vitlab.data import DataConfig, build_eval_data, build_train_stream
from vitlab.data.cifar import load_cifar


def _records(images_hwc: np.ndarray, labels: list[tuple[int, ...]]) -> bytes:
    # <label byte(s)><1024 red><1024 green><1024 blue>, each plane row-major (cs.toronto.edu/~kriz/cifar.html)
    out = bytearray()
    for img, lab in zip(images_hwc, labels):
        out += bytes(lab)
        for c in range(3):
            out += img[:, :, c].tobytes()
    return bytes(out)


@pytest.fixture
def cifar10(tmp_path):
    rng = np.random.default_rng(0)
    base = tmp_path / "cifar-10-batches-bin"
    base.mkdir()
    truth = {}
    for name, n in [*((f"data_batch_{i}.bin", 4) for i in range(1, 6)), ("test_batch.bin", 6)]:
        imgs = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        labels = rng.integers(0, 10, n).tolist()
        (base / name).write_bytes(_records(imgs, [(lab,) for lab in labels]))
        truth[name] = (imgs, labels)
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    (base / "batches.meta.txt").write_text("\n".join(names) + "\n\n")
    return tmp_path, truth, names


def test_cifar10_records(cifar10):
    root, truth, names = cifar10
    train = load_cifar(str(root), "cifar10", "train")
    test = load_cifar(str(root / "cifar-10-batches-bin"), "cifar10", "test")  # the folder itself works too
    assert train.images.shape == (20, 3, 32, 32) and train.classes == names
    expected = np.concatenate([truth[f"data_batch_{i}.bin"][0] for i in range(1, 6)]).transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(train.images, expected)
    assert train.labels.tolist() == [lab for i in range(1, 6) for lab in truth[f"data_batch_{i}.bin"][1]]
    np.testing.assert_array_equal(test.images, truth["test_batch.bin"][0].transpose(0, 3, 1, 2))
    assert test.labels.tolist() == truth["test_batch.bin"][1]


def test_cifar100_uses_fine_labels(tmp_path):
    base = tmp_path / "cifar-100-binary"
    base.mkdir()
    imgs = np.random.default_rng(1).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    (base / "train.bin").write_bytes(_records(imgs, [(1, 99), (19, 0), (4, 42)]))  # (coarse, fine)
    (base / "test.bin").write_bytes(_records(imgs[:1], [(2, 7)]))
    (base / "fine_label_names.txt").write_text("\n".join(f"fine{i}" for i in range(100)))
    d = load_cifar(str(tmp_path), "cifar100", "train")
    assert d.labels.tolist() == [99, 0, 42] and len(d.classes) == 100 and d.classes[42] == "fine42"
    np.testing.assert_array_equal(d.images, imgs.transpose(0, 3, 1, 2))
    assert load_cifar(str(tmp_path), "cifar100", "test").labels.tolist() == [7]


def test_cifar_errors(cifar10, tmp_path):
    root, _, _ = cifar10
    bad = root / "cifar-10-batches-bin" / "data_batch_3.bin"
    bad.write_bytes(bad.read_bytes()[:-1])
    with pytest.raises(ValueError, match=r"data_batch_3.bin.*3073-byte CIFAR records"):
        load_cifar(str(root), "cifar10", "train")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_cifar(str(tmp_path / "nowhere"), "cifar10", "train")
    with pytest.raises(FileNotFoundError, match=r"train\.bin not found"):
        load_cifar(str(root), "cifar100", "train")


def test_cifar_streams_rgb_and_grey(cifar10):
    root, truth, _ = cifar10
    cfg = DataConfig(dataset="cifar10", root=str(root), inception_crop=False, hflip=False)
    test = build_eval_data(cfg, "test", img_size=32, in_chans=3, batch_size=4)
    x = torch.cat([b for b, _ in test])
    ref = torch.from_numpy(truth["test_batch.bin"][0]).permute(0, 3, 1, 2).float() / 127.5 - 1
    torch.testing.assert_close(x, ref)
    grey = torch.cat([b for b, _ in build_eval_data(cfg, "test", img_size=32, in_chans=1, batch_size=4)])
    pil = np.stack([np.asarray(Image.fromarray(im).convert("L")) for im in truth["test_batch.bin"][0]])
    # PIL rounds its luma to integers: within half a grey level
    torch.testing.assert_close(grey[:, 0], torch.from_numpy(pil).float() / 127.5 - 1, atol=0.6 / 127.5, rtol=0)
    s = build_train_stream(cfg.replace(inception_crop=True, hflip=True), img_size=48, in_chans=3, batch_size=5,
                           seed=0)
    xb, yb = next(s)
    assert xb.shape == (5, 3, 48, 48) and yb.shape == (5,) and s.epoch_size == 20 and s.num_classes == 10
