"""DeiT hard distillation as a recipe: the loss the training loop takes is 0.5 CE(class head, y) + 0.5 CE(distillation
head, argmax teacher(x)), computed here independently; the teacher (a vitlab checkpoint or a timm model) stays frozen
and gets its own pixels; a short run ends with a student that averages its two heads."""

from __future__ import annotations

import math

import pytest
import torch

import vitlab
from vitlab.models.preprocess import IMAGENET, Stats, from_stats
from vitlab.train import Recipe, train
from vitlab.train.distill import TeacherInputs, hard_distillation_loss, load_teacher
from vitlab.train.distributed import DistInfo
from vitlab.train.recipe import DistillSection
from vitlab.train.run import Run
from vitlab.train.step import train_step

from .conftest import perturb_

STUDENT = {"name": "ViT-Ti/16", "embed_dim": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64, "img_size": 28,
           "patch_size": 7, "in_chans": 1, "distilled": True}


def _ce(logits: torch.Tensor, target: torch.Tensor, smoothing: float = 0.0) -> torch.Tensor:
    """Cross-entropy written out: -sum q log softmax, q the (smoothed) one-hot target, averaged over the batch."""
    k = logits.shape[1]
    q = torch.full_like(logits, smoothing / k)
    q[torch.arange(len(target)), target] += 1 - smoothing
    logp = logits - logits.exp().sum(1, keepdim=True).log()
    return -(q * logp).sum(1).mean()


@pytest.fixture
def teacher_path(tmp_path):
    """A tiny plain ViT teacher (10 classes, Fashion-MNIST-shaped), every weight perturbed, saved as users hold one."""
    torch.manual_seed(1)
    teacher = perturb_(vitlab.create_model("ViT-Ti/16", embed_dim=48, depth=1, num_heads=3, mlp_dim=96, img_size=28,
                                           patch_size=7, in_chans=1, num_classes=10), scale=0.5)
    teacher.preprocess = from_stats("inception", 28, in_chans=1)  # what the synthetic data pipeline applies
    path = tmp_path / "teacher.safetensors"
    vitlab.save_weights(teacher, path)
    return path


def _recipe(data: dict, teacher: str | None, **train_kw) -> Recipe:
    tr = {"batch_size": 16, "steps": 3, "precision": "fp32", "log_every": 1, "label_smoothing": 0.1,
          "evaluators": {"eval": {"type": "classification", "max_samples": 64}}, **train_kw}
    return Recipe.from_dict({"model": STUDENT, "data": data, "optim": {"lr": 1e-3}, "train": tr,
                             "distill": {"teacher": teacher}})


def test_hard_distillation_loss_is_the_formula():
    g = torch.Generator().manual_seed(0)
    cls, dist, teacher = (torch.randn(6, 5, generator=g) for _ in range(3))
    y = torch.randint(5, (6,), generator=g)
    expected = 0.5 * _ce(cls, y, 0.1) + 0.5 * _ce(dist, teacher.argmax(1))
    torch.testing.assert_close(hard_distillation_loss(cls, dist, y, teacher, 0.1), expected)


def test_the_loop_trains_on_the_distillation_loss(tmp_path, synthetic_data, teacher_path):
    """The run's own loss (built from the recipe) on a batch equals the formula computed here from the student's two
    heads and an independently loaded teacher; the step changes the student, not the teacher."""
    recipe = _recipe(synthetic_data, str(teacher_path))
    with Run(recipe, tmp_path / "run", DistInfo(device=torch.device("cpu"))) as run:
        perturb_(run.model, scale=0.05)  # the zero-initialised heads would hide a swapped term
        x, y = next(iter(run.stream))
        run.model.train()
        with torch.no_grad():
            cls, dist = run.model(x)  # distilled_training: both heads while training
            teacher = vitlab.load_model(teacher_path).eval()
            expected = 0.5 * _ce(cls, y, 0.1) + 0.5 * _ce(dist, teacher(x).argmax(1))
        before = {k: v.clone() for k, v in run.loss_fn.teacher.state_dict().items()}
        result = train_step(run.net, run.optimizer, [(x, y)], lr=1e-3, device=torch.device("cpu"), precision="fp32",
                            label_smoothing=0.1, loss_fn=run.loss_fn)
    assert result.loss == pytest.approx(expected.item(), rel=1e-5)
    assert not run.loss_fn.teacher.training
    for k, v in run.loss_fn.teacher.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)


def test_a_distilled_run_ends_with_averaged_heads(tmp_path, synthetic_data, teacher_path):
    result = train(_recipe(synthetic_data, str(teacher_path)), tmp_path / "run", progress=False)
    assert result.status == "completed" and result.eval is not None and math.isfinite(result.eval.loss)
    student = vitlab.load_model(result.model)
    assert student.cfg.distilled and not student.training
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        z = student.forward_features(x)
        both = (student.head(z[:, 0]) + student.head_dist(z[:, 1])) / 2
        torch.testing.assert_close(student(x), both)
    assert "teacher:" in (tmp_path / "run" / "recipe.yaml").read_text()


def test_distillation_refuses_what_it_cannot_do(tmp_path, synthetic_data, teacher_path):
    with pytest.raises(ValueError, match=r"model\.distilled: true"):
        train(Recipe.from_dict({"model": {**STUDENT, "distilled": False}, "data": synthetic_data,
                                "train": {"steps": 1, "batch_size": 8, "precision": "fp32"},
                                "distill": {"teacher": str(teacher_path)}}), tmp_path / "a", progress=False)
    with pytest.raises(ValueError, match="teacher_checkpoint / teacher_kwargs are for a timm teacher"):
        Recipe.from_dict({"train": {"steps": 1}, "distill": {"teacher": str(teacher_path),
                                                              "teacher_kwargs": {"in_chans": 1}}})
    with pytest.raises(ValueError, match="has 10 classes but the data has 3"):
        load_teacher(DistillSection(teacher=str(teacher_path)), num_classes=3)


def test_a_timm_teacher_loads_frozen_from_its_checkpoint(tmp_path):
    timm = pytest.importorskip("timm")
    theirs = perturb_(timm.create_model("resnet10t", pretrained=False, num_classes=10, in_chans=1), scale=0.05).eval()
    torch.save(theirs.state_dict(), tmp_path / "resnet.pth")
    spec = DistillSection(teacher="timm:resnet10t", teacher_checkpoint=str(tmp_path / "resnet.pth"),
                          teacher_kwargs={"in_chans": 1})
    teacher, stats, size, in_chans = load_teacher(spec, num_classes=10)
    assert stats is None and size is None and in_chans == 1 and not teacher.training
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(teacher(x), theirs(x))


def test_teacher_inputs_convert_channels_statistics_and_size():
    x = torch.rand(2, 1, 8, 8) * 2 - 1  # the student's pixels, inception-normalised grey
    out = TeacherInputs(3, (16, 16), Stats((0.5,), (0.5,)), IMAGENET)(x)
    pixels = x * 0.5 + 0.5  # [0, 1] again
    mean, std = torch.tensor(IMAGENET.mean).view(1, 3, 1, 1), torch.tensor(IMAGENET.std).view(1, 3, 1, 1)
    expected = torch.nn.functional.interpolate((pixels.expand(-1, 3, -1, -1) - mean) / std, size=(16, 16),
                                               mode="bilinear", align_corners=False, antialias=True)
    torch.testing.assert_close(out, expected)
    same = TeacherInputs(1, None, Stats((0.5,), (0.5,)), Stats((0.5,), (0.5,)))
    assert same(x) is x  # nothing to convert: the batch itself
