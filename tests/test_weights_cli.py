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


def test_convert_to_other_libraries(tmp_path, capsys):
    """--to hf / torchvision / timm / npz / vitlab from one vitlab file; each loads in its library with equal logits."""
    from safetensors.torch import load_file
    from torchvision.models.vision_transformer import VisionTransformer as TorchvisionViT
    from transformers import ViTForImageClassification

    from vitlab.weights.preprocess_files import torchvision_classification

    model = perturb_(vitlab.create_model("ViT-Ti/16", embed_dim=64, depth=2, num_heads=4, mlp_dim=128, img_size=32,
                                         patch_size=8, num_classes=3)).eval()
    model.preprocess = torchvision_classification(32, 36)
    src = vitlab.save_weights(model, tmp_path / "ours.safetensors", {"class_names": ["a", "b", "c"]})
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)

    assert main(["convert", str(src), str(tmp_path / "hf"), "--to", "hf"]) == 0
    assert "ViTForImageClassification.from_pretrained" in capsys.readouterr().out
    assert (tmp_path / "hf" / "preprocessor_config.json").exists()
    hf = ViTForImageClassification.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.id2label == {0: "a", 1: "b", 2: "c"}
    with torch.no_grad():
        torch.testing.assert_close(hf(pixel_values=x).logits, expected, atol=1e-5, rtol=0)

    assert main(["convert", str(src), str(tmp_path / "tv.pth"), "--to", "torchvision"]) == 0
    assert "image_size=32, patch_size=8, num_layers=2" in capsys.readouterr().out
    tv = TorchvisionViT(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128,
                        num_classes=3).eval()
    tv.load_state_dict(torch.load(tmp_path / "tv.pth", weights_only=True))
    with torch.no_grad():
        torch.testing.assert_close(tv(x), expected, atol=1e-5, rtol=0)

    assert main(["convert", str(src), str(tmp_path / "timm.safetensors"), "--to", "timm"]) == 0
    assert "timm.create_model('vit_base_patch8_224'" in capsys.readouterr().out
    theirs = TimmViT(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=3)
    theirs.load_state_dict(load_file(tmp_path / "timm.safetensors"))
    with torch.no_grad():
        torch.testing.assert_close(theirs.eval()(x), expected, atol=1e-5, rtol=0)

    for to, name in (("npz", "g.npz"), ("vitlab", "v.safetensors")):
        assert main(["convert", str(src), str(tmp_path / name), "--to", to]) == 0
        with torch.no_grad():
            torch.testing.assert_close(vitlab.load_model(tmp_path / name)(x), expected, atol=1e-5, rtol=0)
    capsys.readouterr()
    assert main(["convert", str(src), str(tmp_path / "g2.safetensors"), "--to", "npz"]) == 1
    assert "--to npz writes a .npz file" in capsys.readouterr().err


def test_convert_refusals_say_why(tmp_path, capsys):
    hybrid = vitlab.create_model("ViT-Ti/16", embed_dim=64, depth=1, num_heads=4, mlp_dim=128, img_size=32,
                                 patch_size=1, hybrid_layers=(), num_classes=3)
    src = vitlab.save_weights(hybrid, tmp_path / "hybrid.safetensors")
    for to, dst in (("hf", "hf"), ("torchvision", "tv.pth")):
        assert main(["convert", str(src), str(tmp_path / dst), "--to", to]) == 1
        err = capsys.readouterr().err
        assert "hybrid" in err and "Traceback" not in err and not (tmp_path / dst).exists()
    pre = vitlab.create_model("ViT-Ti/16", embed_dim=64, depth=1, num_heads=4, mlp_dim=128, img_size=32,
                              patch_size=8, num_classes=3, representation_size=32)
    src = vitlab.save_weights(pre, tmp_path / "pre.safetensors")
    assert main(["convert", str(src), str(tmp_path / "hf"), "--to", "hf"]) == 1
    assert "pre-logits" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    assert main(["convert", str(tmp_path / "hybrid.safetensors"), str(tmp_path / "full"), "--to", "hf"]) == 1
    assert "already exists" in capsys.readouterr().err
