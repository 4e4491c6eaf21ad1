"""The later ViT families against timm, both ways, at random init with every tensor perturbed.

Each row builds timm's own model for a family (the architecture timm registers, shrunk by keyword arguments), then:
- its bare state dict loads into vitlab (`load_model`, with exactly the fields the tensors cannot fix passed, and
  a refusal naming the first of them when they are not) and computes timm's outputs to 1e-5;
- vitlab's `export(..., to="timm")` of that model is rebuilt by `timm.create_model(arch, **kwargs)` from the header
  it writes, loads strictly and computes the same outputs.
"""

import json

import pytest
import timm
import torch
from safetensors import safe_open

import vitlab
from vitlab.weights import WeightsError
from vitlab.weights.publish import export

from .conftest import perturb_

SMALL = dict(img_size=28, patch_size=7, embed_dim=192, depth=2, num_heads=3, num_classes=5)  # width: ViT-Ti's
# family -> (timm architecture, its extra kwargs, the fields a bare state dict does not fix, the field refused first)
FAMILIES = {
    "augreg": ("vit_base_patch16_224", {}, {}, None),
    "deit_distilled": ("deit_base_distilled_patch16_224", {}, {}, None),
    "deit3": ("deit3_base_patch16_224", {}, {}, None),
    "mae_features": ("vit_base_patch16_224.mae", {"num_classes": 0}, {}, None),
    "dinov2": ("vit_base_patch14_dinov2", {}, {}, None),
    "dinov2_reg4": ("vit_base_patch14_reg4_dinov2", {}, {}, None),
    "dinov2_giant_swiglu": ("vit_giant_patch14_dinov2", {"mlp_ratio": 2.0}, {}, None),
    "clip_openai": ("vit_base_patch16_clip_quickgelu_224", {}, {"act": "quick_gelu"}, "act"),
    "clip_laion": ("vit_base_patch16_clip_224", {}, {"act": "gelu"}, "act"),
    "siglip_map": ("vit_base_patch16_siglip_224", {}, {"act": "gelu", "num_heads": 3}, "num_heads"),
    "siglip2_gap_tanh": ("vit_base_patch32_siglip_gap_256", {}, {"act": "gelu_tanh", "num_heads": 3}, "num_heads"),
    "gap_fc_norm": ("vit_base_patch16_224", {"global_pool": "avg", "fc_norm": True}, {}, None),
    "gap16": ("vit_base_patch16_gap_224", {}, {"act": "gelu", "num_heads": 3}, "num_heads"),
}


def _timm_model(arch: str, extra: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    kw = {**SMALL, **extra}
    model = timm.create_model(arch, pretrained=False, **kw)
    return perturb_(model, scale=0.05).eval()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_timm_state_dict_loads_exactly(tmp_path, family):
    arch, extra, unfixed, refused = FAMILIES[family]
    theirs = _timm_model(arch, extra)
    torch.save(theirs.state_dict(), tmp_path / "model.pth")
    x = torch.randn(2, 3, 28, 28)
    if refused is not None:  # the tensors do not fix it: refused, the argument named, nothing guessed
        with pytest.raises(WeightsError, match=f"{refused}="):
            vitlab.load_model(tmp_path / "model.pth")
    ours, report = vitlab.load_model(tmp_path / "model.pth", return_report=True, **unfixed)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.forward_features(x), theirs.forward_features(x), atol=1e-5, rtol=1e-5)
        ours.prune_last_block = True  # what vitlab.optimize's copies run: the last block for the head's tokens only
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)
    assert report.ok and all(report.sources.get(k) == "load_model argument" for k in unfixed)
    assert {"num_heads", "act", "layer_norm_eps", "mlp_dim"} <= set(report.sources)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_export_to_timm_is_rebuilt_by_timm(tmp_path, family):
    arch, extra, unfixed, _ = FAMILIES[family]
    theirs = _timm_model(arch, extra)
    torch.save(theirs.state_dict(), tmp_path / "model.pth")
    ours = vitlab.load_model(tmp_path / "model.pth", **unfixed)
    export(ours, tmp_path / "out.safetensors", to="timm")
    with safe_open(str(tmp_path / "out.safetensors"), "pt") as f:
        header = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    rebuilt = timm.create_model(header["timm.architecture"], pretrained=False, **json.loads(header["timm.kwargs"]))
    rebuilt.load_state_dict(tensors, strict=True)
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.eval()(x), ours(x), atol=1e-5, rtol=1e-5)


def test_distilled_training_returns_both_heads():
    theirs = _timm_model("deit_base_distilled_patch16_224", {})
    model = vitlab.create_model("ViT-B/16", distilled=True, **SMALL, mlp_dim=768)
    model.load_state_dict(theirs.state_dict())
    model.train()
    theirs.train()
    theirs.set_distilled_training(True)
    model.distilled_training = True
    x = torch.randn(2, 3, 28, 28)
    ours_cls, ours_dist = model(x)
    theirs_cls, theirs_dist = theirs(x)
    torch.testing.assert_close(ours_cls, theirs_cls)
    torch.testing.assert_close(ours_dist, theirs_dist)
    model.eval()
    assert model(x).shape == (2, 5)  # averaged at inference
