"""OpenCLIP image towers (vitlab.weights.openclip) against open_clip's own `CLIP.encode_image`.

Tiny CLIPs (width 64, 2 layers, 32-wide heads: not OpenCLIP's default 64, patch 8, 32 x 32 input) are made by
open_clip itself from an `open_clip_config.json` (`create_model("local-dir:...")`), every parameter perturbed, and
written by its own `save_for_hf` (open_clip_model.safetensors, open_clip_pytorch_model.bin, the config); bare files
are `torch.save(model.state_dict())` and the image tower's own state dict in safetensors. The vitlab model's output
is the projected image embedding (the projection is its head)."""

import json

import open_clip
import pytest
import safetensors.torch
import torch
from open_clip.push_to_hf_hub import save_for_hf

import vitlab
from vitlab.weights import openclip
from vitlab.weights.checkpoint import read_checkpoint
from vitlab.weights.converted import Unfixed
from vitlab.weights.report import WeightsError

VISION = dict(width=64, layers=2, patch_size=8, image_size=32, head_width=32)
TEXT = dict(context_length=8, vocab_size=64, width=32, heads=2, layers=1)
ATOL = 1e-4


class _NoTokenizer:
    def save_pretrained(self, directory):  # save_for_hf writes the tokenizer too; the image tower needs none
        pass


def make_clip(folder, quick_gelu=False, preprocess=None, **vision):
    """A tiny CLIP made by open_clip from its config in `folder`, perturbed, saved there by open_clip."""
    cfg = {"embed_dim": 24, "quick_gelu": quick_gelu, "vision_cfg": {**VISION, **vision}, "text_cfg": TEXT}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / openclip.CONFIG_FILE).write_text(json.dumps({"model_cfg": cfg, "preprocess_cfg": preprocess or {}}))
    model = open_clip.create_model(f"local-dir:{folder}").eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen))
    save_for_hf(model, _NoTokenizer(), cfg, folder)
    return model


def check(model, ours, size=32):
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs, got = model.encode_image(x), ours(x)
    torch.testing.assert_close(got, theirs, atol=ATOL, rtol=ATOL)
    return (got - theirs).abs().max().item()


@pytest.mark.parametrize("quick_gelu", [False, True])
@pytest.mark.parametrize("vision", [
    {},  # OpenAI / LAION ViTs: class token, ln_pre, ln_post before the projection
    {"ls_init_value": 0.1},  # LayerScale (ViT-*-alt)
    {"final_ln_after_pool": True},  # ln_post on the pooled class token only: the same function
    {"pool_type": "avg"},  # ln_post on every token, then the patch tokens averaged
    {"no_ln_pre": True, "pool_type": "avg", "final_ln_after_pool": True},  # CLIPA: averaged, then ln_post
    {"block_type": "custom", "norm_kwargs": {"eps": 1e-6}},  # CustomResidualAttentionBlock, no options; eps
])
def test_folder_with_open_clip_config(tmp_path, quick_gelu, vision):
    model = make_clip(tmp_path / "hub", quick_gelu, **vision)
    ours, report = vitlab.load_model(tmp_path / "hub", return_report=True)
    check(model, ours)
    assert report.format == "openclip"
    cfg = ours.cfg
    assert (cfg.act, cfg.num_heads, cfg.layer_norm_eps, cfg.patch_bias) == (
        "quick_gelu" if quick_gelu else "gelu", 2, vision.get("norm_kwargs", {}).get("eps", 1e-5), False)
    assert cfg.pre_norm == (not vision.get("no_ln_pre", False))
    assert cfg.pool == ("gap" if vision.get("pool_type") == "avg" else "token")
    assert cfg.fc_norm == (vision.get("pool_type") == "avg" and vision.get("final_ln_after_pool", False))
    assert "open_clip_config.json (model_cfg.quick_gelu)" in report.sources["act"]
    assert "head_width" in report.sources["num_heads"]


