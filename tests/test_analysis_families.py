"""The families page (`vitlab analyze --compare-families`): every family built at random init at one small size,
measured, and drawn on one page whose table shows the numbers of the JSON beside it; checkpoints are added where
they are on this machine and skipped (nothing downloaded) where not; the page reads in a headless browser."""

from __future__ import annotations

import html as html_lib
import json
import os

import numpy as np
import pytest

import vitlab
from vitlab.analysis.families import FAMILIES, cached_models, family_model, measure, noise_images
from vitlab.analysis.familypage import HEADER, families_page, summary_rows
from vitlab.cli import main

from .browser import Browser, assert_page_reads, require_browser
from .conftest import perturb_


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A trained-looking checkpoint (DINOv2-style: LayerScale, 2 registers), weights perturbed, saved as ours."""
    model = perturb_(vitlab.create_model("ViT-Ti/16", img_size=28, patch_size=7, embed_dim=48, depth=3, num_heads=3,
                                         mlp_dim=96, num_classes=4, layer_scale=0.5, reg_tokens=2,
                                         no_embed_class=True), scale=0.2)
    path = tmp_path_factory.mktemp("ckpt") / "dino.safetensors"
    vitlab.save_weights(model, path)
    return path


@pytest.fixture(scope="module")
def page(tmp_path_factory, checkpoint):
    """The CLI's page and JSON for the random-init families plus one cached checkpoint and one absent name."""
    out = tmp_path_factory.mktemp("page") / "families.html"
    assert main(["analyze", "--compare-families", str(checkpoint), "hf-hub:acme/not-cached", "--num-images", "3",
                 "-o", str(out)]) == 0
    return out, json.loads(out.with_suffix(".json").read_text())


def test_every_family_is_measured_with_its_own_tokens():
    for name, fields in FAMILIES.items():
        model = family_model(name)
        r = measure(model, noise_images(model.cfg, 2), name)
        counts = r.tokens.counts
        assert counts["patches"] == 16 and sum(counts.values()) == 16 + model.num_prefix_tokens
        assert ("registers" in counts) == bool(fields.get("reg_tokens"))
        assert ("distillation" in counts) == bool(fields.get("distilled"))
        assert r.head_distance.shape == (4, 4) and r.entropy.shape == (4,)
        assert (r.entropy <= r.uniform_entropy + 1e-9).all() and r.uniform_entropy == pytest.approx(
            np.log(16 + model.num_prefix_tokens))
        shares = np.sum([v for v in r.tokens.attention.values()], axis=0)
        np.testing.assert_allclose(shares, 1.0, atol=1e-6)
        if fields.get("pos_embed") == "none":  # DINOv3: RoPE only, no table
            assert r.pos_similarity is None and r.pos_summary is None
        else:
            assert r.pos_similarity is not None and r.pos_similarity.shape == (4, 4, 4, 4)


def test_the_page_shows_the_numbers_of_its_json(page, checkpoint):
    path, numbers = page
    html = path.read_text()
    names = [m["name"] for m in numbers["models"]]
    assert names == [*FAMILIES, str(checkpoint)]
    assert list(numbers["skipped"]) == ["hf-hub:acme/not-cached"]
    assert "offline mode is on" in numbers["skipped"]["hf-hub:acme/not-cached"]
    for h in HEADER:
        assert html_lib.escape(h) in html
    ckpt = numbers["models"][-1]
    assert ckpt["tokens"]["counts"] == {"class": 1, "registers": 2, "patches": 16}
    # the table's distance cell is the JSON's per-layer mean distance over uniform attention's, first -> last
    d = np.asarray(ckpt["mean_distance"]) / ckpt["uniform_distance"]
    assert html_lib.escape(f"{d[0]:.3f} -> {d[-1]:.3f}") in html
    for m in numbers["models"]:
        assert m["source"] == ("random init" if m["name"] in FAMILIES else m["name"])
    assert html.count("data:image/png;base64,") == 4


def test_summary_row_formats_the_measurements():
    model = family_model("DINOv2 + registers")
    r = measure(model, noise_images(model.cfg, 2), "x")
    row = dict(zip(HEADER, summary_rows(r)))
    assert row["prefix tokens"] == "1 class, 4 registers"
    assert row["query -> registers (last)"] == f"{r.tokens.attention['registers'][-1]:.3f}"
    assert row["high-norm patches (last)"] == f"{100 * r.tokens.outlier_fraction[-1]:.1f}%"


def test_cached_models_downloads_nothing(checkpoint, monkeypatch):
    monkeypatch.delenv("VITLAB_OFFLINE", raising=False)
    models, skipped = cached_models([str(checkpoint), "hf-hub:acme/absent", "/no/such/file.safetensors"])
    assert list(models) == [str(checkpoint)] and set(skipped) == {"hf-hub:acme/absent", "/no/such/file.safetensors"}
    assert "VITLAB_OFFLINE" not in os.environ  # restored


def test_page_needs_a_model():
    with pytest.raises(ValueError, match="no models"):
        families_page([])


def test_the_page_reads_in_a_browser(page):
    require_browser()
    b = Browser()
    try:
        view = b.view(page[0])
    finally:
        b.close()
    cells = [c for row in page[1]["models"][:2] for c in (row["name"],)]
    assert_page_reads(view, numbers=[*cells, "high-norm patches (last)"], min_images=4)
    assert view.title == "vitlab: ViT families"
