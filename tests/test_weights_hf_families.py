"""transformers' other ViT families (DINOv2 with and without registers, CLIP, SigLIP, MAE, DeiT): their
`save_pretrained` folders load with the outputs of transformers' own models (fp32, 1e-4), `vitlab convert --to hf`
writes folders transformers reads back to the same outputs, and what vitlab cannot compute is refused in one line
naming the field (vitlab.weights.hf_families)."""

import json

import pytest
import torch
import transformers as tf

import vitlab
from vitlab.cli import main
from vitlab.weights import WeightsError, convert, read_metadata

from .conftest import perturb_

ATOL = 1e-4
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=42, patch_size=14)


def close(a, b):
    torch.testing.assert_close(a, b, atol=ATOL, rtol=ATOL)


def saved(model, path):
    """`model` with every tensor perturbed, in eval mode, saved with save_pretrained to `path`."""
    perturb_(model, scale=0.05).eval()
    model.save_pretrained(path)
    return model


def run(model, x, **kw):
    with torch.no_grad():
        return model(pixel_values=x, **kw)


def ours_out(model, x):
    """(tokens after the final norm, pooled features, output) of a vitlab model."""
    with torch.no_grad():
        tokens = model.forward_features(x)
        return tokens, model.forward_head(tokens, pre_logits=True), model(x)


def roundtrip(src, tmp_path, **kw):
    """`vitlab convert src --to hf`, read back by transformers' AutoModel (the class config.json names)."""
    convert(src, tmp_path / "back", to="hf", **kw)
    arch = json.loads((tmp_path / "back" / "config.json").read_text())["architectures"][0]
    return getattr(tf, arch).from_pretrained(tmp_path / "back").eval()


@pytest.mark.parametrize("swiglu", [False, True])
def test_dinov2(tmp_path, swiglu):
    theirs = saved(tf.Dinov2Model(tf.Dinov2Config(**TINY, use_swiglu_ffn=swiglu, layerscale_value=0.5)),
                   tmp_path / "hf")
    ours, report = vitlab.load_model(tmp_path / "hf", return_report=True)
    assert report.format == "hf" and report.ok
    assert ours.cfg.mlp == ("swiglu" if swiglu else "mlp") and ours.cfg.act == ("silu" if swiglu else "gelu")
    assert report.sources["layer_scale"] == "transformers config.json (layerscale_value)"
    for size in (42, 56):  # 56: transformers' interpolate_pos_encoding (plain bicubic), ours pos_embed_resize="hf"
        x = torch.randn(2, 3, size, size)
        out, (tokens, pooled, _) = run(theirs, x), ours_out(ours, x)
        close(tokens, out.last_hidden_state)
        close(pooled, out.pooler_output)
    x = torch.randn(2, 3, 42, 42)
    back = roundtrip(tmp_path / "hf", tmp_path)
    close(run(back, x).last_hidden_state, run(theirs, x).last_hidden_state)


def test_dinov2_with_registers(tmp_path):
    theirs = saved(tf.Dinov2WithRegistersModel(tf.Dinov2WithRegistersConfig(**TINY, num_register_tokens=3)),
                   tmp_path / "hf")
    ours, report = vitlab.load_model(tmp_path / "hf", return_report=True)
    assert report.ok and ours.cfg.reg_tokens == 3 and ours.cfg.no_embed_class
    assert ours.pos_embed.shape == (1, 9, 64)  # patches only: the class row is folded into cls_token
    for size in (42, 70):  # 70: transformers' antialiased bicubic, ours "bicubic"
        x = torch.randn(2, 3, size, size)
        out, (tokens, pooled, _) = run(theirs, x), ours_out(ours, x)
        close(tokens, out.last_hidden_state)
        close(pooled, out.pooler_output)
    x = torch.randn(2, 3, 70, 70)  # resampled once while loading (img_size=70): the same numbers
    close(vitlab.load_model(tmp_path / "hf", img_size=70).forward_features(x), run(theirs, x).last_hidden_state)
    x = torch.randn(2, 3, 42, 42)
    back = roundtrip(tmp_path / "hf", tmp_path)
    assert type(back).__name__ == "Dinov2WithRegistersModel"
    close(run(back, x).last_hidden_state, run(theirs, x).last_hidden_state)


