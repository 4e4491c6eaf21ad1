"""Progressive resizing (`train.resize_schedule`): smaller training images early, the model's size at the end."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image
from torchvision.transforms.v2 import functional as TF

import vitlab.models.vit
from vitlab.train import Recipe, train
from vitlab.train.loop import resize_batch
from vitlab.train.recipe import size_at

TINY = {"name": "ViT-Ti/16", "embed_dim": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64, "img_size": 28,
        "patch_size": 7, "in_chans": 1}


def _recipe(data: dict, schedule, model: dict | None = None, steps: int = 8) -> Recipe:
    return Recipe.from_dict({
        "model": {**TINY, **(model or {})},
        "data": data,
        "optim": {"name": "adamw", "lr": 1e-3},
        "schedule": {"name": "cosine", "warmup_steps": 1},
        "train": {"batch_size": 4, "steps": steps, "precision": "fp32", "log_every": 1,
                  "evaluators": {"eval": {"type": "classification", "batch_size": 50, "max_samples": 50}},
                  "resize_schedule": schedule},
    })


@pytest.fixture
def shapes(monkeypatch):
    """The (H, W) of every training-mode forward, and of every eval forward, through the patch embedding."""
    seen: dict[str, list[tuple[int, int]]] = {"train": [], "eval": []}
    original = vitlab.models.vit.PatchEmbed.forward

    def spy(self, x):
        seen["train" if self.training else "eval"].append(tuple(x.shape[-2:]))
        return original(self, x)

    monkeypatch.setattr(vitlab.models.vit.PatchEmbed, "forward", spy)
    return seen


def test_size_at_follows_the_schedule():
    sched = [[14, 0.25], [21, 0.5]]
    assert [size_at(sched, p, 28) for p in (0.0, 0.2, 0.25, 0.49, 0.5, 0.99)] == [14, 14, 21, 21, 28, 28]
    assert size_at(None, 0.1, 28) == 28


@pytest.mark.parametrize("bad, words", [
    ([], "non-empty list"),
    ([[14]], "[size, until] pair"),
    ([[14.5, 0.3]], "size must be a positive int"),
    ([[0, 0.3]], "size must be a positive int"),
    ([[14, 0.5], [21, 0.4]], "strictly increasing"),
    ([[14, 1.0]], "until must be in (0, 1)"),
    ("14", "non-empty list"),
])
def test_bad_schedules_are_named(bad, words, synthetic_data):
    with pytest.raises(ValueError, match="resize_schedule") as e:
        _recipe(synthetic_data, bad)
    assert words in str(e.value)


def test_size_not_a_multiple_of_the_patch_fails_before_training(tmp_path, synthetic_data):
    r = _recipe(synthetic_data, [[16, 0.5]])
    with pytest.raises(ValueError, match="size 16 is not a multiple of the model's 7 pixels per token"):
        train(r, tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_array_stream_trains_at_scheduled_sizes_and_evaluates_at_full(tmp_path, synthetic_data, shapes):
    data = {**synthetic_data, "inception_crop": True, "hflip": True}
    summary = train(_recipe(data, [[14, 0.25], [21, 0.5]]), tmp_path / "run", progress=False)
    assert summary["status"] == "completed" and summary["step"] == 8
    # progress = step / 8: steps 0-1 below 0.25, 2-3 below 0.5, 4-7 at the model's 28 px
    assert shapes["train"] == [(14, 14)] * 2 + [(21, 21)] * 2 + [(28, 28)] * 4
    assert shapes["eval"] and set(shapes["eval"]) == {(28, 28)}
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["img_size"] for r in rows if r["split"] == "train"] == [14, 14, 21, 21, 28, 28, 28, 28]


def test_resize_batch_matches_torchvision():
    x = torch.rand(3, 3, 28, 28)
    for hw in ((14, 14), (21, 21), (40, 40)):
        torch.testing.assert_close(resize_batch(x, hw), TF.resize(x, list(hw), antialias=True))
    assert resize_batch(x, (28, 28)) is x


def test_file_stream_batches_are_resized_in_the_loop(tmp_path, shapes):
    root = tmp_path / "tree"
    g = torch.Generator().manual_seed(0)
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(6):
            px = (torch.rand(28, 28, 3, generator=g) * 255).to(torch.uint8).numpy()
            Image.fromarray(px).save(root / c / f"{i}.png")
    data = {"dataset": "imagefolder", "root": str(root), "test_root": str(root), "num_workers": 0}
    r = _recipe(data, [[14, 0.5]], model={"in_chans": 3}, steps=4)
    summary = train(r, tmp_path / "run", progress=False)
    assert summary["status"] == "completed"
    assert shapes["train"] == [(14, 14)] * 2 + [(28, 28)] * 2
    assert set(shapes["eval"]) == {(28, 28)}
