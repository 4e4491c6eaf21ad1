"""vitlab.weights.timm_arch: the table of timm architectures checked row by row against the model timm builds (on
the meta device: no weights, no downloads), config.json's model_args / pretrained_cfg over the table as timm puts
them, refusals that name a feature the built model really has, and timm Hub folders loaded through it with outputs
equal to timm's."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vitlab
from vitlab.models.config import to_hw
from vitlab.weights.checkpoint import read_checkpoint
from vitlab.weights.report import WeightsError
from vitlab.weights.timm_arch import ARCHS, FIELDS, TIMM_VERSION, architectures, fields_for

timm = pytest.importorskip("timm")

SRC = "config.json"
_ACTS = {"gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
         "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x), "silu": F.silu}


def _build(arch: str, **kwargs: Any) -> nn.Module:
    """timm's model for `arch` on the meta device (its initialisation skipped where timm allows it: faster)."""
    extra = {} if ARCHS[arch]["module"] == "eva" else {"weight_init": "skip"}
    with torch.device("meta"):
        return timm.create_model(arch, pretrained=False, **extra, **kwargs)


def _act(module: nn.Module) -> str | None:
    """Which activation a (stateless) module computes, by evaluating it."""
    x = torch.linspace(-4, 4, 81)
    y = module(x)
    return next((name for name, f in _ACTS.items() if torch.allclose(y, f(x), atol=1e-6, rtol=0)), None)


def _is(module: Any) -> bool:
    return module is not None and not isinstance(module, nn.Identity)


def _observed(m: nn.Module) -> dict[str, Any]:
    """The FIELDS of a built timm ViT, read from its modules and parameter shapes."""
    b, mlp = m.blocks[0], m.blocks[0].mlp
    glu = type(mlp).__name__ == "GluMlp" and not mlp.gate_last
    rows = None if m.pos_embed is None else m.pos_embed.shape[1]
    prefix = m.num_prefix_tokens  # class, distillation and register tokens
    if rows is not None:  # the table's rows say whether the prefix tokens have positions
        assert rows == m.patch_embed.num_patches + (0 if m.no_embed_class else prefix)
    eps = {mod.eps for mod in m.modules() if isinstance(mod, nn.LayerNorm)}
    assert len(eps) == 1, eps  # one eps everywhere, so one field says it
    out = dict(
        embed_dim=m.patch_embed.proj.out_channels, depth=len(m.blocks), num_heads=b.attn.num_heads,
        mlp_dim=mlp.fc1.out_features, patch_size=m.patch_embed.patch_size[0], img_size=tuple(m.patch_embed.img_size),
        class_token=m.cls_token is not None, pool={"token": "token", "avg": "gap", "map": "map"}[m.global_pool],
        act=_act(mlp.act), mlp="swiglu" if glu else type(mlp).__name__.lower(), mlp_norm=_is(mlp.norm),
        layer_scale=b.ls1.init_values if _is(b.ls1) else None, reg_tokens=m.num_reg_tokens,
        no_embed_class=bool(m.no_embed_class), distilled=hasattr(m, "dist_token"), fc_norm=_is(m.fc_norm),
        pre_norm=_is(m.norm_pre), patch_bias=m.patch_embed.proj.bias is not None,
        qkv_bias=b.attn.qkv.bias is not None, layer_norm_eps=eps.pop(), pos_embed="none" if rows is None else "learned",
        num_classes=m.num_classes)
    if glu:
        assert mlp.fc2.in_features * 2 == mlp.fc1.out_features  # vitlab's swiglu: fc2 takes half of fc1's rows
    assert _is(m.norm) != out["fc_norm"]  # one LayerNorm at the end: before pooling, or after it
    assert (m.attn_pool is not None) == (out["pool"] == "map")
    if m.attn_pool is not None:  # vitlab's MAP head: one latent, the model's heads, MLP width and activation
        pool = m.attn_pool
        assert (pool.latent.shape[1], pool.num_heads, pool.mlp.fc1.out_features) == (1, out["num_heads"],
                                                                                        out["mlp_dim"])
        assert _act(pool.mlp.act) == out["act"] and not _is(pool.q_norm) and pool.pos_embed is None
    return out


def _values(fields: dict[str, tuple[Any, str]]) -> dict[str, Any]:
    out = {k: v for k, (v, _) in fields.items()}
    if "img_size" in out:
        out["img_size"] = to_hw(out["img_size"])
    return out