def test_dinov2_registers_match_timm(tmp_path):
    """Our names are timm's: the converted tensors load strictly into timm's vit_*_reg4_dinov2 layout."""
    timm = pytest.importorskip("timm")
    theirs = saved(tf.Dinov2WithRegistersModel(tf.Dinov2WithRegistersConfig(**TINY, num_register_tokens=4)),
                   tmp_path / "hf")
    ours = vitlab.load_model(tmp_path / "hf")
    ref = timm.models.vision_transformer.VisionTransformer(
        img_size=42, patch_size=14, embed_dim=64, depth=2, num_heads=4, num_classes=0, init_values=1.0,
        reg_tokens=4, no_embed_class=True, dynamic_img_size=False).eval()
    ref.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randn(2, 3, 42, 42)
    with torch.no_grad():
        close(ref.forward_features(x), run(theirs, x).last_hidden_state)


@pytest.mark.parametrize("projection", [True, False])
def test_clip_vision(tmp_path, projection):
    cfg = tf.CLIPVisionConfig(**TINY, intermediate_size=96, projection_dim=32)
    cls = tf.CLIPVisionModelWithProjection if projection else tf.CLIPVisionModel
    theirs = saved(cls(cfg), tmp_path / "hf")
    ours, report = vitlab.load_model(tmp_path / "hf", return_report=True)
    c = ours.cfg
    assert report.ok and c.pre_norm and not c.patch_bias and c.act == "quick_gelu" and c.layer_norm_eps == 1e-5
    assert c.num_classes == (32 if projection else 0)
    x = torch.randn(2, 3, 42, 42)
    out, (_, pooled, logits) = run(theirs, x), ours_out(ours, x)
    close(logits, out.image_embeds if projection else out.pooler_output)
    if not projection:
        close(pooled, out.pooler_output)
    back = roundtrip(tmp_path / "hf", tmp_path)
    assert type(back) is cls
    close(run(back, x).image_embeds if projection else run(back, x).pooler_output, logits)


def test_clip_full_model(tmp_path):
    """A CLIPModel folder: its vision_config and visual_projection; the text tower is left out."""
    cfg = tf.CLIPConfig(vision_config=dict(TINY, intermediate_size=96, hidden_act="gelu"), projection_dim=16,
                        text_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=64, vocab_size=100, max_position_embeddings=16))
    theirs = saved(tf.CLIPModel(cfg), tmp_path / "hf")
    ours, report = vitlab.load_model(tmp_path / "hf", return_report=True)
    assert report.ok and ours.cfg.act == "gelu" and ours.cfg.num_classes == 16
    assert report.sources["act"] == "transformers config.json (vision_config.hidden_act)"
    x = torch.randn(2, 3, 42, 42)
    with torch.no_grad():
        close(ours(x), theirs.get_image_features(pixel_values=x).pooler_output)


def test_siglip_vision(tmp_path):
    theirs = saved(tf.SiglipVisionModel(tf.SiglipVisionConfig(**TINY, intermediate_size=96)), tmp_path / "hf")
    ours, report = vitlab.load_model(tmp_path / "hf", return_report=True)
    c = ours.cfg
    assert report.ok and c.pool == "map" and not c.class_token and c.act == "gelu_tanh" and c.num_classes == 0
    x = torch.randn(2, 3, 42, 42)
    out, (tokens, _, pooled) = run(theirs, x), ours_out(ours, x)
    close(tokens, out.last_hidden_state)
    close(pooled, out.pooler_output)
    close(vitlab.load_model(tmp_path / "hf" / "model.safetensors")(x), pooled)  # the file, config.json beside
    back = roundtrip(tmp_path / "hf", tmp_path)
    close(run(back, x).pooler_output, pooled)


