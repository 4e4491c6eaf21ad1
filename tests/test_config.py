"""The one (H, W) normaliser, the one pixels-per-token formula and the one unknown-key check, and that every
config reader goes through them."""

import numpy as np
import pytest
import torch

import vitlab
from vitlab.data.config import DataConfig
from vitlab.models.config import ViTConfig, check_keys, pixels_per_token, to_hw
from vitlab.models.preprocess import Preprocess
from vitlab.train.recipe import Recipe


@pytest.mark.parametrize("size, hw", [(32, (32, 32)), ((24, 40), (24, 40)), ([24, 40], (24, 40)),
                                      (np.int64(16), (16, 16)), ((np.int32(8), 12), (8, 12)),
                                      (torch.Size([4, 6]), (4, 6))])
def test_to_hw_accepts_a_side_or_a_pair(size, hw):
    out = to_hw(size)
    assert out == hw and all(type(v) is int for v in out)


@pytest.mark.parametrize("size", [True, 2.0, (2.0, 3), (1, 2, 3), (4,), "32", "ab", None, (True, 4)])
def test_to_hw_rejects_everything_else(size):
    with pytest.raises(ValueError, match=r"size must be an int or \(H, W\)"):
        to_hw(size, "size")


@pytest.mark.parametrize("size", [0, -4, (4, 0)])
def test_to_hw_rejects_non_positive(size):
    with pytest.raises(ValueError, match="img_size must be positive"):
        to_hw(size)


def test_every_size_reader_uses_to_hw():
    M = (0.5, 0.5, 0.5)
    assert ViTConfig(img_size=[24, 32], patch_size=8).img_hw == (24, 32)
    assert Preprocess((24, 24), M, M).img_size == 24 and Preprocess(24, M, M).hw == (24, 24)
    for bad in [(24, 32, 3), 2.5]:
        with pytest.raises(ValueError, match=r"ViTConfig\.img_size must be an int or \(H, W\)"):
            ViTConfig(img_size=bad)
        with pytest.raises(ValueError, match=r"preprocess\.img_size must be an int or \(H, W\)"):
            Preprocess(bad, M, M)
    with pytest.raises(ValueError, match=r"ViTConfig\.img_size must be positive"):
        ViTConfig(img_size=(0, 32))
    cfg = ViTConfig.from_name("ViT-Ti/16", img_size=32, patch_size=8)
    assert vitlab.count_flops(cfg, (32, 64)) > vitlab.count_flops(cfg, 32) == vitlab.count_flops(cfg, [32, 32])


@pytest.mark.parametrize("layers, expected", [(None, 16), ((), 64), ((3,), 64), ((3, 4), 128), ((3, 4, 9), 256),
                                              ((3, 4, 6, 3), 512)])
def test_pixels_per_token_is_the_resnet_stride_times_the_patch(layers, expected):
    assert pixels_per_token(16, layers) == expected
    if layers is None or len(layers) <= 2:  # what the model really does: one token per pixel_patch square
        cfg = ViTConfig.from_name("ViT-Ti/16", depth=1, patch_size=1 if layers is not None else 16,
                                  hybrid_layers=layers, img_size=2 * expected if layers is None else 2 * expected // 16)
        model = vitlab.create_model(cfg)
        h, w = cfg.img_hw
        tokens, grid = model.patch_embed(torch.zeros(1, 3, h, w))
        assert cfg.pixel_patch == pixels_per_token(cfg.patch_size, layers) == h // grid[0]
        assert tokens.shape[1] == cfg.num_patches == 4


def test_check_keys():
    assert check_keys({"a": 1}, ["a", "b"], "thing") == {"a": 1}
    with pytest.raises(ValueError, match=r"unknown thing key\(s\) \['c'\]; valid keys: \['a', 'b'\]"):
        check_keys({"a": 1, "c": 2}, ["a", "b"], "thing")
    with pytest.raises(ValueError, match="thing must be a mapping, got list"):
        check_keys([1], ["a"], "thing")


@pytest.mark.parametrize("read, message", [
    (lambda: ViTConfig.from_dict({"widht": 3}), r"unknown ViTConfig field\(s\) \['widht'\]; valid fields: \['img_"),
    (lambda: ViTConfig().replace(widht=3), r"unknown ViTConfig field\(s\) \['widht'\]; valid fields: \['img_"),
    (lambda: DataConfig.from_dict({"shufle": 1}), r"unknown data key\(s\) \['shufle'\]; valid keys: \['dataset'"),
    (lambda: Preprocess.from_dict({"img_size": 8, "mean": [0], "std": [1], "crop": 1}),
     r"unknown preprocess key\(s\) \['crop'\]; valid keys: \['img_size'"),
    (lambda: Recipe.from_dict({"train": {"steps": 1, "batch_sise": 8}}),
     r"unknown recipe section 'train' key\(s\) \['batch_sise'\]; valid keys: \['batch_size'"),
    (lambda: Recipe.from_dict({"trian": {}}), r"unknown recipe section\(s\) \['trian'\]; valid sections: \['model'"),
])
def test_every_config_reader_names_unknown_keys_the_same_way(read, message):
    with pytest.raises(ValueError, match=message):
        read()
