"""`vitlab models --json`: valid JSON, one row per built-in variant, the paper's Table 1 shapes and parameter
counts (Dosovitskiy et al. 2021: ViT-Base 86M, ViT-Large 307M, ViT-Huge 632M)."""

from __future__ import annotations

import json

import pytest
import torch

import vitlab
from vitlab.cli import main
from vitlab.models.config import VARIANTS

KEYS = {"family", "name", "layers", "width", "mlp", "heads", "params", "seq_224", "gflops_224", "seq_384",
        "gflops_384"}
BIT_KEYS = {"family", "name", "units", "width", "params", "gflops_224", "gflops_384"}


def _rows(capsys, *args: str, family: str = "vit") -> dict[str, dict]:
    capsys.readouterr()
    assert main(["models", "--json", *args]) == 0
    rows = json.loads(capsys.readouterr().out)  # the whole of stdout is one JSON document
    assert isinstance(rows, list) and all(set(r) == {"vit": KEYS, "bit": BIT_KEYS}[r["family"]] for r in rows)
    return {r["name"]: r for r in rows if r["family"] == family}


def test_models_json_matches_table_1(capsys):
    rows = _rows(capsys)
    assert set(rows) == set(VARIANTS)
    # Table 1: layers, hidden size D, MLP size, heads
    for name, shape in {"ViT-B/16": (12, 768, 3072, 12), "ViT-L/16": (24, 1024, 4096, 16),
                        "ViT-H/14": (32, 1280, 5120, 16)}.items():
        r = rows[name]
        assert (r["layers"], r["width"], r["mlp"], r["heads"]) == shape
    # Params with a 1000-class head, in whole millions as the paper prints them (86.57M -> "86M"); Large counts
    # 304.3M, which the paper gives as 307M
    assert rows["ViT-B/16"]["params"] // 10**6 == 86
    assert round(rows["ViT-L/16"]["params"] / 1e5) == 3043
    assert rows["ViT-H/14"]["params"] // 10**6 == 632
    # sequence length: (side / P)^2 patches + the class token; 384 px for /14 is taken to 378
    assert rows["ViT-B/16"]["seq_224"] == 197 and rows["ViT-B/16"]["seq_384"] == 577
    assert rows["ViT-H/14"]["seq_224"] == 257 and rows["ViT-H/14"]["seq_384"] == 730
    assert rows["ViT-B/32"]["gflops_224"] < rows["ViT-B/16"]["gflops_224"] < rows["ViT-B/16"]["gflops_384"]


@pytest.mark.parametrize("name", ["ViT-Ti/16", "R26+ViT-S/32"])
def test_params_are_the_models_own_count(name, capsys):
    """--num-classes changes the head only, and the count is what the built model holds, tensor by tensor."""
    rows, ten = _rows(capsys)[name], _rows(capsys, "--num-classes", "10")[name]
    assert rows["params"] - ten["params"] == (1000 - 10) * (rows["width"] + 1)  # head weight + bias
    model = vitlab.create_model(name, num_classes=10)
    assert ten["params"] == sum(p.numel() for p in model.parameters())


def test_models_lists_the_bit_baselines_with_timms_counts(capsys):
    """The BiT rows: timm's resnetv2_50x1_bit holds the same parameters; ResNet-50's ~4.1 G multiply-adds at 224."""
    timm = pytest.importorskip("timm")
    rows = _rows(capsys, family="bit")
    assert {"BiT-R50x1", "BiT-R152x4", "BiT-R26x1"} <= set(rows)
    with torch.device("meta"):
        ref = timm.create_model("resnetv2_50x1_bit", num_classes=1000)
    assert rows["BiT-R50x1"]["params"] == sum(p.numel() for p in ref.parameters())
    assert rows["BiT-R50x1"]["units"] == [3, 4, 6, 3] and 4.0 < rows["BiT-R50x1"]["gflops_224"] / 2 < 4.2
    text_rows = (main(["models"]), capsys.readouterr().out)[1]
    assert "BiT-R101x3" in text_rows and "ViT-H/14" in text_rows
