"""The original DINOv2 layout (vitlab.weights.dinov2) against DINOv2's own model code and against timm.

tests/fixtures/dinov2/*.pth were written by facebookresearch/dinov2's `DinoVisionTransformer` (make_fixtures.py:
tiny width 16, patch 7, 3 x 3 grid; MLP; 4 registers; SwiGLU FFN in 2 block chunks), with its outputs (the
normalised class token) at the native size and at two others, where its `interpolate_pos_encoding` resampled the
table (offset 0.1 without registers, antialiased with them). The published widths' head table is checked on
original-layout files made from timm's `vit_small_patch14_*dinov2` by the inverse of our conversion."""

from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from timm.models.vision_transformer import checkpoint_filter_fn

import vitlab
from vitlab.weights import dinov2
from vitlab.weights.checkpoint import read_checkpoint
from vitlab.weights.report import WeightsError

FIXTURES = Path(__file__).parent / "fixtures" / "dinov2"
NAMES = ("mlp", "reg4", "swiglu_chunked")
SIZES = {"native": (21, 21), "up": (28, 28), "nonsquare": (14, 35)}
ATOL = 1e-4


@pytest.fixture(scope="module")
def expected():
    return dict(np.load(FIXTURES / "expected.npz"))


def run(model, expected, name, size):
    x = torch.from_numpy(expected[f"x_{size}"]).float()
    with torch.no_grad():
        got = model(x)
    want = torch.from_numpy(expected[f"{name}_{size}"])
    torch.testing.assert_close(got, want, atol=ATOL, rtol=ATOL)
    return (got - want).abs().max().item()


@pytest.mark.parametrize("name", NAMES)
def test_dinov2_own_outputs_at_every_size(name, expected):
    """One model, DINOv2's inputs at its own size and two others (resampled on the fly in the forward)."""
    model, report = vitlab.load_model(FIXTURES / f"{name}.pth", num_heads=2, return_report=True)
    assert report.format == "dinov2"
    cfg = model.cfg
    assert (cfg.patch_size, cfg.img_size, cfg.layer_norm_eps, cfg.num_classes, cfg.pool) == (7, 21, 1e-6, 0, "token")
    assert (cfg.reg_tokens, cfg.no_embed_class) == ((4, True) if name == "reg4" else (0, False))
    assert (cfg.mlp, cfg.act) == (("swiglu", "silu") if name.startswith("swiglu") else ("mlp", "gelu"))
    assert cfg.pos_embed_resize == ("bicubic" if name == "reg4" else "dinov2")
    assert cfg.layer_scale is not None
    for size in SIZES:
        run(model, expected, name, size)


@pytest.mark.parametrize("name", NAMES)
def test_loaded_at_another_size(name, expected):
    """load_model(img_size=...) resamples the stored table once, with the checkpoint's mode ("dinov2"; "bicubic" for
    registers, whose table has no prefix rows)."""
    for size, hw in (("up", 28), ("nonsquare", (14, 35))):
        run(vitlab.load_model(FIXTURES / f"{name}.pth", num_heads=2, img_size=hw), expected, name, size)


def test_the_resampling_mode_matters(expected):
    """timm's antialiased bicubic is not DINOv2's offset bicubic: the fixture tells them apart."""
    model = vitlab.load_model(FIXTURES / "mlp.pth", num_heads=2, pos_embed_resize="bicubic", img_size=28)
    with pytest.raises(AssertionError):
        run(model, expected, "mlp", "up")


@pytest.mark.parametrize("name", ["mlp", "reg4"])
def test_conversion_is_timms(name):
    """Our tensors are those timm's own filter (checkpoint_filter_fn -> _convert_dinov2) makes of the file."""
    state = torch.load(FIXTURES / f"{name}.pth", weights_only=True)
    timm_model = timm.create_model("vit_small_patch14_reg4_dinov2" if name == "reg4" else "vit_small_patch14_dinov2",
                                   pretrained=False, depth=2, embed_dim=16, num_heads=2, patch_size=7, img_size=21)
    theirs = checkpoint_filter_fn(dict(state), timm_model)
    ours = dinov2.convert(state, name).state
    assert sorted(ours) == sorted(theirs)
    for k in ours:
        assert torch.equal(ours[k], theirs[k]), k


