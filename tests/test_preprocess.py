"""Preprocessing travels with the weights: each source's convention against that source's own pipeline
(torchvision `weights.transforms()`, transformers' image processors, timm's `resolve_data_config` +
`create_transform`, vit_jax's resize + (x - 127.5) / 127.5), the header round trip, the resolver, and the CLIs."""

import json
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.cli import main
from vitlab.data import transforms_for
from vitlab.data.labels import imagenet_classes
from vitlab.data.preprocess import named_overrides
from vitlab.models import preprocess as pp
from vitlab.models.preprocess import Preprocess, PreprocessWarning
from vitlab.weights import preprocess_files as files
from vitlab.weights.checkpoint import read_checkpoint

from .conftest import perturb_

TINY = dict(embed_dim=32, depth=1, num_heads=2, mlp_dim=64)


@pytest.fixture(autouse=True)
def _fresh_warnings():
    pp._warned.clear()  # "once per process" must not leak between tests
    yield
    pp._warned.clear()


@pytest.fixture
def photo(tmp_path):
    """A non-square RGB image with structure everywhere (smooth ramps plus noise), so crops and resizes show."""
    rng = np.random.default_rng(0)
    h, w = 300, 411
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([255 * x / w, 255 * y / h, 128 + 100 * np.sin(x / 17.0) * np.cos(y / 23.0)], -1)
    img = np.clip(img + rng.normal(0, 20, img.shape), 0, 255).astype(np.uint8)
    path = tmp_path / "photo.png"
    Image.fromarray(img).save(path)
    return path


# -- the dataclass ---------------------------------------------------------------------------------------------

def test_round_trip_and_errors_name_the_field():
    p = Preprocess((224, 224), [0.485, 0.456, 0.406], [0.229, 0.224, 0.225], "center_crop", 0.875, "bicubic")
    assert p.img_size == 224 and p.mean == pp.IMAGENET.mean and p.normalize == "imagenet"
    assert Preprocess.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    assert p.resize_size == (256, 256)
    assert Preprocess(224, crop_fraction=0.9).resize_size == (248, 248)  # timm: floor(224 / 0.9)
    for bad, field in [({"resize": "squash"}, "preprocess.resize"), ({"crop_fraction": 1.5}, "crop_fraction"),
                       ({"interpolation": "lanczos"}, "interpolation"), ({"mean": [0.5]}, "preprocess.mean"),
                       ({"channels": "bgr"}, "channels"), ({"std": [0, 1, 1]}, "std"), ({"colour": 1}, "colour")]:
        with pytest.raises(ValueError, match=field):
            Preprocess.from_dict({"img_size": 32, **bad})
    with pytest.raises(ValueError, match="img_size is required"):
        Preprocess.from_dict({"mean": [0.5] * 3})


# -- each source against its own pipeline ----------------------------------------------------------------------

