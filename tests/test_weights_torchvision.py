"""torchvision ViT state dicts (vit_b_16-shaped, small) against torchvision's own outputs, fp32 1e-4."""

import pytest
import torch
from torchvision.models.vision_transformer import VisionTransformer as TVViT

import vitlab

from .conftest import perturb_

ATOL = 1e-4


def tv_vit(**kw):
    base = dict(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=6)
    return perturb_(TVViT(**{**base, **kw})).eval()


def test_torchvision_state_dict_loads_and_matches(tmp_path):
    theirs = tv_vit()
    torch.save(theirs.state_dict(), tmp_path / "tv.pth")
    ours, report = vitlab.load_model(tmp_path / "tv.pth", return_report=True, num_heads=4)
    assert report.format == "torchvision" and report.ok
    assert report.inferred["img_size"] == 32 and report.inferred["num_classes"] == 6
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=ATOL, rtol=0)


def test_torchvision_representation_size_and_resampling(tmp_path):
    """heads.pre_logits -> pre_logits.fc; loading at 48x48 with "jax" resampling equals torchvision's own
    `interpolate_embeddings` (bilinear with align_corners=True, as scipy.ndimage.zoom(order=1))."""
    theirs = tv_vit(representation_size=24)
    torch.save(theirs.state_dict(), tmp_path / "tv.pth")
    ours = vitlab.load_model(tmp_path / "tv.pth", num_heads=4)
    assert ours.cfg.representation_size == 24
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=ATOL, rtol=0)
    from torchvision.models.vision_transformer import interpolate_embeddings

    big = tv_vit(representation_size=24, image_size=48)
    big.load_state_dict(interpolate_embeddings(48, 8, theirs.state_dict(), interpolation_mode="bilinear"))
    ours48 = vitlab.load_model(tmp_path / "tv.pth", num_heads=4, img_size=48, pos_embed_resize="jax")
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        torch.testing.assert_close(ours48(x), big(x), atol=ATOL, rtol=0)


@pytest.mark.parametrize("mlp_names", ["new", "legacy"])
def test_old_mlp_names(tmp_path, mlp_names):
    theirs = tv_vit()
    sd = theirs.state_dict()
    if mlp_names == "legacy":  # torchvision < 0.13 named the MLP layers linear_1 / linear_2
        sd = {k.replace("mlp.0.", "mlp.linear_1.").replace("mlp.3.", "mlp.linear_2."): v for k, v in sd.items()}
    torch.save(sd, tmp_path / "tv.pth")
    ours = vitlab.load_model(tmp_path / "tv.pth", num_heads=4)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=ATOL, rtol=0)
