"""Our .safetensors format: config and metadata inside, rebuilt by load_model with nothing else; atomic,
non-clobbering writes; head replacement and position-embedding resampling on load."""

import json

import pytest
import torch
from safetensors.torch import load_file

import vitlab
from vitlab.weights import LoadReport, ShapeMismatchError, WeightsError, read_config, read_metadata

from .conftest import perturb_

TINY = dict(embed_dim=64, depth=2, num_heads=4, mlp_dim=128, img_size=32, patch_size=8, num_classes=5)


def tiny(**kw):
    return perturb_(vitlab.create_model("ViT-Ti/16", **{**TINY, **kw})).eval()


def test_round_trip_rebuilds_model_and_metadata(tmp_path):
    model = tiny(img_size=(32, 48), representation_size=24, layer_norm_eps=1e-5)
    meta = {"recipe": {"lr": 1e-3, "epochs": 7}, "class_names": ["a", "b", "c", "d", "e"], "top1": 0.91}
    path = vitlab.save_weights(model, tmp_path / "m.safetensors", meta)
    loaded, report = vitlab.load_model(path, return_report=True)
    assert loaded.cfg == model.cfg and not loaded.training
    assert report.format == "vitlab" and report.ok and not report.inferred
    for (k, a), (k2, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    x = torch.randn(2, 3, 32, 48)
    assert torch.equal(model(x), loaded(x))
    assert read_metadata(path) == meta
    assert read_config(path) == model.cfg
    # The file is plain safetensors with timm names: any reader gets the tensors.
    assert set(load_file(str(path))) == set(model.state_dict())


def test_metadata_defaults_and_validation(tmp_path):
    model = tiny()
    path = vitlab.save_weights(model, tmp_path / "m.safetensors")
    assert read_metadata(path) == {}
    with pytest.raises(TypeError, match="JSON"):
        vitlab.save_weights(model, tmp_path / "bad.safetensors", {"x": object()})
    assert not (tmp_path / "bad.safetensors").exists()
    with pytest.raises(ValueError, match="suffix"):
        vitlab.save_weights(model, tmp_path / "m.pt")


def test_refuses_to_overwrite_and_writes_atomically(tmp_path):
    model = tiny()
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"user data")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        vitlab.save_weights(model, path)
    assert path.read_bytes() == b"user data"
    vitlab.save_weights(model, path, overwrite=True)
    assert vitlab.load_model(path).cfg == model.cfg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]  # no temporary left behind


def test_config_json_beside_foreign_file(tmp_path):
    model = tiny(pool="gap", class_token=False)
    from safetensors.torch import save_file

    save_file(model.state_dict(), str(tmp_path / "weights.safetensors"))  # plain file, no header
    (tmp_path / "config.json").write_text(json.dumps({"config": model.cfg.to_dict()}))
    loaded, report = vitlab.load_model(tmp_path / "weights.safetensors", return_report=True)
    assert loaded.cfg == model.cfg and not report.inferred
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(model(x), loaded(x))


def test_head_replaced_and_pos_embed_resampled(tmp_path):
    model = tiny()
    path = vitlab.save_weights(model, tmp_path / "m.safetensors")
    ft, report = vitlab.load_model(path, return_report=True, num_classes=3, img_size=48)
    assert report.replaced == ["head.weight", "head.bias"]
    assert not ft.head.weight.any() and not ft.head.bias.any()
    assert "3" in str(report) and "5" in " ".join(report.messages)
    assert "pos_embed" in report.resampled and "4x4 -> 6x6 (bicubic)" in report.resampled["pos_embed"]
    torch.testing.assert_close(ft.pos_embed[:, :1], model.pos_embed[:, :1])  # class-token row kept
    expected = vitlab.resample_pos_embed(model.pos_embed, (6, 6), (4, 4), 1, "bicubic")
    torch.testing.assert_close(ft.pos_embed, expected)
    # Everything else loaded unchanged.
    torch.testing.assert_close(ft.blocks[1].mlp.fc2.weight, model.blocks[1].mlp.fc2.weight)


def test_load_weights_into_existing_model_and_errors(tmp_path):
    src = tiny()
    path = vitlab.save_weights(src, tmp_path / "m.safetensors")
    dst = vitlab.create_model("ViT-Ti/16", **TINY)
    report = vitlab.load_weights(dst, path)
    assert isinstance(report, LoadReport) and len(report.loaded) == len(src.state_dict())
    assert "loaded 32 tensors" in str(report)
    wider = vitlab.create_model("ViT-Ti/16", **{**TINY, "mlp_dim": 96})
    with pytest.raises(ShapeMismatchError, match=r"blocks\.0\.mlp\.fc1\.weight is \(128, 64\).*\(96, 64\)"):
        vitlab.load_weights(wider, path)
    deeper = vitlab.create_model("ViT-Ti/16", **{**TINY, "depth": 3})
    with pytest.raises(WeightsError, match=r"missing from the checkpoint: blocks\.2"):
        vitlab.load_weights(deeper, path)
    report = vitlab.load_weights(deeper, path, strict=False)
    assert report.missing and all(k.startswith("blocks.2.") for k in report.missing)
    shallower = vitlab.create_model("ViT-Ti/16", **{**TINY, "depth": 1})
    with pytest.raises(WeightsError, match=r"not in the model: blocks\.1"):
        vitlab.load_weights(shallower, path)
    with pytest.raises(ValueError, match="pos_embed_resize"):
        vitlab.load_weights(dst, path, pos_embed_resize="nearest")
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        vitlab.load_weights(dst, tmp_path / "nothing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(WeightsError, match=r"junk\.safetensors"):
        vitlab.load_weights(dst, tmp_path / "junk.safetensors")


def test_loaded_model_is_a_plain_trainable_model_independent_of_its_file(tmp_path):
    model = tiny()
    path = vitlab.save_weights(model, tmp_path / "m.safetensors")
    loaded = vitlab.load_model(path)
    assert type(loaded) is vitlab.VisionTransformer
    params = dict(loaded.named_parameters())
    assert params.keys() == dict(model.named_parameters()).keys()
    assert all(isinstance(p, torch.nn.Parameter) and p.requires_grad and p.device.type == "cpu"
               for p in params.values())
    with open(path, "r+b") as f:  # the file changing or vanishing under a loaded model must not affect it
        f.truncate(16)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(loaded(x), model(x), atol=0, rtol=0)
    loaded.train()
    loaded(x).square().sum().backward()
    assert all(p.grad is not None for p in loaded.parameters())


def test_dtypes(tmp_path):
    """bf16 weights are stored as bf16 and loaded into the model's dtype (fp32 for load_model)."""
    model = tiny().to(torch.bfloat16)
    path = vitlab.save_weights(model, tmp_path / "bf16.safetensors")
    assert load_file(str(path))["blocks.0.attn.qkv.weight"].dtype == torch.bfloat16
    loaded = vitlab.load_model(path)
    assert loaded.blocks[0].attn.qkv.weight.dtype == torch.float32
    torch.testing.assert_close(loaded.blocks[0].attn.qkv.weight, model.blocks[0].attn.qkv.weight.float(), atol=0,
                               rtol=0)
    fp32 = tiny()
    half = vitlab.create_model("ViT-Ti/16", **TINY).to(torch.bfloat16)
    vitlab.load_weights(half, vitlab.save_weights(fp32, tmp_path / "fp32.npz"))
    assert half.pos_embed.dtype == torch.bfloat16
    torch.testing.assert_close(half.pos_embed, fp32.pos_embed.to(torch.bfloat16), atol=0, rtol=0)