# The argument a refusal names -> what the built model must then have (the refusal is real, not a table error).
_REFUSED_HAS = {
    "qk_norm": lambda m: _is(m.blocks[0].attn.q_norm),
    "scale_attn_norm": lambda m: _is(m.blocks[0].attn.norm),
    "proj_bias": lambda m: m.blocks[0].attn.proj.bias is None,
    "final_norm": lambda m: not _is(m.norm) and not _is(m.fc_norm),
    "pool_include_prefix": lambda m: m.pool_include_prefix,
    "block_fn": lambda m: type(m.blocks[0]).__name__ != "Block",
    "attn_layer": lambda m: type(m.blocks[0].attn).__name__ != "Attention",
    "embed_norm_layer": lambda m: _is(m.patch_embed.norm),
    "norm_layer": lambda m: not isinstance(m.blocks[0].norm1, nn.LayerNorm),
    "mlp_layer": lambda m: type(m.blocks[0].mlp).__name__ not in ("Mlp", "GluMlp"),
}


@pytest.mark.parametrize("arch", architectures())
def test_table_row_matches_the_model_timm_builds(arch):
    m = _build(arch)
    row = ARCHS[arch]
    if row["class"] == "Eva":  # timm's Eva class (vitlab.weights.eva): the shapes it fixes, or a refusal
        assert type(m).__name__ == "Eva"
        try:
            v = _values(fields_for(arch, None, SRC))
        except WeightsError:
            return  # what Eva models vitlab refuses, and why, is tests of vitlab.weights.eva
        reg = 0 if getattr(m, "reg_token", None) is None else m.reg_token.shape[1]
        assert (v["embed_dim"], v["depth"], v["num_heads"], v["patch_size"], v["img_size"], v["num_classes"],
                v["reg_tokens"], v["class_token"]) == (m.embed_dim, len(m.blocks), m.blocks[0].attn.num_heads,
                                                       m.patch_embed.patch_size[0], tuple(m.patch_embed.img_size),
                                                       m.num_classes, reg, m.cls_token is not None)
        assert (v["rope"] is not None) == (m.rope is not None)
        return
    try:
        fields = fields_for(arch, None, SRC)
    except WeightsError as e:
        key = re.search(r"\((\w+)=", str(e)).group(1)
        assert key in _REFUSED_HAS and _REFUSED_HAS[key](m), str(e)
        return
    assert set(fields) == set(FIELDS)
    assert _values(fields) == _observed(m)


def test_table_covers_the_families():
    usable = []
    for arch in [a for a in architectures() if ARCHS[a]["class"] != "Eva"]:
        try:
            fields_for(arch, None, SRC)
            usable.append(arch)
        except WeightsError:
            pass
    assert len(ARCHS) == 244 and len(usable) == 144 and timm.__version__ == TIMM_VERSION
    for arch in ("vit_base_patch16_224", "vit_so400m_patch14_siglip_gap_224", "vit_base_patch32_siglip_gap_256",
                 "vit_large_patch14_clip_quickgelu_224", "vit_giant_patch14_reg4_dinov2", "deit3_large_patch16_384",
                 "deit_base_distilled_patch16_384", "vit_huge_patch14_gap_224", "vit_base_patch16_siglip_224",
                 "vit_so150m2_patch16_reg1_gap_256", "eva_large_patch14_196", "flexivit_base"):
        assert arch in usable


def test_the_silently_wrong_loads_of_before():
    """What the width table used to give, against what the architecture says (and timm builds)."""
    assert fields_for("vit_so400m_patch14_siglip_gap_224", None, SRC)["num_heads"] == (
        16, f"timm architecture vit_so400m_patch14_siglip_gap_224 (timm {TIMM_VERSION} model_args)")
    assert fields_for("vit_base_patch16_gap_224", None, SRC)["num_heads"][0] == 16
    siglip2 = fields_for("vit_base_patch32_siglip_gap_256.v2_webli", None, SRC)  # a tag is ignored
    assert siglip2["act"][0] == "gelu_tanh" and siglip2["img_size"][0] == 256
    clip = fields_for("vit_base_patch16_clip_quickgelu_224", None, SRC)
    assert (clip["act"][0], clip["layer_norm_eps"][0], clip["pre_norm"][0], clip["patch_bias"][0]) == (
        "quick_gelu", 1e-5, True, False)


