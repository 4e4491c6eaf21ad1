"""The registry's later families (DeiT distilled, DeiT III, MAE, DINOv2, CLIP, SigLIP, SigLIP 2, EVA-02, DINOv3):
every entry's config builds a vitlab model whose parameters have the names and shapes of the model timm builds for
that architecture (both on the meta device: no weights, no downloads), the config is what the architecture fixes,
and `vitlab weights list --family`."""

from __future__ import annotations

import json

import pytest
import torch

from vitlab.cli import main
from vitlab.weights import WeightsError, create_model, registry
from vitlab.weights.timm_arch import fields_for

timm = pytest.importorskip("timm")

NEW = ("deit3", "mae", "dinov2", "clip", "siglip", "siglip2", "eva02", "dinov3")
ENTRIES = [e for e in registry.list_entries() if e.family in NEW or "distilled" in e.name]


def _arch(entry: registry.Entry) -> str:
    return entry.name.removeprefix("timm/").split(".")[0]


def test_each_family_is_listed() -> None:
    counts = {f: sum(e.family == f for e in ENTRIES) for f in NEW}
    assert counts == {"deit3": 6, "mae": 3, "dinov2": 8, "clip": 6, "siglip": 3, "siglip2": 1, "eva02": 2,
                      "dinov3": 3}
    assert sum("distilled" in e.name for e in ENTRIES) == 4
    assert {e.family for e in registry.list_entries()} <= set(registry.FAMILIES)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_entry_builds_timms_parameters(entry: registry.Entry) -> None:
    """Names and shapes of every parameter equal those of timm's model for the architecture (timm's Eva class
    through vitlab.weights.eva's renaming), and the config is what the architecture fixes."""
    from vitlab.weights import eva

    arch = _arch(entry)
    with torch.device("meta"):
        theirs = timm.create_model(arch, pretrained=False, num_classes=entry.num_classes)
        ours = create_model(entry.model_config())
    state = {k: v for k, v in theirs.state_dict().items() if not k.startswith("rope.")}
    if type(theirs).__name__ == "Eva":
        state = eva.to_ours(state, entry.name)
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == {k: tuple(v.shape) for k, v in state.items()}
    fields = {k: v for k, (v, _) in fields_for(arch, None, entry.name, pretrained_cfg={
        "num_classes": entry.num_classes, "input_size": [3, entry.img_size, entry.img_size]}).items()}
    cfg = entry.model_config()
    differ = {k: (getattr(cfg, k), v) for k, v in fields.items() if getattr(cfg, k) != (tuple(v) if isinstance(
        v, list) else v)}
    # OpenAI's CLIP towers: QuickGELU, what OpenAI trained with; the repos' config.json names timm's exact-GELU arch
    assert differ == ({"act": ("quick_gelu", "gelu")} if entry.name.endswith(".openai") else {}), differ


def test_openai_clip_is_timms_quickgelu_architecture() -> None:
    for e in (e for e in ENTRIES if e.name.endswith(".openai")):
        quick = _arch(e).replace("_clip_", "_clip_quickgelu_")
        assert fields_for(quick, None, e.name)["act"][0] == e.config["act"] == "quick_gelu"
        assert registry.find(f"{quick}.openai") is e  # timm's quickgelu tag loads this same repo


def test_cli_list_one_family(capsys) -> None:
    assert main(["weights", "list", "--family", "dinov2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.split()[0] for line in lines[1:-1]]
    assert names == [e.name for e in registry.list_entries() if e.family == "dinov2"] and len(names) == 8
    assert lines[-1].startswith("8 checkpoints")
    assert main(["weights", "list", "--family", "clip", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {e["family"] for e in listed} == {"clip"} and len(listed) == 6
    assert main(["weights", "list", "--family", "dino"]) == 2
    err = capsys.readouterr().err
    assert "--family 'dino' is not a model family of the registry" in err and "dinov2" in err


@pytest.mark.parametrize(("change", "message"), [
    (lambda e: e.update(family="dinov4"), r"family 'dinov4' is not one of"),
    (lambda e: e.pop("family"), r"missing field.*family"),
    (lambda e: e["config"].pop("embed_dim"), r"variant 'ViT-S/14' is not a vitlab variant.*nor a label"),
])
def test_bad_family_entries_are_refused(tmp_path, change, message) -> None:
    raw = json.loads(registry.REGISTRY_PATH.read_text())
    dino = next(e for e in raw if e["name"] == "timm/vit_small_patch14_dinov2.lvd142m")
    change(dino)
    path = tmp_path / "registry.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(WeightsError, match=message):
        registry.load(path)