def test_torchvision_convert_then_predict_equals_torchvision_with_its_transforms(tmp_path, photo, capsys):
    """The reported bug: converted torchvision weights were fed [-1, 1] pixels of a squashed image. A vit_b_16-shaped
    torchvision model saved to .pth, `vitlab convert`, `vitlab predict`: the probabilities torchvision's own model
    gives on `ViT_B_16_Weights.IMAGENET1K_V1.transforms()` output, and its category names."""
    from torchvision.models import ViT_B_16_Weights
    from torchvision.models.vision_transformer import VisionTransformer as TVViT

    theirs = perturb_(TVViT(image_size=224, patch_size=16, num_layers=1, num_heads=2, hidden_dim=64, mlp_dim=64,
                            num_classes=1000)).eval()
    with torch.no_grad():
        theirs.heads.head.weight.mul_(200.0)  # spread the logits so a wrong input shows in the probabilities
    torch.save(theirs.state_dict(), tmp_path / "vit_b_16.pth")
    dst = tmp_path / "vit_b_16.safetensors"
    assert main(["convert", str(tmp_path / "vit_b_16.pth"), str(dst), "--num-heads", "2"]) == 0
    capsys.readouterr()
    assert main(["predict", str(dst), str(photo), "--top-k", "1000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)[0]["top"]
    probs = torch.zeros(1000)
    for t in out:
        probs[t["index"]] = t["prob"]
    weights = ViT_B_16_Weights.IMAGENET1K_V1
    img = Image.open(photo).convert("RGB")
    with torch.no_grad():
        ref = theirs(weights.transforms()(img)[None]).softmax(-1)[0]
        wrong = theirs(transforms_for(files.vit_jax(224))(img)[None]).softmax(-1)[0]  # what predict used to feed
    assert (ref - wrong).abs().max() > 1e-3  # the test can tell the two apart
    torch.testing.assert_close(probs, ref, atol=1e-5, rtol=1e-4)
    assert [t["label"] for t in out[:5]] == [weights.meta["categories"][t["index"]] for t in out[:5]]
    model = vitlab.load_model(dst)
    assert model.preprocess == files.torchvision_classification(224, 256, "bilinear", model.preprocess.source)


def _hf_processors(kind):
    """(PIL-resizing processor, default processor). transformers 5 resizes uint8 tensors with torchvision by
    default and keeps the PIL path as *ImageProcessorPil; transformers 4's processors resize with PIL."""
    from transformers import DeiTImageProcessor, ViTImageProcessor

    default = ViTImageProcessor() if kind == "vit" else DeiTImageProcessor()
    try:
        if kind == "vit":
            from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil as Pil
        else:
            from transformers.models.deit.image_processing_pil_deit import DeiTImageProcessorPil as Pil
    except ImportError:
        return default, default
    return Pil(), default


@pytest.mark.parametrize("kind", ["vit", "deit"])
def test_transformers_image_processor_equals_transforms_for(tmp_path, photo, kind):
    """ViTImageProcessor (squash, bilinear, [-1, 1]) and DeiTImageProcessor (squash to 256, crop 224, bicubic,
    ImageNet statistics): their output equals ours from the preprocessor_config.json beside the weights (exactly
    with PIL resizing, as ours; within one 8-bit level with transformers 5's torchvision resizing, which rounds
    the resized uint8 pixels differently)."""
    from transformers import ViTConfig, ViTForImageClassification

    pil, default = _hf_processors(kind)
    img = Image.open(photo).convert("RGB")
    cfg = ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=224,
                    patch_size=16, num_labels=3)
    ViTForImageClassification(cfg).save_pretrained(tmp_path / "hf")
    default.save_pretrained(tmp_path / "hf")
    model = vitlab.load_model(tmp_path / "hf")
    assert model.preprocess.source.endswith("preprocessor_config.json")
    assert model.preprocess.interpolation == ("bilinear" if kind == "vit" else "bicubic")
    ours = transforms_for(model)(img)
    exact = pil(images=img, return_tensors="pt")["pixel_values"][0]
    assert ours.shape == exact.shape == (3, 224, 224)
    torch.testing.assert_close(ours, exact, atol=1e-6, rtol=0)
    theirs = default(images=img, return_tensors="pt")["pixel_values"][0]
    level = 1.001 / 255 / min(model.preprocess.std)  # one 8-bit step after normalisation
    assert (ours - theirs).abs().max() <= level and (ours - theirs).abs().gt(1e-5).float().mean() < 0.01


@pytest.mark.parametrize("tag", ["vit_tiny_patch16_224.augreg_in21k_ft_in1k", "deit_tiny_patch16_224.fb_in1k"])
def test_timm_pretrained_cfg_equals_create_transform(tmp_path, photo, tag):
    """A timm hub folder (config.json with pretrained_cfg + model.safetensors): our transform equals timm's
    `create_transform(**resolve_data_config(model=...))`; architecture / num_classes fill the config."""
    import timm
    from safetensors.torch import save_file
    from timm.data import create_transform, resolve_data_config

    theirs = timm.create_model(tag, pretrained=False, depth=1, num_classes=5)
    img = Image.open(photo).convert("RGB")
    ref = create_transform(**resolve_data_config({}, model=theirs))(img)
    folder = tmp_path / "timm"
    folder.mkdir()
    arch = tag.split(".")[0]
    (folder / "config.json").write_text(json.dumps({"architecture": arch, "num_classes": 5,
                                                    "pretrained_cfg": dict(theirs.pretrained_cfg)}))
    save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, str(folder / "model.safetensors"))
    ckpt = read_checkpoint(folder)
    assert ckpt.format == "timm" and ckpt.known["num_classes"] == 5 and ckpt.known["patch_size"] == 16
    model = vitlab.load_model(folder, num_heads=3)
    ours = transforms_for(model)(img)
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=0)
    assert model.preprocess == files.from_timm_cfg(theirs.pretrained_cfg, model.preprocess.source)