def test_siglip_full_model(tmp_path):
    cfg = tf.SiglipConfig(vision_config=dict(TINY, intermediate_size=96),
                          text_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                           intermediate_size=64, vocab_size=100, max_position_embeddings=16))
    theirs = saved(tf.SiglipModel(cfg), tmp_path / "hf")
    ours = vitlab.load_model(tmp_path / "hf")
    x = torch.randn(2, 3, 42, 42)
    with torch.no_grad():
        close(ours(x), theirs.vision_model(pixel_values=x).pooler_output)


@pytest.mark.parametrize("make", [
    lambda: tf.Dinov2Model(tf.Dinov2Config(**TINY, use_swiglu_ffn=True)),
    lambda: tf.DeiTForImageClassificationWithTeacher(tf.DeiTConfig(**TINY, intermediate_size=96, num_labels=3)),
    lambda: tf.CLIPVisionModel(tf.CLIPVisionConfig(**TINY, intermediate_size=96)),
])
def test_in_memory_names_beside_config(tmp_path, make):
    """torch.save(model.state_dict()) spells modules as recent releases do (layers.{i}.attention.q_proj,
    mlp.gate_proj / up_proj); read with the config.json beside the .bin file."""
    theirs = saved(make(), tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save(theirs.state_dict(), tmp_path / "pytorch_model.bin")
    ours = vitlab.load_model(tmp_path / "pytorch_model.bin")
    x = torch.randn(2, 3, 42, 42)
    out = run(theirs, x)
    close(ours(x), out.logits if hasattr(out, "logits") else out.pooler_output)


@pytest.mark.parametrize("make, backbone", [
    (lambda: tf.ViTMAEForPreTraining(tf.ViTMAEConfig(**TINY, intermediate_size=96, mask_ratio=0.0,
                                                     decoder_hidden_size=32, decoder_num_hidden_layers=1,
                                                     decoder_intermediate_size=64)), "vit"),
    (lambda: tf.Dinov2ForImageClassification(tf.Dinov2Config(**TINY, num_labels=3)), "dinov2"),
    (lambda: tf.DeiTModel(tf.DeiTConfig(**TINY, intermediate_size=96)), None),
])
def test_parts_left_out(tmp_path, make, backbone):
    """MAE's decoder, Dinov2ForImageClassification's [class, mean] classifier and DeiTModel's unused pooler are
    left out: the backbone's tokens load (features, num_classes=0)."""
    theirs = saved(make(), tmp_path)
    ours = vitlab.load_model(tmp_path)
    assert ours.cfg.num_classes == 0
    x = torch.randn(2, 3, 42, 42)
    kw = {"noise": torch.arange(9.0).expand(2, 9)} if backbone == "vit" else {}
    close(ours.forward_features(x), run(getattr(theirs, backbone) if backbone else theirs, x, **kw).last_hidden_state)


def test_vit_mae_encoder(tmp_path):
    """ViTMAEModel (mask_ratio 0.75 in the folder): vitlab encodes every patch; transformers does so with
    mask_ratio=0 and noise=arange (patches kept in order)."""
    theirs = saved(tf.ViTMAEModel(tf.ViTMAEConfig(**TINY, intermediate_size=96)), tmp_path / "hf")
    ours, report = vitlab.load_model(tmp_path / "hf", return_report=True)
    assert report.ok and ours.cfg.layer_norm_eps == 1e-12 and ours.cfg.num_classes == 0
    theirs.config.mask_ratio = 0.0
    x = torch.randn(2, 3, 42, 42)
    noise = torch.arange(9.0).expand(2, 9)
    close(ours.forward_features(x), run(theirs, x, noise=noise).last_hidden_state)
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "back"), "--to", "hf",
                 "--hf-model-type", "vit_mae"]) == 0
    back = tf.ViTMAEModel.from_pretrained(tmp_path / "back").eval()
    assert back.config.mask_ratio == 0.0
    close(run(back, x, noise=noise).last_hidden_state, run(theirs, x, noise=noise).last_hidden_state)


