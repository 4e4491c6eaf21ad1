"""transformers ViT checkpoints (save_pretrained directories, weight files, in-memory state dicts) against
transformers' own outputs, fp32 1e-4."""

import json

import pytest
import torch
from transformers import ViTConfig as HFConfig
from transformers import ViTForImageClassification, ViTModel

import vitlab
from vitlab.weights import WeightsError, read_metadata

from .conftest import perturb_

ATOL = 1e-4


def hf_config(**kw):
    # HF's defaults: layer_norm_eps 1e-12 and exact GELU ("gelu"); we read both from config.json.
    base = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32,
                patch_size=8, num_labels=5)
    return HFConfig(**{**base, **kw})


def hf_logits(model, x):
    with torch.no_grad():
        return model(pixel_values=x).logits


@pytest.mark.parametrize("qkv_bias", [True, False])
def test_save_pretrained_directory(tmp_path, qkv_bias):
    theirs = ViTForImageClassification(hf_config(id2label={i: f"c{i}" for i in range(5)}, qkv_bias=qkv_bias))
    theirs = perturb_(theirs).eval()
    theirs.save_pretrained(tmp_path / "hf")
    ours, report = vitlab.load_model(tmp_path / "hf", return_report=True)
    assert report.format == "hf" and report.ok and ours.cfg.qkv_bias == qkv_bias
    assert ours.cfg.layer_norm_eps == 1e-12 and ours.cfg.num_heads == 4 and ours.cfg.num_classes == 5
    assert read_metadata(tmp_path / "hf") == {"class_names": ["c0", "c1", "c2", "c3", "c4"]}
    x = torch.randn(3, 3, 32, 32)
    torch.testing.assert_close(ours(x), hf_logits(theirs, x), atol=ATOL, rtol=0)


def test_weight_file_with_config_beside_and_non_square(tmp_path):
    theirs = perturb_(ViTForImageClassification(hf_config(image_size=[32, 48], layer_norm_eps=1e-6))).eval()
    theirs.save_pretrained(tmp_path)
    ours = vitlab.load_model(tmp_path / "model.safetensors")  # the file: config.json beside it gives the grid
    assert ours.cfg.img_size == (32, 48)
    x = torch.randn(2, 3, 32, 48)
    torch.testing.assert_close(ours(x), hf_logits(theirs, x), atol=ATOL, rtol=0)


def test_in_memory_state_dict_names_and_pytorch_bin(tmp_path):
    """torch.save(model.state_dict()) uses transformers' current module names (layers.{i}.attention.q_proj)."""
    theirs = perturb_(ViTForImageClassification(hf_config(layer_norm_eps=1e-6))).eval()
    torch.save(theirs.state_dict(), tmp_path / "pytorch_model.bin")
    ours = vitlab.create_model("ViT-Ti/16", embed_dim=64, depth=2, num_heads=4, mlp_dim=128, img_size=32,
                               patch_size=8, num_classes=5).eval()
    report = vitlab.load_weights(ours, tmp_path / "pytorch_model.bin")
    assert report.format == "hf" and report.ok
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(ours(x), hf_logits(theirs, x), atol=ATOL, rtol=0)


def test_vit_model_pooler_is_pre_logits(tmp_path):
    """ViTModel's pooler (Dense + tanh on the class token) is the paper's pre-logits layer."""
    theirs = perturb_(ViTModel(hf_config(), add_pooling_layer=True)).eval()
    theirs.save_pretrained(tmp_path / "hf")
    ours = vitlab.load_model(tmp_path / "hf", num_classes=0, representation_size=64)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = theirs(pixel_values=x)
    torch.testing.assert_close(ours.forward_features(x), out.last_hidden_state, atol=ATOL, rtol=0)
    torch.testing.assert_close(ours(x), out.pooler_output, atol=ATOL, rtol=0)


def test_unsupported_activation_is_refused(tmp_path):
    theirs = ViTForImageClassification(hf_config(hidden_act="gelu_new"))
    theirs.save_pretrained(tmp_path / "hf")
    with pytest.raises(WeightsError, match="gelu_new"):
        vitlab.load_model(tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["hidden_act"] == "gelu_new"  # nothing of the user's was changed