def test_vit_jax_npz_is_whole_image_and_minus_one_to_one(tmp_path):
    """vit_jax's eval pipeline: tf.image.resize(im, [crop, crop]) then (im - 127.5) / 127.5: the whole image is
    kept (a black-left / white-right image stays half and half) and 0 / 255 land on -1 / 1."""
    model = perturb_(vitlab.create_model("ViT-Ti/16", **TINY, img_size=32, patch_size=8, num_classes=3))
    vitlab.save_weights(model, tmp_path / "g.npz")
    ckpt = read_checkpoint(tmp_path / "g.npz")
    assert ckpt.preprocess == files.vit_jax(32)
    img = np.zeros((20, 64, 3), np.uint8)
    img[:, 32:] = 255
    x = transforms_for(vitlab.load_model(tmp_path / "g.npz"))(Image.fromarray(img))
    assert x.shape == (3, 32, 32)
    assert torch.all(x[:, :, :15] == -1) and torch.all(x[:, :, 17:] == 1)


# -- carried in our files, resolved once -------------------------------------------------------------------------

def test_header_round_trip_and_old_recipes(tmp_path):
    model = vitlab.create_model("ViT-Ti/16", **TINY, img_size=32, patch_size=8, num_classes=3)
    model.preprocess = Preprocess(32, *pp.IMAGENET, "center_crop", 0.8, "bicubic", source="test")
    vitlab.save_weights(model, tmp_path / "m.safetensors")
    header = vitlab.weights.ours.read_header(tmp_path / "m.safetensors")
    assert json.loads(header["vitlab.preprocess"])["crop_fraction"] == 0.8
    assert vitlab.load_model(tmp_path / "m.safetensors").preprocess == model.preprocess
    # loaded at another size: the same facts at the model's size
    bigger = vitlab.load_model(tmp_path / "m.safetensors", img_size=48)
    assert bigger.preprocess == model.preprocess.replace(img_size=48)
    # a file written before the header key: the recipe's data section says it
    model.preprocess = None
    recipe = {"data": {"normalize": "imagenet", "eval_resize": "center_crop", "eval_crop_fraction": 0.5}}
    vitlab.save_weights(model, tmp_path / "old.safetensors", {"recipe": recipe})
    old = vitlab.load_model(tmp_path / "old.safetensors").preprocess
    assert (old.normalize, old.resize, old.crop_fraction) == ("imagenet", "center_crop", 0.5)