def test_deit_with_teacher(tmp_path):
    cfg = tf.DeiTConfig(**TINY, intermediate_size=96, num_labels=5, id2label={i: f"c{i}" for i in range(5)})
    theirs = saved(tf.DeiTForImageClassificationWithTeacher(cfg), tmp_path / "hf")
    ours, report = vitlab.load_model(tmp_path / "hf", return_report=True)
    assert report.ok and ours.cfg.distilled and ours.cfg.num_classes == 5
    assert read_metadata(tmp_path / "hf")["class_names"] == [f"c{i}" for i in range(5)]
    x = torch.randn(2, 3, 42, 42)
    close(ours(x), run(theirs, x).logits)
    back = roundtrip(tmp_path / "hf", tmp_path)
    assert back.config.id2label[4] == "c4"
    close(run(back, x).logits, run(theirs, x).logits)


def test_deit_single_classifier(tmp_path):
    """DeiTForImageClassification reads the class token only: its classifier becomes both heads."""
    cfg = tf.DeiTConfig(**TINY, intermediate_size=96, num_labels=3)
    theirs = saved(tf.DeiTForImageClassification(cfg), tmp_path / "hf")
    ours = vitlab.load_model(tmp_path / "hf")
    x = torch.randn(2, 3, 42, 42)
    close(ours(x), run(theirs, x).logits)


def test_clip_processor_int_size(tmp_path):
    """CLIP's processors read an int size as the shorter side (then a centre crop), not as a square."""
    saved(tf.CLIPVisionModel(tf.CLIPVisionConfig(**TINY, intermediate_size=96)), tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(
        {"feature_extractor_type": "CLIPFeatureExtractor", "size": 48, "crop_size": 42, "do_center_crop": True,
         "resample": 3, "image_mean": [0.48145466, 0.4578275, 0.40821073],
         "image_std": [0.26862954, 0.26130258, 0.27577711]}))
    p = vitlab.load_model(tmp_path).preprocess
    assert p.resize == "center_crop" and p.resize_size == (48, 48) and p.hw == (42, 42)
    assert p.interpolation == "bicubic"


@pytest.mark.parametrize("make, match", [
    (lambda: tf.BeitModel(tf.BeitConfig(**TINY, intermediate_size=96, use_relative_position_bias=True)),
     "use_relative_position_bias"),
    (lambda: tf.Dinov2Model(tf.Dinov2Config(**TINY, hidden_act="relu")), "hidden_act='relu'"),
    (lambda: tf.Siglip2VisionModel(tf.Siglip2VisionConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                          intermediate_size=96, patch_size=14, num_patches=16)),
     "num_patches"),
])
def test_refused_in_one_line(tmp_path, make, match):
    make().save_pretrained(tmp_path)
    with pytest.raises(WeightsError, match=match) as e:
        vitlab.load_model(tmp_path)
    assert "\n" not in str(e.value)


def test_write_refuses_what_transformers_cannot_compute(tmp_path):
    model = vitlab.create_model("ViT-Ti/16", img_size=32, depth=1, embed_dim=64, num_heads=4, mlp_dim=96,
                                class_token=False, pool="gap", fc_norm=True)
    with pytest.raises(WeightsError, match="fc_norm=True"):
        vitlab.weights.publish.export(model, tmp_path / "out", "hf")
    dino = vitlab.create_model("ViT-Ti/16", img_size=32, depth=1, embed_dim=64, num_heads=4, mlp_dim=96,
                               layer_scale=1e-5, num_classes=10)
    with pytest.raises(WeightsError, match="num_classes=0"):
        vitlab.weights.publish.export(dino, tmp_path / "out", "hf")


def test_cli_lists_the_written_model_types():
    from vitlab.cli.convert import HF_MODEL_TYPES
    from vitlab.weights.hf_families import WRITE

    assert ("vit", *WRITE) == HF_MODEL_TYPES