@pytest.mark.parametrize("name", ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"])
def test_weight_file_in_the_folder_reads_the_config_beside_it(tmp_path, name):
    model = make_clip(tmp_path / "hub", quick_gelu=True)
    check(model, vitlab.load_model(tmp_path / "hub" / name))


@pytest.mark.parametrize("quick_gelu", [False, True])
def test_bare_state_dict_needs_act_and_heads(tmp_path, quick_gelu):
    """Without the config nothing fixes the activation (OpenAI: QuickGELU, LAION: GELU) nor, at a width none of
    OpenCLIP's configs has, the heads: refused with the keyword to pass; with them, exact."""
    model = make_clip(tmp_path / "hub", quick_gelu)
    path = tmp_path / "clip.pt"
    torch.save(model.state_dict(), path)
    with pytest.raises(WeightsError, match=r"num_heads=\.\.\. to load_model"):
        vitlab.load_model(path)
    with pytest.raises(WeightsError, match=r"does not fix act .*'quick_gelu' to load_model"):
        vitlab.load_model(path, num_heads=2)
    act = "quick_gelu" if quick_gelu else "gelu"
    ours, report = vitlab.load_model(path, num_heads=2, act=act, return_report=True)
    check(model, ours)
    assert report.sources["act"] == report.sources["num_heads"] == "load_model argument"
    assert ours.preprocess is None  # a bare file does not say how its images were prepared
    wrong = vitlab.load_model(path, num_heads=2, act="gelu" if quick_gelu else "quick_gelu")
    with pytest.raises(AssertionError):  # the activation is no detail: the other one is off by far more than 1e-4
        check(model, wrong)


def test_image_tower_safetensors_and_training_checkpoint(tmp_path):
    model = make_clip(tmp_path / "hub")
    tower = tmp_path / "visual.safetensors"
    safetensors.torch.save_file(model.visual.state_dict(), tower)  # no "visual." prefix, no text tower
    check(model, vitlab.load_model(tower, num_heads=2, act="gelu"))
    nested = tmp_path / "epoch_1.pt"  # open_clip's training script: {"epoch", "state_dict": module.*, "optimizer"}
    torch.save({"epoch": 1, "state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}}, nested)
    check(model, vitlab.load_model(nested, num_heads=2, act="gelu"))


def test_preprocess_cfg(tmp_path):
    pp = {"mean": [0.1, 0.2, 0.3], "std": [0.4, 0.5, 0.6], "interpolation": "bilinear", "resize_mode": "squash"}
    make_clip(tmp_path / "hub", preprocess=pp)
    got = read_checkpoint(tmp_path / "hub").preprocess
    assert (got.mean, got.std, got.interpolation, got.resize, got.crop_fraction, got.img_size) == (
        (0.1, 0.2, 0.3), (0.4, 0.5, 0.6), "bilinear", "resize", 1.0, 32)
    make_clip(tmp_path / "default")  # save_for_hf writes open_clip's defaults: OpenAI's statistics, shortest side
    got = read_checkpoint(tmp_path / "default").preprocess
    assert (got.mean, got.std, got.resize, got.interpolation) == (
        openclip.OPENAI_MEAN, openclip.OPENAI_STD, "center_crop", "bicubic")
    make_clip(tmp_path / "longest", preprocess={"resize_mode": "longest"})  # resize + pad: no transform of ours
    assert read_checkpoint(tmp_path / "longest").preprocess is None


def test_known_configs_fix_the_heads():
    """Shapes of OpenCLIP's published configs give their heads: ViT-g-14's 88-wide heads are 16, not 1408 / 64."""
    def fake(width, layers, patch, mlp):
        z = torch.zeros(1)
        s = {"visual.conv1.weight": z.expand(width, 3, patch, patch), "visual.class_embedding": z.expand(width),
             "visual.positional_embedding": z.expand(257, width), "visual.ln_pre.weight": z.expand(width),
             "visual.proj": z.expand(width, 1024)}
        for i in range(layers):
            s[f"visual.transformer.resblocks.{i}.mlp.c_fc.weight"] = z.expand(mlp, width)
        return s
    conv = openclip.convert(fake(1408, 40, 14, 6144), "g14")
    assert conv.known["num_heads"] == 16 and "ViT-g-14" in conv.sources["num_heads"]
    assert conv.state["head.weight"].shape == (1024, 1408) and not conv.state["head.bias"].any()
    assert openclip.convert(fake(768, 12, 32, 3072), "b32").known["num_heads"] == 12
    custom = openclip.convert(fake(768, 11, 32, 3072), "custom").known["num_heads"]  # not guessed: refused by name
    assert isinstance(custom, Unfixed) and "head_width" in custom.why
    assert "act" not in openclip.convert(fake(768, 12, 32, 3072), "b32").known  # never guessed


def test_refusals(tmp_path):
    model = make_clip(tmp_path / "hub")
    state = model.state_dict()
    no_ln_pre = {k: v for k, v in state.items() if not k.startswith("visual.ln_pre.")}
    with pytest.raises(WeightsError, match=r"without ln_pre.*open_clip_config\.json"):
        openclip.convert(no_ln_pre, "clipa.pt")
    extra = {**state, "visual.transformer.resblocks.0.attn.ln_q.weight": torch.ones(32)}
    with pytest.raises(WeightsError, match=r"ln_q\.weight' has no place"):
        openclip.convert(extra, "qknorm.pt")
    with pytest.raises(WeightsError, match="ResNet"):
        openclip.convert({"visual.attnpool.c_proj.weight": torch.ones(2), "visual.conv1.weight": torch.ones(1)}, "rn")
    with pytest.raises(WeightsError, match="timm"):
        openclip.convert({"visual.trunk.patch_embed.proj.weight": torch.ones(1)}, "siglip")
    cfg = json.loads((tmp_path / "hub" / openclip.CONFIG_FILE).read_text())
    for key, value, match in (("attentional_pool", True, "attentional pooling"), ("pool_type", "none", "pool_type"),
                              ("qk_norm", True, "QK normalisation"), ("width", 128, r"\(128, 2, 8\)"),
                              ("norm_kwargs", {"elementwise_affine": False}, "norm_kwargs")):
        bad = json.loads(json.dumps(cfg))
        bad["model_cfg"]["vision_cfg"][key] = value
        with pytest.raises(WeightsError, match=match):
            openclip.convert(state, "x", bad)
    coca = make_clip(tmp_path / "coca", attentional_pool=True, attn_pooler_heads=2, attn_pooler_queries=4)
    torch.save(coca.state_dict(), tmp_path / "coca.pt")  # the pooler's tensors are refused by name, config or not
    with pytest.raises(WeightsError, match="attn_pool"):
        read_checkpoint(tmp_path / "coca.pt")