def test_resolver_precedence_and_one_warning():
    model = vitlab.create_model("ViT-Ti/16", **TINY, img_size=32, patch_size=8, num_classes=3)
    with pytest.warns(PreprocessWarning, match="carries no preprocessing") as caught:
        transforms_for(model)
        transforms_for(model)
    assert len([w for w in caught if w.category is PreprocessWarning]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", PreprocessWarning)  # an explicit choice of statistics: no warning
        explicit = pp.resolve(None, img_size=32, overrides={"mean": pp.IMAGENET.mean, "std": pp.IMAGENET.std},
                              what="x")
    assert explicit.normalize == "imagenet"
    model.preprocess = files.vit_jax(32)
    assert pp.resolve(model.preprocess, img_size=64).img_size == 64  # the model's size wins over the stored one
    over = pp.resolve(model.preprocess, img_size=32, overrides=named_overrides(normalize="imagenet",
                                                                               crop_fraction=0.5))
    assert (over.normalize, over.resize, over.crop_fraction, over.source) == ("imagenet", "center_crop", 0.5,
                                                                              "vit_jax convention")
    grey = pp.resolve(files.vit_jax(32), img_size=28, in_chans=1)
    assert grey.channels == "grey" and grey.mean == (0.5,)


def test_resolver_averages_rgb_statistics_for_a_one_channel_model():
    """Overrides are Preprocess fields whatever the model: ImageNet's three means on a greyscale model become their
    average, as the model's own statistics do; a field that is not one is refused, naming the valid ones."""
    grey = pp.resolve(files.vit_jax(28), img_size=28, in_chans=1, overrides={"mean": pp.IMAGENET.mean,
                                                                             "std": pp.IMAGENET.std})
    assert grey == pp.from_stats("imagenet", 28, 1, source="vit_jax convention")
    assert grey.normalize == "imagenet"
    with pytest.raises(ValueError, match=r"unknown preprocess field\(s\) \['colour'\]; valid fields: \['img_size', "):
        pp.resolve(files.vit_jax(28), overrides={"colour": "rgb"})


# -- preprocess=: one argument of the library functions that run a checkpoint on images --------------------------

@pytest.fixture
def checkpoint_and_tree(tmp_path):
    """A tiny checkpoint that carries vit_jax preprocessing, and an image folder of 12 non-square images."""
    model = perturb_(vitlab.create_model("ViT-Ti/16", **TINY, img_size=32, patch_size=16, num_classes=2))
    model.preprocess = files.vit_jax(32)
    ckpt = vitlab.save_weights(model, tmp_path / "m.safetensors", {"classes": ["a", "b"]})
    rng = np.random.default_rng(0)
    for i in range(12):
        (tmp_path / "tree" / "ab"[i % 2]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (30, 45, 3), dtype=np.uint8)).save(tmp_path / "tree" / "ab"[i % 2] /
                                                                                 f"{i}.png")
    return str(ckpt), f"imagefolder:{tmp_path / 'tree'}", sorted(str(p) for p in (tmp_path / "tree").rglob("*.png"))


def _metrics(r):
    return {k: r[k] for k in ("top1", "top5", "loss", "confusion", "num_samples", "eval_resize", "crop_fraction")}


def test_evaluate_checkpoint_preprocess_mapping_equals_the_old_keywords_and_a_preprocess(checkpoint_and_tree):
    from vitlab.inference.evaluate import evaluate_checkpoint

    ckpt, data, _ = checkpoint_and_tree
    kw = dict(precision="fp32", device="cpu", batch_size=5)
    fields = {"resize": "center_crop", "crop_fraction": 0.5, "mean": pp.IMAGENET.mean, "std": pp.IMAGENET.std}
    new = evaluate_checkpoint(ckpt, data, preprocess=fields, **kw)
    with pytest.warns(DeprecationWarning, match=r"evaluate_checkpoint\(eval_resize=, crop_fraction=, normalize=\) is "
                                                r"deprecated: pass preprocess=") as caught:
        old = evaluate_checkpoint(ckpt, data, eval_resize="center_crop", crop_fraction=0.5, normalize="imagenet",
                                  **kw)
    assert caught[0].filename == __file__  # the warning points at the caller's line
    assert _metrics(old) == _metrics(new) and old.preprocess == new.preprocess
    assert (new.eval_resize, new.crop_fraction, Preprocess.from_dict(new.preprocess).normalize) == (
        "center_crop", 0.5, "imagenet")
    whole = evaluate_checkpoint(ckpt, data, preprocess=Preprocess(32, *pp.IMAGENET, "center_crop", 0.5), **kw)
    assert _metrics(whole) == _metrics(new)
    own = evaluate_checkpoint(ckpt, data, **kw)  # the checkpoint's own: [-1, 1], whole image
    assert (own.eval_resize, own.crop_fraction) == ("resize", None) and own.loss != new.loss
    assert _metrics(evaluate_checkpoint(ckpt, data, preprocess={"resize": "resize"}, **kw)) == _metrics(own)


