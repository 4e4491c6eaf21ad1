"""Publishing: the Hub folder (save_pretrained / from_pretrained / push_to_hub), files for transformers, torchvision
and timm checked against those libraries' own models (fp32, 1e-5), and the torch.hub entry points."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import load_file, load_model
from torchvision.models.vision_transformer import VisionTransformer as TorchvisionViT
from transformers import AutoImageProcessor, ViTForImageClassification

import vitlab
from vitlab import VisionTransformer
from vitlab.data import transforms_for
from vitlab.models.preprocess import IMAGENET, Preprocess
from vitlab.weights import WeightsError, export, from_pretrained, push_to_hub, read_metadata, save_pretrained
from vitlab.weights.preprocess_files import from_hf_processor, torchvision_classification
from vitlab.weights.publish import timm_args

from .conftest import perturb_

ATOL = 1e-5
REPO = Path(__file__).resolve().parents[1]
TINY = dict(embed_dim=64, depth=2, num_heads=4, mlp_dim=128, img_size=32, patch_size=8, num_classes=5)


def tiny(**kw) -> VisionTransformer:
    return perturb_(vitlab.create_model("ViT-Ti/16", **{**TINY, **kw})).eval()


def logits(model, x):
    with torch.no_grad():
        out = model(pixel_values=x) if isinstance(model, ViTForImageClassification) else model(x)
    return out.logits if hasattr(out, "logits") else out


# -- the Hub folder ------------------------------------------------------------------------------------------


def test_save_pretrained_then_from_pretrained_local_dir(tmp_path):
    model = tiny()
    model.preprocess = torchvision_classification(32, 36)
    save_pretrained(model, tmp_path / "hub", metadata={"class_names": list("abcde")})
    assert sorted(p.name for p in (tmp_path / "hub").iterdir()) == ["README.md", "config.json", "model.safetensors"]
    config = json.loads((tmp_path / "hub" / "config.json").read_text())
    assert config["config"] == model.cfg.to_dict() and config["library_name"] == "vitlab"
    assert Preprocess.from_dict(config["preprocess"]) == model.preprocess

    # what a plain PyTorchModelHubMixin user does: build from config.json, load model.safetensors strictly
    plain = VisionTransformer(vitlab.ViTConfig.from_dict(config["config"]))
    load_model(plain, str(tmp_path / "hub" / "model.safetensors"), strict=True)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(logits(plain.eval(), x), logits(model, x), atol=0, rtol=0)

    back = from_pretrained(tmp_path / "hub")
    assert back.cfg == model.cfg and back.preprocess == model.preprocess
    torch.testing.assert_close(logits(back, x), logits(model, x), atol=0, rtol=0)
    assert read_metadata(tmp_path / "hub" / "model.safetensors")["class_names"] == list("abcde")
    assert from_pretrained(tmp_path / "hub", num_classes=3).head.weight.abs().sum() == 0  # new head


def test_from_pretrained_follows_config_json(tmp_path):
    """config.json is the folder's truth, as on the Hub: an edited field there wins over the weights' header."""
    save_pretrained(tiny(), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["config"]["img_size"] = 48
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert "preprocess" not in config  # unknown preprocessing is not invented
    model = from_pretrained(tmp_path)
    assert model.cfg.img_size == 48 and model.pos_embed.shape[1] == 1 + 36


def hub_cache(root: Path, repo_id: str, commit: str = "a" * 40) -> Path:
    """A Hub cache as huggingface_hub lays it out: models--owner--name/{refs/main, snapshots/<commit>/...}."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return repo / "snapshots" / commit


def test_from_pretrained_repo_id_from_the_hub_cache(tmp_path):
    model = tiny(num_classes=3)
    save_pretrained(model, hub_cache(tmp_path, "someone/tiny-vit"))
    x = torch.randn(2, 3, 32, 32)
    for name in ("someone/tiny-vit", "hf-hub:someone/tiny-vit"):
        got = from_pretrained(name, cache_dir=tmp_path, local_files_only=True)
        torch.testing.assert_close(logits(got, x), logits(model, x), atol=0, rtol=0)
    with pytest.raises(WeightsError, match="someone/missing"):
        from_pretrained("someone/missing", cache_dir=tmp_path, local_files_only=True)
    with pytest.raises(FileNotFoundError, match="not a Hub repo id"):
        from_pretrained(tmp_path / "no" / "such" / "dir")


