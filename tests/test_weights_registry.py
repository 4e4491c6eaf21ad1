"""The registry of official checkpoints (`vitlab.weights.registry`): its facts checked against the publishers'
own code where it is installed (torchvision's weights enums, timm's pretrained cfgs and models, transformers'
image processor), its lookups, its validation, and the docs table generated from it."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
import torch

from vitlab.models.config import VARIANTS
from vitlab.models.flops import count_params
from vitlab.models.preprocess import IMAGENET, INCEPTION, Preprocess
from vitlab.models.resnet import VARIANTS as BIT_VARIANTS
from vitlab.weights import WeightsError, create_model, registry

ROOT = Path(__file__).resolve().parents[1]
ENTRIES = registry.list_entries()


def by_format(fmt: str) -> list[registry.Entry]:
    return [e for e in ENTRIES if e.format == fmt]


def test_the_table_covers_each_publisher() -> None:
    names = {e.name for e in ENTRIES}
    for fname in ("ViT-B_16", "ViT-B_32", "ViT-L_16", "ViT-L_32", "ViT-H_14", "R50+ViT-B_16"):
        assert f"gs://vit_models/imagenet21k/{fname}.npz" in names
    for fname in ("ViT-B_16", "ViT-B_32", "ViT-L_16", "ViT-L_32", "R50+ViT-B_16", "ViT-B_16-224", "ViT-L_16-224"):
        assert f"gs://vit_models/imagenet21k+imagenet2012/{fname}.npz" in names
    augreg = [e for e in ENTRIES if e.name.startswith("gs://vit_models/augreg/")]
    for variant in ("ViT-Ti/16", "ViT-S/16", "ViT-S/32", "ViT-B/16", "ViT-B/32", "ViT-L/16", "R26+ViT-S/32"):
        mine = {(e.num_classes, e.img_size) for e in augreg if e.variant == variant}
        assert {(21843, 224), (1000, 384)} <= mine, variant
    assert len(by_format("torchvision")) == 10
    assert {"hf-hub:google/vit-base-patch16-224", "hf-hub:google/vit-huge-patch14-224-in21k",
            "hf-hub:facebook/deit-base-patch16-384", "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k"} <= names


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_every_entry_builds_and_parses(entry: registry.Entry) -> None:
    cfg = entry.model_config()
    labelled = {"embed_dim", "depth", "num_heads", "mlp_dim", "patch_size"} <= set(entry.config)  # "ViT-So400m/14"
    assert cfg.name == entry.variant and (entry.variant in VARIANTS or entry.variant in BIT_VARIANTS or labelled)
    assert cfg.num_classes == entry.num_classes and cfg.img_hw == (entry.img_size, entry.img_size)
    pre = entry.to_preprocess()
    assert isinstance(pre, Preprocess) and pre.hw == cfg.img_hw and pre.source
    assert entry.to_preprocess() == Preprocess.from_dict(pre.to_dict())
    if entry.accuracy is not None:
        assert 0 < entry.accuracy["value"] <= 100 and entry.accuracy["source"]
    assert (entry.labels is None) == (entry.num_classes == 0)


def test_configs_build_real_models_with_the_counted_parameters() -> None:
    """count_params (used for every entry above) agrees with the module actually built, once per distinct
    architecture (the input size only changes the position table, which count_params covers exactly)."""
    seen: set[str] = set()
    for e in ENTRIES:
        key = json.dumps({k: v for k, v in e.config.items() if k != "img_size"}, sort_keys=True) + e.variant
        if key in seen:
            continue
        seen.add(key)
        with torch.device("meta"):
            model = create_model(e.model_config())
        assert sum(p.numel() for p in model.parameters()) == count_params(e.model_config()), e.name


def test_names_aliases_and_urls_are_unique() -> None:
    keys = [k for e in ENTRIES for k in (e.name, *e.aliases)]
    assert len(keys) == len(set(keys))
    urls = [e.url for e in ENTRIES]
    assert len(urls) == len(set(urls))
    for e in ENTRIES:  # every key leads back to its own entry
        for key in (e.name, *e.aliases, e.url):
            assert registry.find(key) is e


def test_find_by_url_alias_and_equivalent_spellings() -> None:
    e = registry.find("https://download.pytorch.org/models/vit_b_16-c867db91.pth")
    assert e is not None and e.name == "torchvision/ViT_B_16_Weights.IMAGENET1K_V1"
    assert registry.find("vit_b_16.IMAGENET1K_V1") is e and registry.find("ViT_B_16_Weights.DEFAULT") is e
    r50 = registry.find("gs://vit_models/imagenet21k+imagenet2012/R50+ViT-B_16.npz")
    for spelling in ("https://storage.googleapis.com/vit_models/imagenet21k+imagenet2012/R50+ViT-B_16.npz",
                     "https://storage.googleapis.com/vit_models/imagenet21k%2Bimagenet2012/R50%2BViT-B_16.npz",
                     "vit_jax/imagenet21k+imagenet2012/R50+ViT-B_16"):
        assert registry.find(spelling) is r50
    assert r50.config == {"num_classes": 1000, "img_size": 384, "hybrid_eps": "vit_jax"}
    hf = registry.find("google/vit-base-patch16-224")
    assert hf is registry.find("hf-hub:google/vit-base-patch16-224") and hf.filename
    assert registry.find("TIMM/VIT_BASE_PATCH16_224.AUGREG2_IN21K_FT_IN1K").name == \
        "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k"
    assert registry.find("no/such-model") is None
    assert registry.get(e.name) is e


def test_get_unknown_name_suggests_close_ones() -> None:
    with pytest.raises(WeightsError, match=r"'vit_b16\.IMAGENET1K_V1'.*vit_b_16\.IMAGENET1K_V1"):
        registry.get("vit_b16.IMAGENET1K_V1")


# -- torchvision: its own enums are the reference -------------------------------------------------------------

@pytest.mark.parametrize("entry", by_format("torchvision"), ids=lambda e: e.name)
def test_torchvision_entries_match_torchvision(entry: registry.Entry) -> None:
    import torchvision.models as tvm

    enum_name, member = entry.name.removeprefix("torchvision/").split(".")
    weights = getattr(tvm, enum_name)[member]
    assert entry.url == weights.url
    assert entry.sha256_prefix == re.search(r"-([0-9a-f]+)\.pth$", weights.url).group(1)
    t = weights.transforms()
    pre = entry.to_preprocess()
    assert pre.resize == "center_crop" and pre.hw == (t.crop_size[0], t.crop_size[0])
    assert min(pre.resize_size) == t.resize_size[0]
    assert pre.mean == pytest.approx(tuple(t.mean)) and pre.std == pytest.approx(tuple(t.std))
    assert pre.interpolation == t.interpolation.value
    assert entry.img_size == weights.meta["min_size"][0]
    assert entry.num_classes == len(weights.meta["categories"])
    assert entry.accuracy["value"] == weights.meta["_metrics"]["ImageNet-1K"]["acc@1"]
    assert count_params(entry.model_config()) == weights.meta["num_params"]  # the architecture is theirs
    assert (f"{enum_name}.DEFAULT" in entry.aliases) == (weights == getattr(tvm, enum_name).DEFAULT)
    if "SWAG" in member:
        assert entry.license == "CC-BY-NC-4.0" and weights.meta["license"].startswith("https://github.com/"
                                                                                        "facebookresearch/SWAG")


# -- timm: pretrained_cfg and the models it builds --------------------------------------------------------------

@pytest.mark.parametrize("entry", by_format("timm"), ids=lambda e: e.name)
def test_timm_entries_match_pretrained_cfg(entry: registry.Entry) -> None:
    from timm.models import get_pretrained_cfg

    tag = entry.name.removeprefix("timm/")
    cfg = get_pretrained_cfg(tag)
    assert cfg is not None and cfg.hf_hub_id == f"timm/{tag}" and entry.url == f"hf-hub:timm/{tag}"
    pre = entry.to_preprocess()
    assert (3, *pre.hw) == tuple(cfg.input_size)
    assert pre.crop_fraction == cfg.crop_pct and pre.resize == "center_crop" and cfg.crop_mode == "center"
    assert pre.mean == pytest.approx(tuple(cfg.mean)) and pre.std == pytest.approx(tuple(cfg.std))
    assert pre.interpolation == cfg.interpolation
    assert entry.num_classes == cfg.num_classes
    assert entry.license.lower() == cfg.license


def test_timm_entries_have_timms_parameter_counts() -> None:
    """Each timm architecture, built by timm on the meta device, has the parameters of the entry's vitlab config."""
    import timm

    seen = set()
    for e in by_format("timm"):
        arch = e.name.removeprefix("timm/").split(".")[0]
        if (arch, e.num_classes) in seen:
            continue
        seen.add((arch, e.num_classes))
        with torch.device("meta"):
            model = timm.create_model(arch, pretrained=False, num_classes=e.num_classes)
        if type(model).__name__ == "Eva":  # no key bias parameter (ours: zeros in qkv.bias); shapes through the
            continue  # renaming: tests/test_weights_registry_families.py
        assert sum(p.numel() for p in model.parameters()) == count_params(e.model_config()), e.name


