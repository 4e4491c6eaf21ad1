"""timm checkpoints in, and our .npz read by timm's own vit_jax reader: logits against timm's, fp32 1e-4."""

import functools

import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.models.vision_transformer import VisionTransformer as TimmViT
from timm.models.vision_transformer import _load_weights as timm_load_npz

import vitlab
from vitlab.weights import WeightsError

from .conftest import perturb_

ATOL = 1e-4


def timm_vit(img_size=32, patch_size=8, num_classes=7, global_pool="token", class_token=True, **kw):
    kw = dict(img_size=img_size, patch_size=patch_size, embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0,
              num_classes=num_classes, global_pool=global_pool, class_token=class_token,
              norm_layer=functools.partial(torch.nn.LayerNorm, eps=1e-6), **kw)
    if global_pool == "avg":
        kw.setdefault("fc_norm", False)  # Google's 'gap': LayerNorm before pooling, as ours
    return perturb_(TimmViT(**kw)).eval()


@pytest.mark.parametrize("suffix", [".pth", ".safetensors", ".bin"])
def test_timm_state_dict_files_load_and_match(tmp_path, suffix):
    theirs = timm_vit()
    path = tmp_path / f"timm{suffix}"
    if suffix == ".safetensors":
        save_file(theirs.state_dict(), str(path))
    else:
        torch.save(theirs.state_dict(), path)
    ours, report = vitlab.load_model(path, return_report=True, num_heads=4)
    assert report.format == "timm" and report.ok
    assert report.inferred["embed_dim"] == 64 and report.inferred["depth"] == 2 and report.inferred["img_size"] == 32
    x = torch.randn(3, 3, 32, 32)
    torch.testing.assert_close(ours(x), theirs(x), atol=ATOL, rtol=0)


@pytest.mark.parametrize("kw", [dict(img_size=(32, 48)), dict(global_pool="avg", class_token=False),
                                dict(in_chans=1, img_size=28, patch_size=4)])
def test_timm_variants_into_existing_model(tmp_path, kw):
    theirs = timm_vit(**kw)
    torch.save({"state_dict": theirs.state_dict(), "epoch": 3}, tmp_path / "ckpt.pth")  # a training checkpoint
    cfg = dict(embed_dim=64, depth=2, num_heads=4, mlp_dim=128, num_classes=7, img_size=kw.get("img_size", 32),
               patch_size=kw.get("patch_size", 8), in_chans=kw.get("in_chans", 3))
    if not kw.get("class_token", True):
        cfg.update(class_token=False, pool="gap")
    ours = vitlab.create_model("ViT-Ti/16", **cfg).eval()
    report = vitlab.load_weights(ours, tmp_path / "ckpt.pth")
    assert report.ok
    x = torch.randn(2, ours.cfg.in_chans, *ours.cfg.img_hw)
    torch.testing.assert_close(ours(x), theirs(x), atol=ATOL, rtol=0)


def test_timm_registry_model_heads_come_from_the_variant_table(tmp_path):
    theirs = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, img_size=64, depth=2)
    perturb_(theirs).eval()
    save_file(theirs.state_dict(), str(tmp_path / "t.safetensors"))
    ours, report = vitlab.load_model(tmp_path / "t.safetensors", return_report=True)
    assert ours.cfg.embed_dim == 192 and ours.cfg.num_heads == 3 and ours.cfg.img_size == 64
    assert any("num_heads=3" in m for m in report.messages)  # says it took the heads from the table
    x = torch.randn(2, 3, 64, 64)
    torch.testing.assert_close(ours(x), theirs(x), atol=ATOL, rtol=0)


def test_bicubic_resampling_on_load_matches_timm(tmp_path):
    """Load a 4x4-grid timm checkpoint into a 6x8-grid model: same as timm's own resample + load."""
    theirs = timm_vit()
    torch.save(theirs.state_dict(), tmp_path / "t.pth")
    ours = vitlab.create_model("ViT-Ti/16", embed_dim=64, depth=2, num_heads=4, mlp_dim=128, num_classes=7,
                               img_size=(48, 64), patch_size=8).eval()
    report = vitlab.load_weights(ours, tmp_path / "t.pth")
    assert "4x4 -> 6x8 (bicubic)" in report.resampled["pos_embed"]
    big = timm_vit(img_size=(48, 64))
    sd = theirs.state_dict()
    sd["pos_embed"] = timm.layers.resample_abs_pos_embed(sd["pos_embed"], (6, 8), num_prefix_tokens=1)
    big.load_state_dict(sd)
    x = torch.randn(2, 3, 48, 64)
    torch.testing.assert_close(ours(x), big(x), atol=ATOL, rtol=0)


def test_timm_options_we_do_not_have_are_refused(tmp_path):
    theirs = timm_vit(qk_norm=True)  # QK normalisation: no ViT family of issue 33 uses it
    torch.save(theirs.state_dict(), tmp_path / "qknorm.pth")
    with pytest.raises(WeightsError, match="QK normalisation"):
        vitlab.load_model(tmp_path / "qknorm.pth", num_heads=4)


@pytest.mark.parametrize("kw", [dict(), dict(img_size=(32, 48)), dict(pool="gap", class_token=False)])
def test_our_npz_is_read_by_timm(tmp_path, kw):
    """timm's official-checkpoint reader (`_load_weights`) accepts our .npz and computes the same logits."""
    ours = perturb_(vitlab.create_model("ViT-Ti/16", embed_dim=64, depth=2, num_heads=4, mlp_dim=128, num_classes=7,
                                        **{"img_size": 32, "patch_size": 8, **kw})).eval()
    path = vitlab.save_weights(ours, tmp_path / "ours.npz")
    theirs = TimmViT(img_size=ours.cfg.img_size, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0,
                     num_classes=7, class_token=ours.cfg.class_token, global_pool=kw.get("pool", "token")
                     .replace("gap", "avg"), fc_norm=False).eval()
    with torch.no_grad():
        timm_load_npz(theirs, str(path))
    x = torch.randn(3, 3, *ours.cfg.img_hw)
    torch.testing.assert_close(theirs(x), ours(x), atol=ATOL, rtol=0)


def test_non_square_checkpoint_into_another_grid_needs_its_grid(tmp_path):
    theirs = timm_vit(img_size=(32, 48))
    torch.save(theirs.state_dict(), tmp_path / "t.pth")
    ours = vitlab.create_model("ViT-Ti/16", embed_dim=64, depth=2, num_heads=4, mlp_dim=128, num_classes=7,
                               img_size=(48, 48), patch_size=8).eval()
    with pytest.raises(vitlab.weights.ShapeMismatchError, match=r"checkpoint_grid=\(gh, gw\)"):
        vitlab.load_weights(ours, tmp_path / "t.pth")
    report = vitlab.load_weights(ours, tmp_path / "t.pth", checkpoint_grid=(4, 6))
    assert "4x6 -> 6x6" in report.resampled["pos_embed"]
    expected = timm.layers.resample_abs_pos_embed(theirs.pos_embed, (6, 6), (4, 6), num_prefix_tokens=1)
    torch.testing.assert_close(ours.pos_embed, expected)