# model_args from config.json, over the table, exactly as timm applies them when it builds the model
MODEL_ARGS = [
    ("vit_base_patch16_224", {"class_token": False, "global_pool": "avg", "reg_tokens": 4, "no_embed_class": True,
                              "init_values": 1e-5, "act_layer": "gelu_tanh", "img_size": 256, "qkv_bias": False}),
    ("vit_so400m_patch14_siglip_224", {"global_pool": "avg", "num_classes": 10}),
    ("vit_so400m_patch14_siglip_224", {"global_pool": "avg", "fc_norm": False, "img_size": [224, 336]}),
    ("deit3_small_patch16_224", {"img_size": [192, 256], "num_classes": 0}),
    ("vit_large_patch14_dinov2", {"img_size": 224, "num_classes": 1000}),
    ("vit_base_patch16_clip_224", {"norm_layer": "layernorm", "act_layer": "quick_gelu"}),
    ("vit_small_patch16_224", {"pos_embed": "none", "fc_norm": True, "embed_dim": 512, "num_heads": 8,
                               "mlp_ratio": 3.0, "depth": 3, "patch_size": 8}),
    ("vit_base_patch16_siglip_gap_224", {"global_pool": "token", "class_token": True}),
    ("deit_tiny_distilled_patch16_224", {"pre_norm": True, "scale_mlp_norm": True, "act_layer": "silu"}),
]


@pytest.mark.parametrize(("arch", "model_args"), MODEL_ARGS)
def test_model_args_over_the_table(arch, model_args):
    fields = fields_for(arch, model_args, SRC)
    assert _values(fields) == _observed(_build(arch, **model_args))
    for key, field_name in (("img_size", "img_size"), ("num_classes", "num_classes"), ("act_layer", "act")):
        if key in model_args:
            assert fields[field_name][1] == "config.json model_args"


def test_pretrained_cfg_and_top_level_fields_as_timm_puts_them():
    """timm's hub loader: top-level num_classes over pretrained_cfg's; pretrained_cfg's input size and pooling where
    the architecture sets none; model_args over all of them."""
    cfg = {"input_size": [3, 384, 384], "fixed_input_size": True, "num_classes": 1000}
    fields = fields_for("vit_base_patch16_224", None, SRC, pretrained_cfg=cfg, num_classes=21843)
    timm_model = _build("vit_base_patch16_224", pretrained_cfg_overlay={**cfg, "num_classes": 21843})
    assert _values(fields) == _observed(timm_model)
    assert fields["img_size"] == (384, "config.json pretrained_cfg.input_size")
    assert fields["num_classes"] == (21843, "config.json num_classes")
    cfg["global_pool"] = "avg"  # timm's builder reads it too (its PretrainedCfg class has no such field today)
    fields = fields_for("vit_base_patch16_224", None, SRC, pretrained_cfg=cfg)
    assert fields["pool"] == ("gap", "config.json pretrained_cfg.global_pool") and fields["fc_norm"][0]
    # the architecture's own global_pool comes before pretrained_cfg's (SigLIP's 'map' stays)
    assert fields_for("vit_base_patch16_siglip_224", None, SRC, pretrained_cfg=cfg)["pool"][0] == "map"
    # config.json's top-level global_pool is the exported model's pooling: it counts, below model_args
    assert fields_for("vit_base_patch16_siglip_224", None, SRC, global_pool="avg")["pool"] == (
        "gap", "config.json global_pool (the exported model's pooling)")
    assert fields_for("vit_base_patch16_siglip_224", {"global_pool": "map"}, SRC, global_pool="avg")["pool"][0] == "map"
    unfixed = fields_for("vit_base_patch16_224", None, SRC, pretrained_cfg={**cfg, "fixed_input_size": False})
    assert unfixed["img_size"][0] == 224  # timm: an input size that is not fixed does not size the model