def test_google_files_timm_converted_agree_with_timm() -> None:
    """Every gs://vit_models file a timm tag was converted from is listed, with the tag's variant, classes, size."""
    import timm
    from timm.models import get_pretrained_cfg

    from vitlab.models.config import canonical_name

    checked = 0
    for tag in timm.list_pretrained():
        cfg = get_pretrained_cfg(tag)
        if not (cfg.url or "").startswith("https://storage.googleapis.com/vit_models/augreg/"):
            continue
        arch = tag.split(".")[0]
        if "r_s16_p8" in arch or "r50_s32" in arch:  # R+Ti/16, R50+L/32: no vitlab variant
            continue
        e = registry.find(cfg.url)
        assert e is not None, cfg.url
        assert e.format == "npz" and e.variant == canonical_name(arch), tag
        assert (e.num_classes, (3, e.img_size, e.img_size)) == (cfg.num_classes, tuple(cfg.input_size)), tag
        checked += 1
    assert checked >= 25


# -- Google's files and the Hub repos -----------------------------------------------------------------------------

def test_google_npz_entries_follow_vit_jax() -> None:
    for e in [e for e in by_format("npz") if not e.variant.startswith("BiT-")]:  # BiT: tests/test_weights_bit.py
        pre = e.to_preprocess()
        assert (pre.mean, pre.std, pre.resize, pre.crop_fraction) == (INCEPTION.mean, INCEPTION.std, "resize", 1.0)
        assert e.license == "Apache-2.0" and e.url.startswith("https://storage.googleapis.com/vit_models/")
        assert (e.config.get("hybrid_eps") == "vit_jax") == e.variant.startswith("R")
        if e.name.startswith("gs://vit_models/imagenet21k/"):  # pre-training files keep pre-logits and a 21k head
            assert e.config["representation_size"] == e.model_config().embed_dim and e.num_classes == 21843
        else:
            assert "representation_size" not in e.config


