"""`vitlab convert SRC DST` end to end through the real CLI entry point."""

import torch
from timm.models.vision_transformer import VisionTransformer as TimmViT

import vitlab
from vitlab.cli import main

from .conftest import perturb_


def test_convert_timm_to_npz_to_safetensors(tmp_path, capsys):
    theirs = perturb_(TimmViT(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0,
                              num_classes=5)).eval()
    torch.save(theirs.state_dict(), tmp_path / "timm.pth")
    assert main(["convert", str(tmp_path / "timm.pth"), str(tmp_path / "g.npz"), "--num-heads", "4"]) == 0
    out = capsys.readouterr().out
    assert "(timm)" in out and "inferred:" in out and "wrote" in out
    assert main(["convert", str(tmp_path / "g.npz"), str(tmp_path / "ours.safetensors"), "--img-size", "48"]) == 0
    model = vitlab.load_model(tmp_path / "ours.safetensors")
    assert model.cfg.img_size == 48 and model.cfg.num_heads == 4  # heads now read from the npz kernels
    meta = vitlab.weights.read_metadata(tmp_path / "ours.safetensors")
    assert meta["converted_from"]["format"] == "npz"
    small = vitlab.load_model(tmp_path / "g.npz")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(small(x), theirs(x), atol=1e-4, rtol=0)
    # --img-size 48 from an .npz: the table resampled with Google's "jax" mode, class row kept
    expected = vitlab.resample_pos_embed(small.pos_embed, (6, 6), (4, 4), 1, "jax")
    torch.testing.assert_close(model.pos_embed, expected)


def test_convert_refuses_to_overwrite(tmp_path, capsys):
    model = perturb_(vitlab.create_model("ViT-Ti/16", embed_dim=64, depth=1, num_heads=4, mlp_dim=128, img_size=16,
                                         patch_size=8, num_classes=3))
    src = vitlab.save_weights(model, tmp_path / "a.safetensors")
    dst = tmp_path / "b.npz"
    dst.write_bytes(b"precious")
    assert main(["convert", str(src), str(dst)]) == 1
    assert "already exists" in capsys.readouterr().err and dst.read_bytes() == b"precious"
    assert main(["convert", str(src), str(dst), "--force"]) == 0
    assert vitlab.load_model(dst).cfg.depth == 1
    assert main(["convert", str(tmp_path / "missing.pth"), str(tmp_path / "c.npz")]) == 1
    assert "no checkpoint at" in capsys.readouterr().err
    assert main(["convert", str(src), str(tmp_path / "c.onnx")]) == 1
    assert ".safetensors (vitlab) or .npz" in capsys.readouterr().err