@pytest.mark.parametrize(("model_args", "match"), [
    ({"qk_norm": True}, r"config.json model_args uses QK normalisation \(qk_norm=True\)"),
    ({"global_pool": "avgmax"}, "avg\\+max pooling"),
    ({"global_pool": ""}, "no pooling"),
    ({"norm_layer": "rmsnorm"}, "rmsnorm normalisation"),
    ({"mlp_layer": "swiglu"}, "the MLP swiglu"),
    ({"act_layer": "relu"}, "activation"),
    ({"final_norm": False}, "no LayerNorm after the blocks"),
    ({"class_token": False, "global_pool": "avg", "pool_include_prefix": True}, "prefix tokens"),
    ({"use_naflex": True}, "NaFlexViT"),
    ({"frobnicate": 1}, "does not know"),
    ({"class_token": "false"}, "class_token must be bool"),
    ({"depth": 12.0}, "depth must be int"),
    ({"patch_size": [16, 8]}, "not square"),
])
def test_model_args_that_vitlab_cannot_build_are_refused(model_args, match):
    with pytest.raises(WeightsError, match=match):
        fields_for("vit_base_patch16_224", model_args, SRC)


def test_refusals_of_architectures():
    with pytest.raises(WeightsError, match=r"vit_base_patch16_rope_mixed_224"):  # timm's Eva with mixed RoPE
        fields_for("vit_base_patch16_rope_mixed_224", None, SRC)
    with pytest.raises(WeightsError, match=r"a different transformer block \(ParallelScalingBlock\)"):
        fields_for("vit_base_patch16_xp_224", None, SRC)
    with pytest.raises(WeightsError, match=r"uses rmsnorm normalisation instead of LayerNorm \(norm_layer='rmsnorm'\)"):
        fields_for("test_vit4", None, SRC)
    with pytest.raises(WeightsError, match=r"distillation"):
        fields_for("deit_base_distilled_patch16_224", {"global_pool": "avg"}, SRC)


def test_unknown_architecture_gives_only_what_is_stated():
    fields = fields_for("vit_future_patch16_320", {"num_heads": 7, "global_pool": "avg"}, SRC,
                        pretrained_cfg={"input_size": [3, 320, 320], "num_classes": 5})
    assert _values(fields) == {"patch_size": 16, "img_size": (320, 320), "num_heads": 7, "pool": "gap",
                               "num_classes": 5}
    assert fields["patch_size"][1].startswith("the architecture name vit_future_patch16_320 (not in vitlab's table")
    assert fields_for("vit_base_r50_s16_384", None, SRC) == {}  # a hybrid's name states the ResNet's stride
    with pytest.raises(WeightsError, match="qk_norm"):
        fields_for("vit_future_patch16_320", {"qk_norm": True}, SRC)


# -- timm Hub folders (what timm's save_for_hf / push_to_hf_hub write) through load_model -------------------------

FOLDERS = [  # architecture, the keyword arguments it was created with (they become config.json's model_args)
    ("vit_base_patch16_gap_224", {"depth": 1, "img_size": 32}),  # 16 heads at width 768 (the table: 12)
    ("vit_base_patch32_siglip_gap_256", {"depth": 1, "img_size": 64}),  # SigLIP2: tanh GELU
    ("vit_so400m_patch14_siglip_224", {"depth": 1, "img_size": 28}),  # width 1152, 16 heads, MAP head
    ("deit_tiny_distilled_patch16_224", {"depth": 2, "img_size": 32}),
    ("deit3_small_patch16_224", {"depth": 2, "img_size": 48}),
    ("vit_small_patch14_reg4_dinov2", {"depth": 2, "img_size": 28}),
    ("vit_base_patch16_clip_quickgelu_224", {"depth": 1, "img_size": 32}),
]


def _hub_folder(tmp_path: Path, arch: str, kwargs: dict[str, Any]) -> tuple[Path, nn.Module]:
    from timm.models._hub import save_for_hf

    torch.manual_seed(0)
    theirs = timm.create_model(arch, num_classes=5, **kwargs).eval()
    with torch.no_grad():
        for p in theirs.parameters():  # every tensor perturbed: zero heads and LayerScale would hide errors
            p.add_(torch.randn_like(p) * 0.05)
    save_for_hf(theirs, tmp_path, safe_serialization=True)
    return tmp_path, theirs


