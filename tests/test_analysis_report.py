"""The report: every figure as PNG + JSON, one self-contained HTML page, nothing overwritten silently."""

import base64
import io
import json
import re

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.analysis.report import analyze, report_files, similarity_mosaic, write_report

from .conftest import perturb_


@pytest.fixture(scope="module")
def result():
    torch.manual_seed(0)
    model = perturb_(vitlab.create_model("ViT-Ti/16", depth=3, img_size=(24, 32), patch_size=4, in_chans=3,
                                         num_classes=5, embed_dim=48, num_heads=3, mlp_dim=96), scale=0.3)
    return analyze(model, torch.randn(5, 3, 24, 32), batch_size=2, layer_maps=[1], num_components=10,
                   source="tiny")


def test_report_writes_png_json_and_self_contained_html(result, tmp_path):
    files = write_report(result, tmp_path / "out")
    names = sorted(p.name for p in files)
    assert names == sorted(report_files(result))
    assert {"filters.png", "posembed_similarity.png", "attention_distance.png", "attention_rollout.png",
            "attention_layer2.png", "report.html", "findings.json"} <= set(names)
    out = tmp_path / "out"
    pngs = sorted(out.glob("*.png"))
    for png in pngs:
        with Image.open(png) as im:
            assert im.format == "PNG" and im.width > 100 and im.height > 100
    page = (out / "report.html").read_text()
    inlined = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert sorted(base64.b64decode(s) for s in inlined) == sorted(p.read_bytes() for p in pngs)
    assert not re.search(r'(src|href)="(?!data:)', page)  # nothing to fetch: one file carries it all
    # the JSON holds the numbers behind each figure
    dist = json.loads((out / "attention_distance.json").read_text())
    np.testing.assert_allclose(dist["mean_distance"], result.attention.mean_distance, atol=1e-6)
    sim = json.loads((out / "posembed_similarity.json").read_text())
    np.testing.assert_allclose(sim["similarity"], result.pos_similarity, atol=1e-5)
    assert np.asarray(sim["similarity"]).shape == (6, 8, 6, 8)  # the grid's own (non-square) layout
    roll = json.loads((out / "attention_rollout.json").read_text())
    assert np.asarray(roll["maps"]).shape == (5, 6, 8)
    filters = json.loads((out / "filters.json").read_text())
    assert np.asarray(filters["components"]).shape == (10, 3, 4, 4)
    findings = json.loads((out / "findings.json").read_text())
    assert set(findings["findings"]) == {"pos_embed_2d", "distance_grows_with_depth", "early_local_and_global"}


def test_report_never_overwrites_without_force(result, tmp_path):
    (tmp_path / "report.html").write_text("the user's page")
    with pytest.raises(FileExistsError, match=r"report\.html"):
        write_report(result, tmp_path)
    assert (tmp_path / "report.html").read_text() == "the user's page"
    assert not (tmp_path / "filters.png").exists()  # refused before writing anything
    write_report(result, tmp_path, overwrite=True)
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert not list(tmp_path.glob(".*.tmp"))


def test_similarity_mosaic_places_each_map_in_its_grid_cell():
    sim = np.arange(2 * 3 * 2 * 3, dtype=float).reshape(2, 3, 2, 3)
    m = similarity_mosaic(sim)
    assert m.shape == (2 * 3 - 1, 3 * 4 - 1)
    np.testing.assert_array_equal(m[3:5, 4:7], sim[1, 1])
    assert np.isnan(m[2]).all() and np.isnan(m[:, 3]).all()


def test_plots_render_to_png(result):
    from vitlab.analysis.report import plot_attention_distance

    buf = io.BytesIO()
    fig = plot_attention_distance(result.attention.mean_distance, result.attention.uniform_distance)
    fig.savefig(buf, format="png")
    assert buf.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"


def _result_with(mean_distance, pos_similarity, uniform=10.0):
    from vitlab.analysis import AttentionAnalysis
    from vitlab.analysis.report import AnalysisResult

    md = np.asarray(mean_distance, dtype=float)
    att = AttentionAnalysis(mean_distance=md, distance_per_image=md[None], rollout=np.ones((1, 2, 2)), grid=(2, 2),
                            patch_size=4, uniform_distance=uniform)
    return AnalysisResult(images=np.zeros((1, 8, 8, 1)), filters=None, pos_similarity=pos_similarity,
                          attention=att, config={})


def test_findings_recognise_the_papers_picture_and_reject_uniform_attention():
    from vitlab.analysis import pos_embed_similarity
    from vitlab.analysis.report import findings
    from vitlab.models.posembed import sincos_2d

    sincos = pos_embed_similarity(sincos_2d(7, 7, 64).numpy().reshape(7, 7, 64))
    # the paper's Fig. 7: early layers mix local (1 px) and global (9 px) heads, later layers are all global
    paper_like = [[1.0, 9.0, 5.0], [2.0, 9.5, 6.0], [7.0, 9.0, 8.0], [8.5, 9.5, 9.0], [9.0, 9.6, 9.4], [9.5, 9.8, 9.6]]
    f = findings(_result_with(paper_like, sincos))
    assert f["pos_embed_2d"]["yes"] and f["distance_grows_with_depth"]["yes"] and f["early_local_and_global"]["yes"]
    # untrained: position embeddings unrelated to the grid, every head near uniform attention's distance
    rng = np.random.default_rng(0)
    random_sim = pos_embed_similarity(rng.standard_normal((7, 7, 64)))
    flat = 10.0 + 0.01 * np.arange(18).reshape(6, 3)  # grows, but by a negligible amount
    f = findings(_result_with(flat, random_sim))
    assert not f["pos_embed_2d"]["yes"]
    assert not f["distance_grows_with_depth"]["yes"] and not f["early_local_and_global"]["yes"]
