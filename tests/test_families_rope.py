"""The RoPE families (EVA-02, DINOv3; vitlab.models.rope) against the libraries they come from, at random init with
every parameter perturbed, fp32, to 1e-4, at the model's own input size and at a second one:

- timm's eva.py models (eva02_*, vit_*_dinov3*, shrunk by keyword arguments): a bare state dict (refused, naming each
  field the tensors leave open, until it is passed) and a timm Hub folder (`save_for_hf`: the architecture fixes
  every field); every Eva row of vitlab's timm table either loads to timm's outputs or is refused by name;
- transformers' DINOv3ViTModel from a `save_pretrained` folder;
- `export(..., to="timm")` of each is rebuilt by `timm.create_model(arch, **kwargs)` with the same outputs;
- the paper's ViT (no rope) still computes bit-identically what timm's VisionTransformer computes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from torch import nn

import vitlab
from vitlab.models.config import ViTConfig
from vitlab.weights import WeightsError
from vitlab.weights.publish import export
from vitlab.weights.timm_arch import ARCHS, fields_for

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")
hub = pytest.importorskip("timm.models._hub")

TOL = dict(atol=1e-4, rtol=1e-4)
# family -> (timm architecture, its keyword arguments, the model's input size, a second size, the fields a bare
# state dict does not fix, in the order loading asks for them)
EVA02 = dict(rope="eva02", layer_norm_eps=1e-6, rope_ref_grid=(16, 16))
DINOV3 = dict(rope="dinov3", layer_norm_eps=1e-5, pool="gap")
SMALL = dict(embed_dim=192, num_heads=3, depth=2, dynamic_img_size=True)  # ViT-Ti's width: 64-wide heads
FAMILIES: dict[str, tuple[str, dict[str, Any], tuple[int, int], tuple[int, int], dict[str, Any]]] = {
    # packed SwiGLU (GluMlp), fused qkv with q_bias / v_bias; 4x4 grid with the (16, 16) reference grid
    "eva02_tiny": ("eva02_tiny_patch14_224", dict(SMALL, img_size=56), (56, 56), (84, 70), EVA02),
    # unfused q / k / v projections, SwiGLU with sub-LN (fc1_g / fc1_x / norm), a head
    "eva02_base": ("eva02_base_patch14_224", dict(SMALL, img_size=56, num_classes=5), (56, 56), (70, 70), EVA02),
    # 4 registers, LayerScale, no position table, DINOv3's RoPE, no q/k/v biases
    "dinov3_small": ("vit_small_patch16_dinov3", dict(SMALL, img_size=64), (64, 64), (96, 80), DINOV3),
    # SwiGLU aligned to 8 (separate fc1_g / fc1_x), q / v biases
    "dinov3_small_plus_qkvb": ("vit_small_plus_patch16_dinov3_qkvb", dict(SMALL, img_size=64), (64, 64), (80, 96),
                               DINOV3),
}


def _perturb(model: nn.Module, scale: float = 0.05) -> nn.Module:
    """Noise on every parameter (not on buffers: timm's zero key bias and the RoPE tables are no weights)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model.eval()


def _timm(family: str) -> nn.Module:
    arch, kwargs, *_ = FAMILIES[family]
    torch.manual_seed(0)
    return _perturb(timm.create_model(arch, pretrained=False, **kwargs))


def _same(ours: nn.Module, theirs: nn.Module, sizes: tuple[tuple[int, int], ...]) -> list[float]:
    """Outputs and features equal at each size; the largest difference per size."""
    diffs = []
    for h, w in sizes:
        x = torch.randn(2, 3, h, w)
        with torch.no_grad():
            a, b = ours(x), theirs(x)
            torch.testing.assert_close(a, b, **TOL)
            torch.testing.assert_close(ours.forward_features(x), theirs.forward_features(x), **TOL)
            ours.prune_last_block = True  # the last block's queries for the head's tokens alone, turned by RoPE first
            torch.testing.assert_close(ours(x), b, **TOL)
            ours.prune_last_block = False
        diffs.append((a - b).abs().max().item())
    return diffs


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_timm_state_dict_loads_exactly(tmp_path, family):
    _, _, size, other, unfixed = FAMILIES[family]
    theirs = _timm(family)
    torch.save(theirs.state_dict(), tmp_path / "model.pth")
    given: dict[str, Any] = {}
    for name, value in unfixed.items():  # each open field refused by name until it is passed
        with pytest.raises(WeightsError, match=f"does not fix {name} .*pass {name}=") as e:
            vitlab.load_model(tmp_path / "model.pth", **given)
        assert "\n" not in str(e.value)
        given[name] = value
    ours, report = vitlab.load_model(tmp_path / "model.pth", return_report=True, **given)
    _same(ours, theirs, (size, other))
    assert report.ok and all(report.sources[k] == "load_model argument" for k in unfixed)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_timm_hub_folder_loads_exactly(tmp_path, family):
    arch, _, size, other, _ = FAMILIES[family]
    theirs = _timm(family)
    hub.save_for_hf(theirs, tmp_path, safe_serialization=True)
    ours, report = vitlab.load_model(tmp_path, return_report=True)
    _same(ours, theirs, (size, other))
    assert report.sources["rope"].startswith(f"timm architecture {arch}")
    assert ours.cfg.rope == ("eva02" if family.startswith("eva02") else "dinov3")


def test_eva02_needs_its_reference_grid(tmp_path):
    """EVA-02's positions span the pre-training grid: without rope_ref_grid the numbers are not EVA-02's."""
    theirs = _timm("eva02_tiny")
    torch.save(theirs.state_dict(), tmp_path / "model.pth")
    x = torch.randn(2, 3, 56, 56)
    wrong = vitlab.load_model(tmp_path / "model.pth", **{**EVA02, "rope_ref_grid": None})
    with torch.no_grad():
        assert (wrong(x) - theirs(x)).abs().max() > 1e-2


# every Eva architecture of the table, shrunk: loads from a timm Hub folder to timm's outputs, or is refused by name
_EVA_ARCHS = sorted(a for a, row in ARCHS.items() if row["class"] == "Eva")


@pytest.mark.parametrize("arch", _EVA_ARCHS)
def test_every_eva_architecture_loads_or_is_refused(tmp_path, arch):
    try:
        fields = fields_for(arch, None, "config.json")
    except WeightsError as e:
        assert "which vitlab's ViT does not have" in str(e) and "=" in str(e)
        return
    patch = fields["patch_size"][0]
    kwargs = dict(embed_dim=64, num_heads=2, depth=1, img_size=3 * patch, num_classes=3)
    torch.manual_seed(0)
    theirs = _perturb(timm.create_model(arch, pretrained=False, **kwargs))
    hub.save_for_hf(theirs, tmp_path, safe_serialization=True)
    ours = vitlab.load_model(tmp_path)
    _same(ours, theirs, ((3 * patch, 3 * patch),))


def test_eva_refusals_name_the_argument():
    with pytest.raises(WeightsError, match=r"scale_attn_inner=True"):
        fields_for("eva02_base_patch16_clip_224", None, "config.json")
    with pytest.raises(WeightsError, match=r"config.json model_args uses QK normalisation \(qk_norm=True\)"):
        fields_for("eva02_tiny_patch14_224", {"qk_norm": True}, "config.json")
    with pytest.raises(WeightsError, match=r"rope_grid_indexing='xy'"):
        fields_for("eva02_tiny_patch14_224", {"rope_grid_indexing": "xy"}, "config.json")


# transformers' DINOv3: (config keys, input sizes)
HF = {
    "registers": (dict(num_register_tokens=2), ((32, 32), (48, 64))),
    "gated_no_biases": (dict(use_gated_mlp=True, hidden_act="silu", proj_bias=False, mlp_bias=False, key_bias=True,
                             rope_theta=50.0, layerscale_value=0.1), ((32, 32), (40, 24))),
}


def _hf_dinov3(tmp_path: Path, keys: dict[str, Any]) -> nn.Module:
    cfg = transformers.DINOv3ViTConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=2, image_size=32, patch_size=8, **keys)
    torch.manual_seed(0)
    theirs = _perturb(transformers.DINOv3ViTModel(cfg))
    theirs.save_pretrained(tmp_path)
    return theirs