@pytest.mark.parametrize(("arch", "kwargs"), FOLDERS)
def test_timm_hub_folder_loads_as_timm_builds_it(tmp_path, arch, kwargs):
    torch.set_num_threads(1)
    folder, theirs = _hub_folder(tmp_path, arch, kwargs)
    model_args = json.loads((folder / "config.json").read_text())["model_args"]
    assert "num_heads" not in model_args and "act_layer" not in model_args  # the architecture name says them
    ours, report = vitlab.load_model(folder, return_report=True)
    x = torch.randn(2, 3, kwargs["img_size"], kwargs["img_size"])
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-4, rtol=1e-4)
    arch_label = f"timm architecture {arch} (timm {TIMM_VERSION} model_args)"
    assert report.sources["num_heads"] == arch_label and report.sources["embed_dim"] == arch_label
    assert report.sources["depth"] == "config.json model_args"
    ckpt = read_checkpoint(folder)
    assert set(ckpt.known) >= set(FIELDS) and all(ckpt.sources[k] for k in FIELDS)


def test_the_width_table_heads_would_have_been_wrong(tmp_path):
    folder, theirs = _hub_folder(tmp_path, "vit_base_patch16_gap_224", {"depth": 1, "img_size": 32})
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        wrong = vitlab.load_model(folder, num_heads=12)(x)
        assert (wrong - theirs(x)).abs().max() > 1e-2  # so the equality above is a real check of the heads


def test_timm_hub_folder_of_a_refused_architecture(tmp_path):
    folder, _ = _hub_folder(tmp_path, "vit_small_patch16_224", {"depth": 1, "img_size": 32})
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "architecture": "vit_base_patch16_rpn_224",
                                                    "model_args": {}}))
    with pytest.raises(WeightsError, match=r"config.json: timm architecture 'vit_base_patch16_rpn_224' uses a "
                                           r"different transformer block \(ResPostBlock\)"):
        read_checkpoint(folder)
    (folder / "config.json").write_text(json.dumps({**cfg, "model_args": {**cfg["model_args"], "qk_norm": True}}))
    with pytest.raises(WeightsError, match=r"qk_norm=True"):
        vitlab.load_model(folder)


def test_timm_hub_folder_of_an_unknown_architecture(tmp_path):
    folder, theirs = _hub_folder(tmp_path, "vit_base_patch16_gap_224", {"depth": 1, "img_size": 32})
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "architecture": "vit_future_patch16_32"}))
    with pytest.raises(WeightsError, match="num_heads"):  # width 768 without a class token: the file must say
        vitlab.load_model(folder)
    ours, report = vitlab.load_model(folder, num_heads=16, act="gelu", return_report=True)
    assert report.sources["patch_size"].startswith("the architecture name vit_future_patch16_32")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-4, rtol=1e-4)


def _without_model_args(folder: Path) -> None:
    """The config.json an older timm (or a hand) writes: architecture and pretrained_cfg, no model_args."""
    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("model_args")
    (folder / "config.json").write_text(json.dumps(cfg))


def test_the_name_alone_fixes_what_the_tensors_cannot(tmp_path):
    """No model_args: vit_medium_patch16_gap_256's name says 8 heads at width 512 and no class token, which the
    tensors alone cannot (loading them without the name is refused); the model equals timm's."""
    folder, theirs = _hub_folder(tmp_path, "vit_medium_patch16_gap_256", {"img_size": 32})
    _without_model_args(folder)
    ours, report = vitlab.load_model(folder, return_report=True)
    arch_label = f"timm architecture vit_medium_patch16_gap_256 (timm {TIMM_VERSION} model_args)"
    assert report.sources["num_heads"] == arch_label
    assert report.sources["img_size"] == "config.json pretrained_cfg.input_size"
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-4, rtol=1e-4)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "architecture": "vit_unknown_256"}))
    with pytest.raises(WeightsError, match="num_heads"):
        vitlab.load_model(folder)


def test_a_name_the_tensors_contradict_is_not_taken(tmp_path):
    """Created with another width and saved without model_args: the name's heads (8 at width 512) are not taken for
    these 256-wide tensors; what the tensors confirm stays, the rest must be passed."""
    folder, theirs = _hub_folder(tmp_path, "vit_medium_patch16_gap_256",
                                 {"img_size": 32, "embed_dim": 256, "num_heads": 4, "depth": 2})
    _without_model_args(folder)
    ckpt = read_checkpoint(folder)
    assert "num_heads" not in ckpt.known and "depth" not in ckpt.known and "act" not in ckpt.known
    assert ckpt.known["qkv_bias"] is False and ckpt.known["class_token"] is False  # confirmed by the tensors
    with pytest.raises(WeightsError, match="num_heads"):
        vitlab.load_model(folder)
    ours = vitlab.load_model(folder, num_heads=4, act="gelu")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-4, rtol=1e-4)