def test_hf_google_entries_match_their_image_processor() -> None:
    """The preprocessor_config.json the google/vit-* repos publish ({do_resize, size, mean/std 0.5}), read by
    transformers' ViTImageProcessor, is the squash-to-size, bilinear, [-1, 1] transform the entries state."""
    from transformers import ViTImageProcessor

    google = [e for e in by_format("hf") if e.name.startswith("hf-hub:google/")]
    assert len(google) == 11
    for e in google:
        proc = ViTImageProcessor(do_normalize=True, do_resize=True, image_mean=[0.5] * 3, image_std=[0.5] * 3,
                                 size=e.img_size)
        pre = e.to_preprocess()
        assert (proc.size["height"], proc.size["width"]) == pre.hw
        assert not getattr(proc, "do_center_crop", False) and pre.resize == "resize" and pre.crop_fraction == 1.0
        assert int(proc.resample) == 2 and pre.interpolation == "bilinear"  # PIL BILINEAR
        assert (pre.mean, pre.std) == (tuple(proc.image_mean), tuple(proc.image_std))
        in21k = e.name.endswith("-in21k")
        assert (e.num_classes == 0) == in21k
        assert (e.config.get("representation_size") == e.model_config().embed_dim) == in21k


def test_deit_entries_use_deits_eval_transform() -> None:
    deit = [e for e in by_format("hf") if e.name.startswith("hf-hub:facebook/deit-")]
    assert len(deit) == 4 and not any("distilled" in e.name for e in deit)
    for e in deit:
        pre = e.to_preprocess()
        # DeiT's datasets.py: Resize(int(input_size / 0.875), bicubic), CenterCrop(input_size), ImageNet mean/std
        assert pre.resize == "center_crop" and min(pre.resize_size) == int(e.img_size / 0.875)
        assert pre.interpolation == "bicubic" and (pre.mean, pre.std) == (IMAGENET.mean, IMAGENET.std)


# -- validation ---------------------------------------------------------------------------------------------------

def _raw() -> list[dict]:
    return json.loads(registry.REGISTRY_PATH.read_text())


@pytest.mark.parametrize(("change", "message"), [
    (lambda r: r[0].update(variant="ViT-X/16"), r"entry 0 \(gs://vit_models/imagenet21k/ViT-B_16\.npz\).*variant"),
    (lambda r: r[1].update(img_size=100), r"entry 1 .*does not build"),
    (lambda r: r[2]["preprocess"].update(interpolation="lanczos"), r"entry 2 .*bad preprocess.*interpolation"),
    (lambda r: r[3].pop("license"), r"entry 3\b.*missing field.*license"),
    (lambda r: r[4].update(aliases=[r[5]["name"]]), r"names both"),
    (lambda r: r[5].update(sha256_prefix="C867DB91"), r"sha256_prefix"),
    (lambda r: r[6].update(labels=None), r"labels is null exactly when"),
])
def test_bad_tables_are_refused_naming_the_entry(tmp_path: Path, change, message: str) -> None:
    raw = _raw()
    change(raw)
    path = tmp_path / "registry.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(WeightsError, match=message):
        registry.load(path)


def test_the_shipped_table_round_trips() -> None:
    assert [e.to_dict() for e in registry.load()] == _raw()


def test_registry_json_is_package_data() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "weights/registry.json" in pyproject["tool"]["setuptools"]["package-data"]["vitlab"]


def test_docs_list_the_current_table() -> None:
    docs = (ROOT / "docs" / "weights.md").read_text()
    assert registry.markdown_table() in docs, "docs/weights.md is stale: paste vitlab.weights.registry.markdown_table()"
