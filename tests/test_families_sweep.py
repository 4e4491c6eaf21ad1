"""Issue 33's own check, as a new user would run it: 23 ViT-family architectures built by timm at random init
(shrunk to depth 2, width 96, every tensor perturbed), saved the ways users hold them, loaded by vitlab, outputs
compared with timm's.

- timm's Hub folder (`save_for_hf`: config.json with the architecture and the model_args): loads with no argument,
  exact (1e-5), or is refused with one line naming what vitlab's model lacks (BEiT's relative position bias).
- The bare state dict (`.safetensors` / `.pth`): loads exactly, or is refused with one line naming ONE field and the
  `load_model` argument that sets it. The test answers each refusal as a user would, with the true value (read
  from the Hub folder's load), until it loads: every refusal names a field the tensors really do not fix, and no
  load is silently wrong.
- `vitlab.weights.publish.export(..., to="timm")` is rebuilt by `timm.create_model` from the header it writes.
"""

import json
import re

import pytest
import timm
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from timm.models._hub import save_for_hf

import vitlab
from vitlab.weights import WeightsError
from vitlab.weights.publish import export

# architecture -> the reason the Hub folder is refused (None: it loads)
ARCHS = {
    "vit_base_patch16_224.augreg_in21k": None,  # AugReg: the paper's ViT
    "vit_base_patch16_gap_224": None,  # 16 heads at 768 without a class token
    "vit_medium_patch16_gap_256": None,
    "vit_so400m_patch14_siglip_gap_224": None,  # SigLIP So400m, GAP
    "vit_base_patch32_siglip_gap_256": None,  # SigLIP2: tanh GELU
    "vit_base_patch16_siglip_224": None,  # SigLIP: MAP head
    "vit_base_patch16_siglip_256": None,
    "deit_base_distilled_patch16_224": None,  # distillation token
    "deit3_base_patch16_224": None,  # LayerScale, table without the class row
    "vit_base_patch16_224.mae": None,
    "vit_base_patch14_dinov2": None,
    "vit_base_patch14_reg4_dinov2": None,  # registers
    "vit_giant_patch14_dinov2": None,  # SwiGLU
    "vit_base_patch16_clip_224": None,  # LAION CLIP: norm_pre, eps 1e-5
    "vit_base_patch16_clip_quickgelu_224": None,  # OpenAI CLIP: QuickGELU
    "vit_base_patch16_plus_clip_240": None,
    "flexivit_base": None,  # a table without the class row
    "vit_betwixt_patch16_reg4_gap_256": None,  # SBB: registers, GAP
    "eva02_base_patch14_224": None,  # RoPE, SwiGLU with sub-LN
    "vit_small_patch16_dinov3": None,  # RoPE, registers
    "vit_base_patch16_rope_reg1_gap_256": None,  # SBB with RoPE
    "vit_large_patch14_clip_224": None,
    "beit_base_patch16_224": "relative position bias",
}


# What no tensor stores (so a bare file may be refused for it); everything else must come from the shapes.
UNSTORED = {"num_heads", "act", "layer_norm_eps", "no_embed_class", "pool", "rope", "rope_ref_grid", "rope_theta"}


def _build(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)
    patch = 14 if "patch14" in arch else 32 if "patch32" in arch else 16
    kw = dict(depth=2, embed_dim=96, num_heads=3, img_size=4 * patch, num_classes=5)
    if "mae" in arch:
        kw["num_classes"] = 0
    model = timm.create_model(arch, pretrained=False, **kw)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # every parameter; not the buffers (timm's RoPE tables and zero key bias are no weights)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


def _load_answering(path, truth: vitlab.models.config.ViTConfig | None) -> tuple:
    """load_model(path), answering each one-field refusal with the true value; returns (model, fields asked)."""
    asked: dict = {}
    for _ in range(6):
        try:
            return vitlab.load_model(path, **asked), asked
        except WeightsError as e:
            msg = str(e)
            assert "\n" not in msg, f"a refusal is one line: {msg!r}"
            m = re.search(r"pass (\w+)=", msg)
            assert m and truth is not None, f"refused without naming a load_model argument: {msg}"
            field = m.group(1)
            assert field not in asked, f"{field} asked twice: {msg}"
            asked[field] = getattr(truth, field)
    raise AssertionError(f"still refused after {asked}")


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_family_loads_exactly_from_every_format(tmp_path, arch):
    theirs = _build(arch)
    side = theirs.patch_embed.img_size[0] if hasattr(theirs.patch_embed, "img_size") else 64
    x = torch.randn(2, 3, side, side)
    with torch.no_grad():
        want = theirs(x)
    save_for_hf(theirs, tmp_path / "hub", safe_serialization=True)
    refused = ARCHS[arch]
    if refused is not None:
        with pytest.raises(WeightsError, match=refused):
            vitlab.load_model(tmp_path / "hub")
        return
    hub_model, report = vitlab.load_model(tmp_path / "hub", return_report=True)
    with torch.no_grad():
        torch.testing.assert_close(hub_model(x), want, atol=1e-5, rtol=1e-5)
    assert report.sources.get("num_heads") and report.sources.get("act")

    save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, str(tmp_path / "bare.safetensors"))
    torch.save(theirs.state_dict(), tmp_path / "bare.pth")
    for bare in ("bare.safetensors", "bare.pth"):
        ours, asked = _load_answering(tmp_path / bare, hub_model.cfg)
        with torch.no_grad():
            torch.testing.assert_close(ours(x), want, atol=1e-5, rtol=1e-5)
        assert set(asked) <= UNSTORED, f"asked for {set(asked) - UNSTORED}, which the tensors do fix"


@pytest.mark.parametrize("arch", sorted(a for a, why in ARCHS.items() if why is None))
def test_family_exports_to_timm(tmp_path, arch):
    theirs = _build(arch)
    save_for_hf(theirs, tmp_path / "hub", safe_serialization=True)
    ours = vitlab.load_model(tmp_path / "hub")
    try:
        export(ours, tmp_path / "out.safetensors", to="timm")
    except WeightsError as e:  # timm has no architecture that computes it: said in one line
        assert "\n" not in str(e) and "cannot write" in str(e)
        pytest.skip(f"timm cannot hold it: {e}")
    with safe_open(str(tmp_path / "out.safetensors"), "pt") as f:
        header = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    rebuilt = timm.create_model(header["timm.architecture"], pretrained=False, **json.loads(header["timm.kwargs"]))
    rebuilt.load_state_dict(tensors, strict=True)
    side = ours.cfg.img_hw[0]
    x = torch.randn(2, 3, side, side)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.eval()(x), ours(x), atol=1e-5, rtol=1e-5)
    reread = vitlab.load_model(tmp_path / "out.safetensors")  # its header is its config: no argument needed
    with torch.no_grad():
        torch.testing.assert_close(reread(x), ours(x), atol=1e-5, rtol=1e-5)
