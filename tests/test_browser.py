"""The HTML pages vitlab writes (analyze, demo, reproduce), opened in a real headless browser: every image decodes,
the console stays clean, and the numbers the JSON next to the page holds are visible on it."""

import json

import pytest
import torch

import vitlab
from vitlab.analysis.report import analyze, write_report

from .browser import Browser, PageView, assert_page_reads, require_browser
from .conftest import perturb_


@pytest.fixture(scope="module")
def browser():
    require_browser()
    b = Browser()
    yield b
    b.close()


def _fmt(v) -> str:  # how the findings table prints a number
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def test_analyze_page_reads_in_a_browser(browser, tmp_path):
    torch.manual_seed(0)
    model = perturb_(vitlab.create_model("ViT-Ti/16", depth=2, img_size=32, patch_size=8, in_chans=3,
                                         num_classes=5, embed_dim=48, num_heads=3, mlp_dim=96), scale=0.3)
    result = analyze(model, torch.randn(3, 3, 32, 32), batch_size=3, layer_maps=[0], num_components=8,
                     source="tiny")
    write_report(result, tmp_path)
    findings = json.loads((tmp_path / "findings.json").read_text())
    view = browser.view(tmp_path / "report.html")
    numbers = [_fmt(v) for f in findings["findings"].values() for k, v in f.items()
               if k != "yes" and isinstance(v, (int, float)) and not isinstance(v, bool)]
    assert numbers, findings
    assert_page_reads(view, numbers=numbers, min_images=5)
    assert "Mean attention distance" in view.text


def test_the_checker_sees_a_broken_page(browser, tmp_path):
    """The check itself can fail: a missing image, console.error and an exception are all caught."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body><p>12.5%</p><img src='missing.png'>"
                    "<script>console.error('boom'); notAFunction();</script></body></html>")
    view: PageView = browser.view(page)
    assert len(view.broken_images()) == 1
    assert any("boom" in e for e in view.errors) and any("notAFunction" in e for e in view.errors)
    with pytest.raises(AssertionError, match="console errors"):
        assert_page_reads(view, numbers=["12.5%"])
