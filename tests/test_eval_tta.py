"""Test-time augmentation in `evaluate`: the averaged probabilities against a NumPy computation by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from vitlab.inference.evaluate import evaluate


class ColumnModel(nn.Module):
    """A fixed linear map of the image whose answer changes when the image is mirrored (left/right columns)."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = nn.Parameter(torch.randn(3, 1 * 4 * 5, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1) @ self.w.T  # (B, 3)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def test_hflip_tta_averages_the_two_views_probabilities():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, 1, 4, 5, generator=g)
    y = torch.randint(0, 3, (40,), generator=g)
    model = ColumnModel()
    w = model.w.detach().numpy().astype(np.float64)
    xn = x.numpy().astype(np.float64)
    p = (_softmax(xn.reshape(40, -1) @ w.T) + _softmax(xn[..., ::-1].reshape(40, -1) @ w.T)) / 2
    data = [(x[:16], y[:16]), (x[16:], y[16:])]
    r = evaluate(model, data, 3, precision="fp32", tta="hflip")
    yn = y.numpy()
    assert r["top1"] == pytest.approx(np.mean(p.argmax(1) == yn))
    assert r["loss"] == pytest.approx(-np.mean(np.log(p[np.arange(40), yn])), rel=1e-5)
    single = evaluate(model, data, 3, precision="fp32")
    p1 = _softmax(xn.reshape(40, -1) @ w.T)
    assert single["top1"] == pytest.approx(np.mean(p1.argmax(1) == yn))
    assert single["top1"] != r["top1"] or single["loss"] != pytest.approx(r["loss"])  # the flip did something


def test_evaluate_returns_a_typed_result_readable_by_name():
    """`evaluate` returns an EvalResult dataclass; `r["top1"]` still reads it (code written for the dict), and
    `to_dict()` is JSON-ready."""
    import json

    from vitlab.inference.evaluate import EvalResult

    x, y = torch.randn(6, 1, 4, 5), torch.tensor([0, 1, 2, 0, 1, 2])
    r = evaluate(ColumnModel(), [(x, y)], 3, class_names=["a", "b", "c"])
    assert isinstance(r, EvalResult) and r["top1"] == r.top1 and r.get("missing", 7) == 7 and "top5" in r
    with pytest.raises(KeyError):
        r["to_dict"]
    d = json.loads(json.dumps(r.to_dict()))
    assert d["num_samples"] == 6 and d["classes"] == ["a", "b", "c"] and sum(map(sum, d["confusion"])) == 6


def test_unknown_tta_is_a_clear_error():
    with pytest.raises(ValueError, match=r"test-time augmentation 'vflip'.*hflip"):
        evaluate(ColumnModel(), [(torch.zeros(2, 1, 4, 5), torch.zeros(2, dtype=torch.long))], 3, tta="vflip")