def test_preprocess_argument_errors(checkpoint_and_tree):
    from vitlab.analysis import analysis_preprocess, load_checkpoint
    from vitlab.inference.evaluate import evaluate_checkpoint

    ckpt, data, images = checkpoint_and_tree
    for call in (lambda p: evaluate_checkpoint(ckpt, data, preprocess=p, device="cpu"),
                 lambda p: vitlab.predict(ckpt, images, preprocess=p),
                 lambda p: analysis_preprocess(load_checkpoint(ckpt), ckpt, (32, 32), preprocess=p)):
        with pytest.raises(ValueError, match=r"unknown preprocess field\(s\) \['resise'\]; valid fields: "
                                             r"\['img_size', 'mean', 'std', 'resize', 'crop_fraction', "):
            call({"resise": "center_crop"})
        with pytest.raises(ValueError, match=r"preprocess\.resize must be one of"):
            call({"resize": "squash"})
        with pytest.raises(TypeError, match="preprocess must be a Preprocess, a mapping of its fields or None"):
            call(["resize"])
    with pytest.raises(TypeError, match="give preprocess= or the deprecated normalize, not both"):
        vitlab.predict(ckpt, images, preprocess={"resize": "resize"}, normalize="imagenet")
    with pytest.raises(TypeError, match="unexpected keyword argument 'resize'"):  # evaluate's was eval_resize
        evaluate_checkpoint(ckpt, data, resize="center_crop")
    with pytest.raises(ValueError, match="eval_crop_fraction"):
        evaluate_checkpoint(ckpt, data, crop_fraction=1.5)


def test_predict_and_analysis_take_preprocess_and_the_old_keywords(checkpoint_and_tree):
    from vitlab.analysis import analysis_preprocess, load_checkpoint

    ckpt, _, images = checkpoint_and_tree
    fields = {"mean": pp.IMAGENET.mean, "std": pp.IMAGENET.std, "interpolation": "bicubic"}
    new = vitlab.predict(ckpt, images, 2, fields)
    with pytest.warns(DeprecationWarning, match=r"predict\(normalize=, interpolation=\) is deprecated"):
        old = vitlab.predict(ckpt, images, 2, "imagenet", interpolation="bicubic")  # normalize was the 4th argument
    assert old == new != vitlab.predict(ckpt, images, 2)
    assert vitlab.predict(ckpt, images, 2, Preprocess(32, *pp.IMAGENET, interpolation="bicubic")) == new
    model = load_checkpoint(ckpt)
    pre = analysis_preprocess(model, ckpt, (48, 32), preprocess={"resize": "center_crop", "crop_fraction": 0.5})
    with pytest.warns(DeprecationWarning, match=r"analysis_preprocess\(crop_fraction=\)"):
        assert analysis_preprocess(model, ckpt, (48, 32), crop_fraction=0.5) == pre
    assert pre == files.vit_jax((48, 32)).replace(resize="center_crop", crop_fraction=0.5)
    assert analysis_preprocess(model, ckpt, (48, 32), preprocess=files.vit_jax(32)).img_size == (48, 32)


