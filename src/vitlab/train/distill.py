"""DeiT hard distillation (Touvron et al., "Training data-efficient image transformers & distillation through
attention", ICML 2021, Sec. 4) as the loss the training loop calls.

The student has a distillation token and a second head (`ViTConfig.distilled`); with `model.distilled_training`
its forward returns (class logits, distillation logits) in training. A frozen teacher in eval mode labels each
(augmented) training batch with its argmax, and

    loss = 0.5 * CE(class logits, y) + 0.5 * CE(distillation logits, argmax teacher(x))

(label smoothing and mixup act on the first term only, as in DeiT's code). At inference the student averages the
two heads' logits. The teacher is any checkpoint `vitlab.load_model` builds (a ViT or a BiT ResNet) or a timm model;
`TeacherInputs` gives it the batch at its own size and normalisation (the recipe's `distill` section says which).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..models.preprocess import NAMED_STATS, Preprocess, Stats
from ..models.resnet import ResNetV2
from ..models.vit import VisionTransformer
from ..weights import load_model
from .recipe import DistillSection

log = logging.getLogger("vitlab.train")


def hard_distillation_loss(cls_logits: torch.Tensor, dist_logits: torch.Tensor, targets: torch.Tensor,
                           teacher_logits: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """DeiT's hard-label distillation: 0.5 CE(cls_logits, targets) + 0.5 CE(dist_logits, argmax teacher_logits).

    Args:
        cls_logits, dist_logits: (B, K) the student's two heads.
        targets: (B,) labels or (B, K) soft targets (mixup); label smoothing applies to this term only.
        teacher_logits: (B, K) the teacher's outputs on the same images.
    """
    true = F.cross_entropy(cls_logits.float(), targets, label_smoothing=label_smoothing)
    return 0.5 * true + 0.5 * F.cross_entropy(dist_logits.float(), teacher_logits.argmax(-1))


class TeacherInputs(nn.Module):
    """The student's batch as the teacher wants it: grey repeated to the teacher's channels, the student's
    normalisation undone and the teacher's applied (when they differ), resized to the teacher's size (when set)."""

    def __init__(self, in_chans: int, size: tuple[int, int] | None = None, student: Stats | None = None,
                 teacher: Stats | None = None):
        super().__init__()
        self.in_chans, self.size = in_chans, size
        self.stats = None if student is None or teacher is None or student == teacher else (student, teacher)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] != self.in_chans:
            if x.shape[1] != 1:
                raise ValueError(f"the teacher takes {self.in_chans} channels, the student's batch has {x.shape[1]}")
            x = x.expand(-1, self.in_chans, -1, -1)  # grey to RGB, as the data pipeline does
        if self.stats is not None:
            (sm, ss), (tm, ts) = ([torch.tensor(v, dtype=x.dtype, device=x.device).view(1, -1, 1, 1) for v in st]
                                  for st in self.stats)
            x = (x * ss + sm - tm) / ts  # pixels in [0, 1] again, then the teacher's statistics
        if self.size is not None and tuple(x.shape[-2:]) != self.size:
            x = F.interpolate(x, size=self.size, mode="bilinear", align_corners=False, antialias=True)
        return x


class HardDistillation:
    """The `loss_fn` of `vitlab.train.step.train_step` for a distilled student: (outputs, targets, images) -> loss.

    Args:
        teacher: The frozen teacher (put in eval mode, gradients off).
        inputs: What turns the student's batch into the teacher's.
        label_smoothing: On the true-label term.
    """

    def __init__(self, teacher: nn.Module, inputs: TeacherInputs, label_smoothing: float = 0.0):
        self.teacher = teacher.eval().requires_grad_(False)
        self.inputs, self.label_smoothing = inputs, label_smoothing

    def __call__(self, outputs: Any, targets: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        if not isinstance(outputs, tuple) or len(outputs) != 2:
            raise TypeError("DeiT distillation needs the student's (class logits, distillation logits): build it with "
                            "distilled=True and set model.distilled_training = True")
        with torch.no_grad():
            self.teacher.eval()  # frozen in eval mode whatever the caller did
            teacher_logits = self.teacher(self.inputs(images.float()))
        return hard_distillation_loss(outputs[0], outputs[1], targets, teacher_logits, self.label_smoothing)


def load_teacher(spec: DistillSection, num_classes: int) -> tuple[nn.Module, Stats | None, Any, int]:
    """The teacher of `spec` on the CPU in eval mode, with its own normalisation (None: unknown), input size (None:
    any) and input channels.

    Raises:
        ValueError: The teacher's classes are not the data's.
    """
    assert spec.teacher is not None
    if spec.teacher.startswith("timm:"):
        import timm  # the bench extra; imported only for a timm teacher

        arch = spec.teacher.removeprefix("timm:")
        kw = {"num_classes": num_classes, **spec.teacher_kwargs}
        model = timm.create_model(arch, pretrained=spec.teacher_checkpoint is None, **kw)
        if spec.teacher_checkpoint is not None:
            timm.models.load_checkpoint(model, spec.teacher_checkpoint, strict=True)
        classes: Any = model.num_classes
        stats, size, in_chans = None, None, int(kw.get("in_chans", 3))
    else:
        model = load_model(spec.teacher)
        assert isinstance(model, VisionTransformer | ResNetV2)
        classes, in_chans, size = model.cfg.num_classes, model.cfg.in_chans, model.cfg.img_size
        pre: Preprocess | None = model.preprocess
        stats = Stats(pre.mean, pre.std) if pre is not None else None
    if classes != num_classes:
        raise ValueError(f"distill.teacher {spec.teacher} has {classes} classes but the data has {num_classes}")
    return model.eval(), stats, size, in_chans


def build_distillation(spec: DistillSection, student: nn.Module, student_pre: Preprocess | None, num_classes: int,
                       label_smoothing: float, device: torch.device) -> HardDistillation | None:
    """The distillation loss of a recipe's `distill` section (None without a teacher); sets the student's
    `distilled_training` so that its forward returns both heads' logits while training.

    Raises:
        ValueError: A teacher for a student without a distillation token, or a normalisation that cannot be
            converted (the student's is unknown).
    """
    if spec.teacher is None:
        return None
    if not isinstance(student, VisionTransformer) or not student.cfg.distilled:
        raise ValueError("distill.teacher needs a student with a distillation token: set model.distilled: true")
    teacher, own_stats, own_size, in_chans = load_teacher(spec, num_classes)
    student_stats = Stats(student_pre.mean, student_pre.std) if student_pre is not None else None
    want = spec.teacher_normalize
    teacher_stats = (own_stats if want is None else None if want == "same" else NAMED_STATS[want])
    if teacher_stats is not None and student_stats is None:
        raise ValueError("distill.teacher_normalize: the student's normalisation is unknown (set data.normalize)")
    size = spec.teacher_img_size or own_size
    hw = None if size is None else (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    inputs = TeacherInputs(in_chans, hw, student_stats, teacher_stats)
    log.info("DeiT distillation from %s (%s): teacher input %s, %s", spec.teacher, type(teacher).__name__,
             hw or "the student's size", "normalisation converted" if inputs.stats else "the student's pixels")
    student.distilled_training = True
    return HardDistillation(teacher.to(device), inputs, label_smoothing)