def test_from_pretrained_reads_a_transformers_folder(tmp_path):
    model = tiny()
    export(model, tmp_path / "hf", "hf")
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(logits(from_pretrained(tmp_path / "hf"), x), logits(model, x),
                               atol=ATOL, rtol=0)


def test_push_to_hub_uploads_the_folder_in_one_commit(tmp_path, monkeypatch):
    import huggingface_hub

    calls = []

    def create_repo(self, repo_id, **kw):
        calls.append(("create_repo", repo_id, kw))
        return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, *, repo_id, folder_path, **kw):
        shutil.copytree(folder_path, tmp_path / "uploaded")  # what would have been sent
        calls.append(("upload_folder", repo_id, self.token, kw))
        return "commit-info"

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    model = tiny()
    assert push_to_hub(model, "me/my-vit", token="hf_x", private=True, metadata={"metrics": {"top1": 0.5}}) == \
        "commit-info"
    assert calls[0] == ("create_repo", "me/my-vit", {"private": True, "exist_ok": True})
    assert calls[1][:3] == ("upload_folder", "me/my-vit", "hf_x") and calls[1][3]["repo_type"] == "model"
    sent = tmp_path / "uploaded"
    assert sorted(p.name for p in sent.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert "library_name: vitlab" in (sent / "README.md").read_text()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(logits(from_pretrained(sent), x), logits(model, x), atol=0, rtol=0)


# -- transformers ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw", [
    dict(),
    dict(qkv_bias=False, img_size=(32, 48), layer_norm_eps=1e-12),
    dict(pos_embed="sincos2d", in_chans=1),
])
def test_hf_directory_loads_in_transformers_with_equal_logits(tmp_path, kw):
    model = tiny(**kw)
    names = ["cat", "dog", "eel", "fox", "gnu"]
    path, _ = export(model, tmp_path / "hf", "hf", metadata={"class_names": names})
    theirs, info = ViTForImageClassification.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert theirs.config.id2label == dict(enumerate(names)) and theirs.config.layer_norm_eps == model.cfg.layer_norm_eps
    x = torch.randn(2, model.cfg.in_chans, *model.cfg.img_hw)
    torch.testing.assert_close(logits(theirs.eval(), x), logits(model, x), atol=ATOL, rtol=0)
    # and back: vitlab -> hf -> vitlab
    back = vitlab.load_model(path)
    assert read_metadata(path)["class_names"] == names
    torch.testing.assert_close(logits(back, x), logits(model, x), atol=ATOL, rtol=0)


@pytest.mark.parametrize("preprocess,processor", [
    (Preprocess(32), "ViTImageProcessor"),
    (Preprocess((32, 48), IMAGENET.mean, IMAGENET.std, "resize", 0.875, "bicubic"), "DeiTImageProcessor"),
    (torchvision_classification(32, 36), "BitImageProcessor"),
])
def test_preprocessor_config_gives_transformers_the_same_pixels(tmp_path, preprocess, processor):
    model = tiny(img_size=preprocess.img_size)
    model.preprocess = preprocess
    export(model, tmp_path / "hf", "hf")
    config = json.loads((tmp_path / "hf" / "preprocessor_config.json").read_text())
    assert config["image_processor_type"] == processor
    assert from_hf_processor(config).resize_size == preprocess.resize_size
    proc = AutoImageProcessor.from_pretrained(tmp_path / "hf", backend="pil")  # PIL, as vitlab's transform
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (50, 70, 3), dtype=np.uint8))
    theirs = proc(image, return_tensors="pt")["pixel_values"][0]
    torch.testing.assert_close(theirs, transforms_for(preprocess)(image), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kw,why", [
    (dict(hybrid_layers=(), patch_size=1), "hybrid"),
    (dict(representation_size=16), "pre-logits"),
    (dict(pool="gap"), "class token"),
])
def test_hf_refuses_what_vit_for_image_classification_cannot_compute(tmp_path, kw, why):
    with pytest.raises(WeightsError, match=why):
        export(tiny(**kw), tmp_path / "hf", "hf")
    assert not (tmp_path / "hf").exists()