@pytest.mark.parametrize("case", sorted(HF))
def test_transformers_dinov3_loads_exactly(tmp_path, case):
    keys, sizes = HF[case]
    theirs = _hf_dinov3(tmp_path, keys)
    ours, report = vitlab.load_model(tmp_path, return_report=True)
    for h, w in sizes:
        x = torch.randn(2, 3, h, w)
        with torch.no_grad():
            out = theirs(pixel_values=x)
            torch.testing.assert_close(ours.forward_features(x), out.last_hidden_state, **TOL)
            torch.testing.assert_close(ours(x), out.pooler_output, **TOL)  # the normalised class token
    assert report.ok and report.sources["rope_theta"] == "transformers config.json (rope_theta)"
    assert ours.cfg.rope == "dinov3" and ours.cfg.pos_embed == "none"


def _rebuilt(path: Path) -> nn.Module:
    with safe_open(str(path), "pt") as f:
        header = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    model = timm.create_model(header["timm.architecture"], pretrained=False, **json.loads(header["timm.kwargs"]))
    model.load_state_dict(tensors, strict=True)
    return model.eval()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_export_to_timm_is_rebuilt_by_timm(tmp_path, family):
    _, _, size, _, unfixed = FAMILIES[family]
    torch.save(_timm(family).state_dict(), tmp_path / "model.pth")
    ours = vitlab.load_model(tmp_path / "model.pth", **unfixed)
    export(ours, tmp_path / "out.safetensors", to="timm")
    _same(ours, _rebuilt(tmp_path / "out.safetensors"), (size,))