def test_cli_flags_become_the_preprocess_mapping():
    from vitlab.cli import build_parser
    from vitlab.cli._common import preprocess_overrides

    def flags(*argv):
        return preprocess_overrides(build_parser().parse_args(["eval", "m.safetensors", "--data", "x", *argv]))

    assert flags() == {}
    assert flags("--crop-fraction", "0.8") == {"crop_fraction": 0.8, "resize": "center_crop"}
    assert flags("--resize", "resize") == {"resize": "resize", "crop_fraction": 1.0}
    assert flags("--eval-resize", "center_crop") == {"resize": "center_crop"}
    assert flags("--normalize", "imagenet", "--interpolation", "nearest") == {
        "mean": pp.IMAGENET.mean, "std": pp.IMAGENET.std, "interpolation": "nearest"}


def test_predict_uses_the_eval_crop(tmp_path, photo, capsys):
    """The reported bug: `predict` squashed images that `eval` centre-cropped. A checkpoint whose recipe evaluated
    with a 0.5 centre crop: predict's probabilities are the model's on the centre crop."""
    model = perturb_(vitlab.create_model("ViT-Ti/16", **TINY, img_size=32, patch_size=8, num_classes=4)).eval()
    with torch.no_grad():
        model.head.weight.mul_(50.0)
    recipe = {"data": {"normalize": "inception", "eval_resize": "center_crop", "eval_crop_fraction": 0.5}}
    vitlab.save_weights(model, tmp_path / "m.safetensors", {"recipe": recipe, "classes": list("abcd")})
    capsys.readouterr()
    assert main(["predict", str(tmp_path / "m.safetensors"), str(photo), "--top-k", "4", "--json"]) == 0
    got = {t["index"]: t["prob"] for t in json.loads(capsys.readouterr().out)[0]["top"]}
    img = Image.open(photo).convert("RGB")
    short = img.resize((int(411 * 64 / 300), 64), Image.BILINEAR)  # shorter side 32 / 0.5, then the centre
    left, top = round((short.width - 32) / 2), round((short.height - 32) / 2)  # torchvision's rounding
    crop = np.asarray(short.crop((left, top, left + 32, top + 32)), np.float32)
    x = torch.from_numpy((crop - 127.5) / 127.5).permute(2, 0, 1)[None]
    with torch.no_grad():
        ref = model(x).softmax(-1)[0]
    torch.testing.assert_close(torch.tensor([got[i] for i in range(4)]), ref, atol=1e-4, rtol=0)


def test_predict_names_imagenet_classes(tmp_path, photo, capsys):
    model = vitlab.create_model("ViT-Ti/16", **TINY, img_size=32, patch_size=8, num_classes=1000)
    model.preprocess = files.vit_jax(32)
    vitlab.save_weights(model, tmp_path / "in1k.safetensors")
    capsys.readouterr()
    assert main(["predict", str(tmp_path / "in1k.safetensors"), str(photo), "--top-k", "3", "--json"]) == 0
    top = json.loads(capsys.readouterr().out)[0]["top"]
    names = imagenet_classes()
    assert len(names) == 1000 and names[0] == "tench" and names[999] == "toilet tissue"
    assert all(t["label"] == names[t["index"]] for t in top)


# -- commands ----------------------------------------------------------------------------------------------------

def test_analyze_img_size_on_a_hybrid_checks_pixels_per_token(tmp_path, photo, capsys):
    """The reported bug: --img-size was checked against patch_size (1 here), so 36 passed and the model raised a
    traceback; the hybrid's token covers 4 * 2 * 1 = 8 pixels."""
    model = vitlab.create_model("ViT-Ti/16", **TINY, img_size=32, patch_size=1, num_classes=3, hybrid_layers=(1, 1),
                                hybrid_width=32)
    model.preprocess = files.vit_jax(32)
    vitlab.save_weights(model, tmp_path / "h.safetensors")
    assert main(["analyze", str(tmp_path / "h.safetensors"), "--images", str(photo), "-o", str(tmp_path / "out"),
                 "--img-size", "36"]) == 1
    err = capsys.readouterr().err
    assert "pixels per token 8" in err and "Traceback" not in err