# -- torchvision ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw", [dict(), dict(representation_size=16, qkv_bias=False), dict(pos_embed="sincos2d")])
def test_torchvision_state_dict_loads_strictly_with_equal_logits(tmp_path, kw):
    model = tiny(**kw)
    path, notes = export(model, tmp_path / "tv.pth", "torchvision")
    theirs = TorchvisionViT(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128,
                            num_classes=5, representation_size=kw.get("representation_size")).eval()
    theirs.load_state_dict(torch.load(path, weights_only=True), strict=True)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(logits(theirs, x), logits(model, x), atol=ATOL, rtol=0)
    assert any("representation_size=" in n for n in notes)


def test_torchvision_eps_and_refusals(tmp_path, caplog):
    assert theirs_eps() == 1e-6
    _, notes = export(tiny(layer_norm_eps=1e-12), tmp_path / "tv.pth", "torchvision")
    assert any("eps is 1e-12" in n for n in notes) and "eps is 1e-12" in caplog.text
    for kw, why in [(dict(hybrid_layers=(), patch_size=1), "hybrid"), (dict(img_size=(32, 48)), "square"),
                    (dict(pool="gap"), "class token"), (dict(num_classes=0), "no head")]:
        with pytest.raises(WeightsError, match=why):
            export(tiny(**kw), tmp_path / "x.pth", "torchvision")


def theirs_eps() -> float:
    model = TorchvisionViT(image_size=16, patch_size=8, num_layers=1, num_heads=1, hidden_dim=8, mlp_dim=8)
    return model.encoder.ln.eps


# -- timm -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw", [
    dict(),
    dict(pool="gap", class_token=False, qkv_bias=False),
    dict(pool="gap", pos_embed="sincos2d", img_size=(32, 48)),
    dict(hybrid_layers=(), patch_size=2),  # a stem-only hybrid: timm's vit_tiny_r_s16_p8_224
])
def test_timm_state_dict_loads_strictly_with_equal_logits(tmp_path, kw):
    model = tiny(**kw)
    path, _ = export(model, tmp_path / "timm.safetensors", "timm")
    arch, kwargs, _ = timm_args(model.cfg)
    theirs = timm.create_model(arch, pretrained=False, **kwargs).eval()
    theirs.load_state_dict(load_file(path), strict=True)
    x = torch.randn(2, 3, *model.cfg.img_hw)
    torch.testing.assert_close(logits(theirs, x), logits(model, x), atol=ATOL, rtol=0)


def test_timm_refuses_pre_logits(tmp_path):
    with pytest.raises(WeightsError, match="pre-logits"):
        export(tiny(representation_size=16), tmp_path / "t.safetensors", "timm")


# -- torch.hub ------------------------------------------------------------------------------------------------


def test_torch_hub_load_local_checkout(tmp_path):
    names = {n for n in dir(_hubconf()) if not n.startswith("_") and callable(getattr(_hubconf(), n))}
    assert {"vit_ti16", "vit_s16", "vit_s32", "vit_b8", "vit_b16", "vit_b32", "vit_l16", "vit_l32", "vit_h14",
            "r50_vit_b16"} <= names and len(names) == len(vitlab.list_models())
    small = dict(depth=1, embed_dim=32, num_heads=2, mlp_dim=64, img_size=32, num_classes=3)
    model = torch.hub.load(str(REPO), "vit_b16", source="local", **small)
    assert isinstance(model, VisionTransformer) and model.cfg.patch_size == 16 and model.cfg.depth == 1
    trained = perturb_(vitlab.create_model("ViT-B/16", **small)).eval()
    vitlab.save_weights(trained, tmp_path / "w.safetensors")
    loaded = torch.hub.load(str(REPO), "vit_b16", source="local", weights=str(tmp_path / "w.safetensors"), **small)
    x = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(logits(loaded.eval(), x), logits(trained, x), atol=0, rtol=0)


def _hubconf():
    import importlib.util

    spec = importlib.util.spec_from_file_location("vitlab_hubconf", REPO / "hubconf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