def test_transformers_dinov3_exports_to_timm(tmp_path):
    _hf_dinov3(tmp_path / "hf", HF["registers"][0])
    ours = vitlab.load_model(tmp_path / "hf")
    export(ours, tmp_path / "out.safetensors", to="timm")
    _same(ours, _rebuilt(tmp_path / "out.safetensors"), ((32, 32),))
    _hf_dinov3(tmp_path / "key_bias", HF["gated_no_biases"][0])  # key_bias=True: timm's Eva has none
    with pytest.raises(WeightsError, match="key part is not zero"):
        export(vitlab.load_model(tmp_path / "key_bias"), tmp_path / "out2.safetensors", to="timm")


def test_export_refuses_what_timm_eva_cannot_compute(tmp_path):
    model = vitlab.create_model("ViT-Ti/16", img_size=32, depth=1, rope="eva02", act="quick_gelu")
    with pytest.raises(WeightsError, match="act='quick_gelu'"):
        export(model, tmp_path / "a.safetensors", to="timm")
    model = vitlab.create_model("ViT-Ti/16", img_size=32, depth=1, rope="dinov3")
    with torch.no_grad():
        model.blocks[0].attn.qkv.bias.fill_(0.1)  # a key bias: timm's Eva has none
    with pytest.raises(WeightsError, match="key part is not zero"):
        export(model, tmp_path / "b.safetensors", to="timm")
    for to, name in (("npz", "c.npz"), ("torchvision", "d.pth"), ("hf", "e")):
        with pytest.raises(WeightsError, match="rope"):
            export(model, tmp_path / name, to=to)


def test_plain_vit_is_unchanged():
    """No rope: no RoPE module anywhere, and timm's VisionTransformer's numbers to the bit."""
    theirs = _perturb(timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=2,
                                        num_classes=5))
    ours = vitlab.create_model("ViT-Ti/16", img_size=32, depth=2, num_classes=5).eval()
    ours.load_state_dict(theirs.state_dict())
    assert ours.rope is None and all(block.attn.rope is None for block in ours.blocks)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(ours(x), theirs(x))
        assert torch.equal(ours.forward_features(x), theirs.forward_features(x))


def test_rope_walks_the_blocks_and_other_sizes():
    """One RoPE module serves the blocks; embed sets the grid, so layer-by-layer walks and other sizes work."""
    model = vitlab.create_model("ViT-Ti/16", img_size=32, depth=2, num_classes=0, rope="dinov3", reg_tokens=1,
                                pos_embed="none").eval()
    assert all(block.attn.rope is model.rope for block in model.blocks) and not list(model.rope.state_dict())
    with torch.no_grad():
        for h, w in ((32, 32), (48, 16)):
            x = torch.randn(1, 3, h, w)
            z, grid = model.embed(x)
            for block in model.blocks:
                z, _ = block(z)
            torch.testing.assert_close(model.norm(z), model.forward_features(x))
            assert model.rope.grid == grid == (h // 16, w // 16)
        with pytest.raises(RuntimeError, match="grid"):
            model.blocks[0](torch.randn(1, 2 + 9, 192))  # tokens of another grid than the one embed set


@pytest.mark.parametrize(("fields", "match"), [
    (dict(rope="axial"), "ViTConfig.rope must be None or one of"),
    (dict(rope_theta=100.0), "need rope="),
    (dict(rope="dinov3", rope_ref_grid=(16, 16)), "rope_ref_grid is EVA-02's"),
    (dict(rope="eva02", rope_ref_grid=(16, 0)), "rope_ref_grid must be None or"),
    (dict(rope="eva02", rope_theta=0.0), "rope_theta must be"),
    (dict(rope="eva02", embed_dim=60, num_heads=6), "divisible by 4"),
])
def test_config_refuses_bad_rope_fields(fields, match):
    with pytest.raises(ValueError, match=match):
        ViTConfig(**{"embed_dim": 192, "num_heads": 3, **fields})


def test_config_round_trip_and_family_options():
    cfg = ViTConfig(embed_dim=192, num_heads=3, rope="eva02", rope_ref_grid=[16, 16])
    assert cfg.rope_ref_grid == (16, 16) and cfg.rope_base == 10000.0
    assert ViTConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert cfg.family_options() == {"rope": "eva02", "rope_ref_grid": (16, 16)} and not cfg.is_plain