def test_finetuning_takes_the_checkpoints_preprocessing_unless_the_recipe_says(tmp_path):
    from torchvision.models.vision_transformer import VisionTransformer as TVViT

    from vitlab.train.loop import data_config_with_init
    from vitlab.train.recipe import Recipe

    tv = TVViT(image_size=224, patch_size=16, num_layers=1, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=5)
    torch.save(tv.state_dict(), tmp_path / "tv.pth")
    base = {"model": {"name": "ViT-Ti/16", **TINY, "img_size": 32, "patch_size": 16},
            "data": {"dataset": "imagefolder", "root": str(tmp_path)},
            "train": {"steps": 1}, "init": {"checkpoint": str(tmp_path / "tv.pth")}}
    cfg = data_config_with_init(Recipe.from_dict(base))
    assert (cfg.normalize, cfg.eval_resize, cfg.eval_crop_fraction) == ("imagenet", "center_crop", 0.875)
    base["data"]["normalize"] = "inception"
    cfg = data_config_with_init(Recipe.from_dict(base))
    assert (cfg.normalize, cfg.eval_resize) == ("inception", "center_crop")


def test_train_saves_what_it_trained_with(tmp_path):
    """One fine-tuning step from a checkpoint that carries ImageNet statistics: the saved model carries them."""
    from vitlab.train import train
    from vitlab.train.recipe import Recipe

    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c in ("a", "b"):
            (tmp_path / "tree" / split / c).mkdir(parents=True)
            for i in range(2):
                Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(
                    tmp_path / "tree" / split / c / f"{i}.png")
    pre = vitlab.create_model("ViT-Ti/16", **TINY, img_size=16, patch_size=8, num_classes=7)
    pre.preprocess = Preprocess(16, *pp.IMAGENET, "center_crop", 0.875, "bicubic", source="test")
    vitlab.save_weights(pre, tmp_path / "pre.safetensors")
    recipe = Recipe.from_dict({
        "model": {"name": "ViT-Ti/16", **TINY, "img_size": 16, "patch_size": 8},
        "data": {"dataset": "imagefolder", "root": str(tmp_path / "tree")},
        "train": {"batch_size": 2, "steps": 1, "eval_every": 0, "precision": "fp32"},
        "init": {"checkpoint": str(tmp_path / "pre.safetensors")}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # tiny data: the loader's warnings are not the point here
        summary = train(recipe, tmp_path / "run", progress=False)
    saved = vitlab.load_model(summary["model"]).preprocess
    assert (saved.normalize, saved.resize, saved.crop_fraction) == ("imagenet", "center_crop", 0.875)
    assert saved.source == "recipe data section"


def test_shipped_folder_recipe_is_table_4_with_the_checkpoints_preprocessing(monkeypatch):
    """configs/vit_b16_finetune_folder.yaml: the paper's fine-tuning settings, a registry checkpoint, and no
    preprocessing of its own, so the checkpoint's (vit_jax: [-1, 1], whole image) applies."""
    from pathlib import Path

    from vitlab.train import build, load_recipe
    from vitlab.weights import hub, registry

    recipe = load_recipe(Path(__file__).parents[1] / "configs" / "vit_b16_finetune_folder.yaml")
    o, s = recipe.optim, recipe.schedule
    assert (o.name, o.momentum, o.weight_decay, o.clip_grad_norm, s.name) == ("sgd", 0.9, 0.0, 1.0, "cosine")
    assert recipe.init.drop_head and recipe.model.overrides["img_size"] == 384 and recipe.train.batch_size == 512
    assert recipe.data["dataset"] == "imagefolder"
    assert not {"normalize", "eval_resize", "eval_crop_fraction"} & set(recipe.data)
    entry = registry.get(recipe.init.checkpoint)
    assert entry.format == "npz" and entry.img_size == 224
    own = hub.entry_preprocess(entry)
    monkeypatch.setattr(build, "init_preprocess", lambda r: own)  # what the download would give, offline
    cfg = build.data_config_with_init(recipe)
    assert (cfg.normalize, cfg.eval_resize) == ("inception", "resize")