def test_without_heads_refused():
    with pytest.raises(WeightsError, match=r"num_heads.*pass num_heads=\.\.\. to load_model"):
        vitlab.load_model(FIXTURES / "mlp.pth")


def _to_original(state, regs, rng):
    """Inverse of dinov2.convert (timm names -> the hub layout), for a timm model: registers give the class row of
    the table back (any split of cls_token into class token + row is the same model: a random one), w12/w3 names for
    SwiGLU, a mask_token."""
    out = {}
    for k, v in state.items():
        out[k.replace("mlp.fc1.", "mlp.w12.").replace("mlp.fc2.", "mlp.w3.") if "swiglu" in rng["kind"] else k] = v
    if regs:
        row = torch.randn(1, 1, state["cls_token"].shape[-1], generator=rng["gen"])
        out["register_tokens"] = out.pop("reg_token")
        out["cls_token"] = state["cls_token"] - row
        out["pos_embed"] = torch.cat([row, state["pos_embed"]], dim=1)
    out["mask_token"] = torch.randn(1, state["cls_token"].shape[-1], generator=rng["gen"])
    return out


@pytest.mark.parametrize("kind", ["plain", "reg4", "reg4_swiglu"])
def test_published_width_gets_its_heads(tmp_path, kind):
    """Width 384 (vit_small): 6 heads from DINOv2's table, no keyword needed; timm's model as the reference."""
    torch.manual_seed(0)
    arch = "vit_small_patch14_dinov2" if kind == "plain" else "vit_small_patch14_reg4_dinov2"
    extra = dict(mlp_layer=timm.layers.SwiGLUPacked, act_layer=torch.nn.SiLU, mlp_ratio=2.0) if "swiglu" in kind else {}
    ref = timm.create_model(arch, pretrained=False, depth=1, img_size=28, **extra).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.2 * torch.randn_like(p))
    path = tmp_path / "dinov2_vits14_pretrain.pth"
    torch.save(_to_original(ref.state_dict(), "reg" in kind, {"kind": kind, "gen": torch.Generator().manual_seed(1)}),
               path)
    ours, report = vitlab.load_model(path, return_report=True)
    assert ours.cfg.num_heads == 6 and "vit_small" in report.sources["num_heads"]
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=ATOL)


def test_refusals(tmp_path):
    state = torch.load(FIXTURES / "mlp.pth", weights_only=True)
    with pytest.raises(WeightsError, match=r"attn\.q_norm\.weight' has no place"):
        dinov2.convert({**state, "blocks.0.attn.q_norm.weight": torch.ones(8)}, "x")
    with pytest.raises(WeightsError, match=r"blocks\.0\.mlp\.fc1\.bias"):
        dinov2.convert({k: v for k, v in state.items() if not k.endswith("mlp.fc1.bias")}, "x")
    with pytest.raises(WeightsError, match="mixes chunked"):
        dinov2.convert({**state, "blocks.0.0.norm1.weight": torch.ones(16)}, "x")
    with pytest.raises(WeightsError, match="not a square grid"):
        dinov2.convert({**state, "pos_embed": state["pos_embed"][:, :-1]}, "x")
    chunked = torch.load(FIXTURES / "swiglu_chunked.pth", weights_only=True)
    ckpt_dir = tmp_path / "ckpt.pth"
    torch.save({"model": chunked}, ckpt_dir)  # nested as training scripts save it: unwrapped, still detected
    assert read_checkpoint(ckpt_dir).format == "dinov2"
    assert "mask_token" not in read_checkpoint(ckpt_dir).state
