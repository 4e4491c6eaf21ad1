"""A training recipe: the YAML file with sections model, data, optim, schedule, train, init and distill.

Every section is a dataclass, so every key has a type, a default and a docstring; an unknown key is an
error that lists the valid ones. `--set section.key=value` overrides go through the same parsing.

Example:
    >>> r = Recipe.from_dict({"model": {"name": "ViT-Ti/16", "depth": 2}, "train": {"steps": 10}})
    >>> r.model.overrides, r.train.steps
    ({'depth': 2}, 10)
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

import yaml

from ..data import DataConfig
from ..models.config import RESIZE_MODES, ViTConfig, check_bool, check_keys, check_number
from ..models.resnet import ResNetConfig, config_from_name
from ..perf.precision import PRECISIONS
from ..weights import WeightsError, load_model, read_config
from .evalconfig import ClassificationEvaluator, EarlyStopEvaluator, check_evaluators, without_retired_keys

OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("cosine", "linear", "constant")
PARALLEL = ("ddp", "fsdp")


def _check_keys(section: str, d: Any, cls: type) -> dict[str, Any]:
    return {} if d is None else check_keys(d, cls, f"recipe section {section!r}")


def _number(section: str, key: str, value: Any, **bounds: Any) -> None:
    """`vitlab.models.config.check_number` for `section.key`: an int / finite float within `bounds` (lo, hi, ...)."""
    check_number(f"{section}.{key}", value, **bounds)


def _choice(section: str, key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{section}.{key} must be one of {list(choices)}, got {value!r}")


FROM_INIT = "init.checkpoint"  # model.name: the architecture of init.checkpoint (a DINOv2 / SigLIP backbone, ...)


@dataclass
class ModelSection:
    """`model:` a zoo name plus any config field as an override.

    Attributes:
        name: A variant name from `vitlab models` ("ViT-B/16", "S/16", ...) or a BiT ResNet ("BiT-R50x1", ...),
            or "init.checkpoint": the architecture `init.checkpoint` was made with, read from the checkpoint
            (`vitlab.load_model`), for backbones of the later families (DINOv2, SigLIP, CLIP, ...).
        overrides: Every other key of the section: ViTConfig fields (img_size, patch_size, pool, ...), or for a
            BiT ResNet `vitlab.models.resnet.ResNetConfig` fields (img_size, in_chans, width, layers, ...). With
            "init.checkpoint" they change the checkpoint's config (img_size, drop_path, ...).
        checkpoint: With "init.checkpoint": the recipe's `init.checkpoint` (set by `Recipe.from_dict`).
    """

    name: str = "ViT-B/16"
    overrides: dict[str, Any] = field(default_factory=dict)
    checkpoint: str | None = field(default=None, compare=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, checkpoint: str | None = None) -> ModelSection:
        d = dict(d or {})
        name = d.pop("name", cls.name)
        if name == FROM_INIT:
            if not checkpoint:
                raise ValueError(f"model.name: {FROM_INIT} builds init.checkpoint's architecture: set init.checkpoint")
            check_keys(d, ViTConfig, "recipe section 'model'", "field")  # values: checked when the model is built
            return cls(name=name, overrides=d, checkpoint=checkpoint)
        config_from_name(name).replace(**d)  # unknown names / fields list the known ones; values validated
        return cls(name=name, overrides=d)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.overrides}

    def model_config(self, **extra: Any) -> ViTConfig | ResNetConfig:
        """The model's config: a ViTConfig, or a ResNetConfig for a BiT ResNet; with "init.checkpoint", the
        checkpoint's config (read from the file: stored, its config.json, or its tensor shapes) changed by the
        overrides."""
        over = {**self.overrides, **extra}
        if self.name != FROM_INIT:
            return config_from_name(self.name, **over)
        assert self.checkpoint is not None
        try:
            cfg = read_config(self.checkpoint)
        except WeightsError:  # a field only a load_model argument settles (e.g. num_heads of a bare state dict)
            return load_model(self.checkpoint, **over).cfg
        return cfg.replace(**over)

    def vit_config(self, **extra: Any) -> ViTConfig | ResNetConfig:
        """Deprecated name of `model_config` (the config may be a ResNetConfig)."""
        warnings.warn("ModelSection.vit_config is deprecated: use model_config (it may return a ResNetConfig)",
                      DeprecationWarning, stacklevel=2)
        return self.model_config(**extra)


@dataclass
class OptimSection:
    """`optim:` the optimizer.

    Attributes:
        name: "adamw" (Adam with decoupled weight decay, paper pre-training) or "sgd" (momentum, fine-tuning).
        lr: Peak learning rate, reached at the end of the warm-up.
        betas: Adam's (beta1, beta2).
        eps: Adam's epsilon.
        momentum: SGD momentum.
        nesterov: SGD Nesterov momentum.
        weight_decay: PyTorch AdamW/SGD weight decay (multiplied by the current lr, as in flax's Adam and optax
            adamw). big_vision's "decoupled" wd is not multiplied by lr: divide it by lr to get this value.
            Applied only to tensors with 2+ dims that are not in model.no_weight_decay().
        clip_grad_norm: Global-norm gradient clipping threshold; null for none.
        layer_decay: Not a per-layer lr: kept out on purpose (the paper uses none).
    """

    name: str = "adamw"
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0
    clip_grad_norm: float | None = None

    def validate(self) -> None:
        _choice("optim", "name", self.name, OPTIMIZERS)
        _number("optim", "lr", self.lr, lo=0, lo_open=True)
        if not isinstance(self.betas, list | tuple) or len(self.betas) != 2:
            raise ValueError(f"optim.betas must be a pair [beta1, beta2], got {self.betas!r}")
        for i, b in enumerate(self.betas):
            _number("optim", f"betas[{i}]", b, lo=0, hi=1, hi_open=True)  # beta = 1: the average never moves
        self.betas = (float(self.betas[0]), float(self.betas[1]))
        _number("optim", "eps", self.eps, lo=0)
        _number("optim", "momentum", self.momentum, lo=0, hi=1)
        _number("optim", "weight_decay", self.weight_decay, lo=0)
        _number("optim", "clip_grad_norm", self.clip_grad_norm, lo=0, lo_open=True, allow_none=True)
        check_bool("optim.nesterov", self.nesterov)


@dataclass
class ScheduleSection:
    """`schedule:` learning rate over steps: linear warm-up from 0, then decay.

    Attributes:
        name: "cosine", "linear" (to end_lr) or "constant" after the warm-up.
        warmup_steps: Steps of linear warm-up (paper: 10k pre-training, 500 fine-tuning).
        end_lr: Learning rate at the last step.
    """

    name: str = "cosine"
    warmup_steps: int = 0
    end_lr: float = 0.0

    def validate(self) -> None:
        _choice("schedule", "name", self.name, SCHEDULES)
        _number("schedule", "warmup_steps", self.warmup_steps, lo=0, integer=True)
        _number("schedule", "end_lr", self.end_lr, lo=0)


@dataclass
class TrainSection:
    """`train:` the loop.

    Attributes:
        batch_size: Global batch per optimizer step (all processes and accumulation steps together).
        steps: Optimizer steps; give this or `epochs`.
        epochs: Passes over the training set (converted to steps with the stream's epoch size).
        precision: "auto" (the default): on a CPU, fp32 or bf16, whichever runs this model's training step
            faster on this machine (a few steps of each, measured once and cached, `vitlab.train.tune`; with
            VITLAB_AUTOTUNE=off, bf16 only with AMX tiles); on a GPU bf16 where supported; or "bf16" (autocast
            on CPU and GPU; weights and optimizer stay fp32) or "fp32" explicitly.
        seed: Seeds model init, data order, augmentation, dropout.
        accum_steps: Micro-batches per optimizer step (batch_size must divide by accum_steps * processes).
        checkpoint_every: Save a checkpoint every this many steps (0: only at the end and on interruption).
        keep_checkpoints: How many of the latest checkpoints to keep.
        log_every: Write a metrics.jsonl / TensorBoard row every this many steps.
        label_smoothing: Cross-entropy label smoothing.
        mixup: Mixup alpha (0: off); big_vision's plain ViT uses 0.2.
        cutmix: CutMix alpha (0: off); mixup and cutmix together alternate per batch.
        ema_decay: Exponential moving average of the weights (null: off); evaluated beside the raw weights.
        max_bad_steps: Stop after this many non-finite steps in a row (each is skipped, never applied).
        deterministic: torch.use_deterministic_algorithms(True) (bitwise resume on CPU needs fp32 and this).
        parallel: "ddp" or "fsdp" (large variants) when launched with torchrun.
        compile: torch.compile the model.
        grad_checkpointing: Recompute block activations in the backward pass (less memory).
        int8: Train the linear layers in int8 (SwitchBack, `vitlab.perf.int8_train`): their forward and
            input-gradient GEMMs in int8 with per-row scales, the weight gradient in the step's precision, weights
            and optimizer state fp32 as always. For CPUs with AVX-512 VNNI, under `compile: true` (eager, the
            quantising passes cost what the GEMMs save); a CPU only, not with grad_checkpointing, linear_probe
            or (under torchrun) parallel: fsdp.
        time_budget_min: Stop after this many minutes of training (evaluation and checkpoints not counted), with
            the schedule run on elapsed time: the lr follows max(step / total, time / budget), so the run anneals
            fully whatever the machine's speed. steps / epochs stay the upper bound. Not bitwise-resumable.
        resize_schedule: Progressive resizing, `[[size, until], ...]`: training images are fed at `size` x `size`
            pixels while the schedule's progress (the fraction the lr schedule uses) is below `until`, and at the
            model's img_size after the last entry. Evaluation is always at the model's img_size. The position
            embeddings are resampled on the grid for each smaller input (the paper's resolution change, Sec. 3.2,
            inside one run); low-resolution steps are several times cheaper. Sizes must be multiples of the
            pixels per token; `until` strictly increasing in (0, 1). null: off.
        evaluators: The run's evaluations, big_vision's `config.evals`: a mapping of name -> settings with a `type`
            (`vitlab.train.evalconfig`): `classification` (top-1 / top-5 / loss on a split, the run's result; `eval`
            on the test split at the end when none is declared), `early_stop` (early stopping on the held-out val
            split, the run ending with its best weights) and `fewshot` (the paper's few-shot linear probe, Sec.
            4.1), each with `every` (steps; 0: only at the end), e.g. `{eval: {type: classification, every: 500},
            fewshot: {type: fewshot, every: 500, shots: [5]}}`. Their numbers go to metrics.jsonl, TensorBoard and
            the report.
        linear_probe: Train only a linear classifier on the frozen features of `init.checkpoint`'s backbone
            (DINOv2's probe: class token concatenated with the mean patch token; a backbone without a class token:
            its pooled features), extracted once from the unaugmented train split (`vitlab.train.probe`);
            optim, schedule, batch_size and steps / epochs then apply to the classifier.
    """

    batch_size: int = 128
    steps: int | None = None
    epochs: float | None = None
    precision: str = "auto"
    seed: int = 0
    accum_steps: int = 1
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    log_every: int = 10
    label_smoothing: float = 0.0
    mixup: float = 0.0
    cutmix: float = 0.0
    ema_decay: float | None = None
    max_bad_steps: int = 5
    deterministic: bool = False
    parallel: str = "ddp"
    compile: bool = False
    grad_checkpointing: bool = False
    int8: bool = False
    time_budget_min: float | None = None
    resize_schedule: list[list[float]] | None = None
    evaluators: dict[str, Any] = field(default_factory=dict)
    linear_probe: bool = False

    def validate(self) -> None:
        _number("train", "batch_size", self.batch_size, lo=1, integer=True)
        if (self.steps is None) == (self.epochs is None):
            raise ValueError(f"train needs exactly one of steps or epochs, got steps={self.steps!r} "
                             f"epochs={self.epochs!r}")
        _number("train", "steps", self.steps, lo=1, integer=True, allow_none=True)
        _number("train", "epochs", self.epochs, lo=0, lo_open=True, allow_none=True)
        _choice("train", "precision", self.precision, PRECISIONS)
        _number("train", "seed", self.seed, lo=0, integer=True)
        _number("train", "accum_steps", self.accum_steps, lo=1, integer=True)
        if self.batch_size % self.accum_steps:
            raise ValueError(f"train.batch_size {self.batch_size} is not divisible by train.accum_steps "
                             f"{self.accum_steps}")
        _number("train", "checkpoint_every", self.checkpoint_every, lo=0, integer=True)
        _number("train", "keep_checkpoints", self.keep_checkpoints, lo=1, integer=True)
        _number("train", "log_every", self.log_every, lo=1, integer=True)
        _number("train", "label_smoothing", self.label_smoothing, lo=0, hi=1)
        _number("train", "mixup", self.mixup, lo=0)
        _number("train", "cutmix", self.cutmix, lo=0)
        _number("train", "ema_decay", self.ema_decay, lo=0, hi=1, allow_none=True)
        _number("train", "max_bad_steps", self.max_bad_steps, lo=1, integer=True)
        _choice("train", "parallel", self.parallel, PARALLEL)
        for k in ("deterministic", "compile", "grad_checkpointing", "int8", "linear_probe"):
            check_bool(f"train.{k}", getattr(self, k))
        if self.int8 and (self.grad_checkpointing or self.linear_probe):
            other = "grad_checkpointing" if self.grad_checkpointing else "linear_probe"
            why = ("the blocks recomputed in the backward pass would run without int8, so the gradients would "
                   "not be those of the forward pass" if other == "grad_checkpointing" else
                   "a linear probe trains its classifier on extracted features, with no model step to run in int8")
            raise ValueError(f"train.int8 and train.{other} cannot be combined: {why}; set one of them false")
        _number("train", "time_budget_min", self.time_budget_min, lo=0, lo_open=True, allow_none=True)
        if self.resize_schedule is not None:
            self.resize_schedule = check_resize_schedule(self.resize_schedule)
        self.evaluators = check_evaluators(self.evaluators)

    @property
    def evaluation(self) -> ClassificationEvaluator:
        """The classification evaluator of `evaluators`: the run's result (the defaults when none is declared)."""
        return next((e for e in self.evaluators.values() if isinstance(e, ClassificationEvaluator)),
                    ClassificationEvaluator())

    @property
    def early_stopping(self) -> EarlyStopEvaluator | None:
        """The early_stop evaluator of `evaluators`, if any."""
        return next((e for e in self.evaluators.values() if isinstance(e, EarlyStopEvaluator)), None)


def check_resize_schedule(schedule: Any) -> list[list[float]]:
    """`train.resize_schedule` as [[size (int), until (float)], ...], or a ValueError naming the bad entry."""
    if not isinstance(schedule, list | tuple) or not schedule:
        raise ValueError(f"train.resize_schedule must be a non-empty list of [size, until] pairs, got {schedule!r}")
    out: list[list[float]] = []
    last = 0.0
    for i, entry in enumerate(schedule):
        if not isinstance(entry, list | tuple) or len(entry) != 2:
            raise ValueError(f"train.resize_schedule[{i}] must be a [size, until] pair, got {entry!r}")
        size, until = entry
        check_number(f"train.resize_schedule[{i}]: size", size, integer=True, lo=1, what="a positive int (pixels)")
        check_number(f"train.resize_schedule[{i}]: until", until, lo=last, hi=1, lo_open=True, hi_open=True,
                     what=f"in ({last:g}, 1) (a fraction of the schedule, strictly increasing)")
        out.append([size, float(until)])
        last = float(until)
    return out


def size_at(schedule: list[list[float]] | None, progress: float, default: int) -> int:
    """The training image size at schedule progress `progress` in [0, 1]."""
    for size, until in schedule or []:
        if progress < until:
            return int(size)
    return default


@dataclass
class InitSection:
    """`init:` start from a checkpoint (fine-tuning).

    Attributes:
        checkpoint: What to start from; null: from scratch. A path (any format `vitlab convert` reads), a
            registry name (`vitlab weights list`), "hf-hub:owner/repo[@revision]" or a bare Hub id such as
            "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k", "gs://bucket/key", or an https URL (downloaded
            once into the cache, see `vitlab weights get`).
        drop_head: Replace the classifier by a zero-initialised one (paper Sec. 3.2) and drop the pre-logits.
        pos_embed_resize: How learned position embeddings are resampled to the new grid: jax | bilinear | bicubic.
    """

    checkpoint: str | None = None
    drop_head: bool = True
    pos_embed_resize: str = "bicubic"

    def validate(self) -> None:
        if self.checkpoint is not None and not isinstance(self.checkpoint, str):
            raise ValueError(f"init.checkpoint must be a path or checkpoint name, or null, got {self.checkpoint!r}")
        check_bool("init.drop_head", self.drop_head)
        _choice("init", "pos_embed_resize", self.pos_embed_resize, RESIZE_MODES)


TEACHER_NORMALIZE = ("same", "inception", "imagenet")


@dataclass
class DistillSection:
    """`distill:` DeiT hard distillation (Touvron et al., ICML 2021, Sec. 4): the student (`model.distilled: true`,
    a distillation token and a second head) learns its class head from the labels and its distillation head from
    the frozen teacher's argmax on the same (augmented) images; loss 0.5 CE(class head, y) + 0.5 CE(distillation
    head, argmax teacher(x)). At inference the two heads' logits are averaged. Off without a teacher.

    Attributes:
        teacher: A checkpoint `vitlab.load_model` builds (a path, a registry name, hf-hub:...; a ViT or a BiT
            ResNet), or "timm:ARCHITECTURE" for a timm model (with `teacher_checkpoint`). It must have the data's
            classes; it runs frozen, in eval mode, in fp32.
        teacher_checkpoint: For a timm teacher: its weights file (timm's `load_checkpoint`), or null for timm's
            pretrained weights of that name (downloaded by timm).
        teacher_kwargs: For a timm teacher: more `timm.create_model` arguments (e.g. in_chans: 1, img_size: 28).
        teacher_img_size: The size the teacher is fed (the student's batch resized); null: a vitlab teacher's own
            img_size, a timm teacher's the student's size.
        teacher_normalize: How the teacher's pixels are normalised: "same" (the student's batch as it is),
            "inception" or "imagenet" (the student's normalisation undone and this one applied); null: a vitlab
            teacher's own recorded preprocessing (else "same"), a timm teacher "same".
    """

    teacher: str | None = None
    teacher_checkpoint: str | None = None
    teacher_kwargs: dict[str, Any] = field(default_factory=dict)
    teacher_img_size: int | None = None
    teacher_normalize: str | None = None

    def validate(self) -> None:
        for key in ("teacher", "teacher_checkpoint"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"distill.{key} must be a checkpoint path or name, or null, got {value!r}")
        if not isinstance(self.teacher_kwargs, dict):
            raise ValueError(f"distill.teacher_kwargs must be a mapping, got {self.teacher_kwargs!r}")
        timm_teacher = self.teacher is not None and self.teacher.startswith("timm:")
        if (self.teacher_checkpoint is not None or self.teacher_kwargs) and not timm_teacher:
            raise ValueError("distill.teacher_checkpoint / teacher_kwargs are for a timm teacher (teacher: "
                             "timm:ARCHITECTURE); a vitlab teacher is one checkpoint: distill.teacher")
        _number("distill", "teacher_img_size", self.teacher_img_size, lo=1, integer=True, allow_none=True)
        if self.teacher_normalize is not None:
            _choice("distill", "teacher_normalize", self.teacher_normalize, TEACHER_NORMALIZE)


SECTIONS = ("model", "data", "optim", "schedule", "train", "init", "distill")


@dataclass
class Recipe:
    """A whole recipe. `data` stays a dict here and becomes a `vitlab.data.DataConfig` when training starts."""

    model: ModelSection = field(default_factory=ModelSection)
    data: dict[str, Any] = field(default_factory=dict)
    optim: OptimSection = field(default_factory=OptimSection)
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    train: TrainSection = field(default_factory=lambda: TrainSection(steps=1))
    init: InitSection = field(default_factory=InitSection)
    distill: DistillSection = field(default_factory=DistillSection)

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, check_data: bool = True) -> Recipe:
        if not isinstance(d, dict):
            raise ValueError(f"a recipe must be a mapping with sections {list(SECTIONS)}, got {type(d).__name__}")
        check_keys(d, SECTIONS, "recipe", "section")
        d = _without_retired_keys(d)
        sections: dict[str, Any] = {}
        for name, sec_cls in (("optim", OptimSection), ("schedule", ScheduleSection), ("train", TrainSection),
                              ("init", InitSection), ("distill", DistillSection)):
            sec = sec_cls(**_check_keys(name, d.get(name), sec_cls))
            sec.validate()
            sections[name] = sec
        data = d.get("data") or {}
        if not isinstance(data, dict):
            raise ValueError(f"recipe section 'data' must be a mapping, got {type(data).__name__}")
        if check_data:
            data_config_from_dict(data)  # unknown keys / bad values fail now, not after the model is built
        if sections["train"].early_stopping and not data.get("val_fraction"):
            raise ValueError("train.evaluators: early_stop evaluates on the held-out val split: set "
                             "data.val_fraction > 0 (e.g. 0.02)")
        if sections["train"].linear_probe and not sections["init"].checkpoint:
            raise ValueError("train.linear_probe trains a classifier on a frozen backbone's features: set "
                             "init.checkpoint")
        model = ModelSection.from_dict(d.get("model"), sections["init"].checkpoint)
        return cls(model=model, data=dict(data), **sections)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model.to_dict(), "data": dict(self.data)}
        for name in ("optim", "schedule", "train", "init", "distill"):
            if name == "distill" and self.distill == DistillSection():  # off: left out, as recipes before it
                continue
            sec = dataclasses.asdict(getattr(self, name))
            out[name] = {k: list(v) if isinstance(v, tuple) else v for k, v in sec.items()}
        return out

    def to_yaml(self) -> str:
        buf = io.StringIO()
        yaml.safe_dump(self.to_dict(), buf, sort_keys=False)
        return buf.getvalue()


def _without_retired_keys(d: dict[str, Any]) -> dict[str, Any]:
    """`d` without the retired train keys that are off (`evalconfig.RETIRED`: what every recipe.yaml written before
    them holds); a retired key that is set is refused with one line naming its replacement."""
    train = d.get("train")
    if not isinstance(train, dict):
        return d
    return {**d, "train": without_retired_keys(train)}


def data_config_from_dict(d: dict[str, Any]):
    """The data section as a `vitlab.data.DataConfig` (imported lazily: the data package is optional here)."""
    return DataConfig.from_dict(d)


def parse_override(item: str) -> tuple[list[str], Any]:
    """"train.steps=100" -> (["train", "steps"], 100): the value is parsed as YAML ("1e-3", "[0.9, 0.95]", "null")."""
    if "=" not in item:
        raise ValueError(f"--set expects section.key=value, got {item!r}")
    key, value = item.split("=", 1)
    parts = key.strip().split(".")
    if len(parts) < 2 or not all(parts):
        raise ValueError(f"--set expects section.key=value, got {item!r}")
    if parts[0] not in SECTIONS:
        raise ValueError(f"--set {item!r}: unknown section {parts[0]!r}; valid sections: {list(SECTIONS)}")
    try:
        parsed = yaml.safe_load(value) if value.strip() else None
    except yaml.YAMLError as e:  # "optim.lr=[1," or "a: b: c": name the override, not the parser's position
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"--set {item!r}: the value is not valid YAML ({problem})") from None
    try:
        return parts, _yaml_numbers(parsed, ".".join(parts))
    except RecursiveYAMLError as e:
        raise RecursiveYAMLError(f"--set {item!r}: {e}") from None


# A run's length is `train.steps` or `train.epochs`: `--set train.steps=20` on a recipe that counts epochs means
# "20 steps instead", so setting one (to a value) clears the other unless the same overrides set both.
_OTHER_LENGTH: dict[tuple[str, ...], str] = {("train", "steps"): "epochs", ("train", "epochs"): "steps"}


def apply_overrides(d: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `--set section.key=value` items to a raw recipe dict (a copy is returned)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in d.items()}
    parsed = [(item, *parse_override(item)) for item in overrides]
    given = {tuple(parts) for _, parts, _ in parsed}
    for item, parts, value in parsed:
        other = _OTHER_LENGTH.get(tuple(parts))
        train = out.get("train")
        if other and value is not None and ("train", other) not in given and isinstance(train, dict):
            train.pop(other, None)
        node = out.setdefault(parts[0], {})
        if node is None:
            node = out[parts[0]] = {}
        for p in parts[1:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {item!r}: {p!r} is not a mapping")
        node[parts[-1]] = value
    return out


_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


class RecursiveYAMLError(ValueError):
    """A YAML document that contains itself: an alias inside the node its anchor names (`a: &x [*x]`), which
    PyYAML builds as a self-referencing list or dict that no recipe can mean."""


def _yaml_numbers(d: Any, where: str = "", _open: dict[int, str] | None = None) -> Any:
    """YAML 1.1 (PyYAML) reads "3e-4" as a string; turn such strings back into floats.

    Raises:
        RecursiveYAMLError: a list or mapping contains itself (a recursive anchor); the message names the place.
    """
    if not isinstance(d, dict | list):
        return float(d) if isinstance(d, str) and _FLOAT.fullmatch(d.strip()) else d
    _open = {} if _open is None else _open  # id -> place of the containers on the path from the top
    if id(d) in _open:
        raise RecursiveYAMLError(f"recursive YAML anchor: {where} is an alias of {_open[id(d)] or 'the document'}, "
                                 f"which contains it (an anchor &name cannot be used as *name inside itself)")
    _open[id(d)] = where
    try:
        if isinstance(d, dict):
            return {k: _yaml_numbers(v, f"{where}.{k}" if where else str(k), _open) for k, v in d.items()}
        return [_yaml_numbers(v, f"{where}[{i}]", _open) for i, v in enumerate(d)]
    finally:
        del _open[id(d)]  # the same node reached again by another path (a reused anchor) is fine


def read_recipe_dict(path: str | os.PathLike) -> dict[str, Any]:
    """The raw mapping of a recipe YAML file, numbers fixed up."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"recipe file not found: {path}")
    with open(path, encoding="utf-8") as f:
        try:
            d = yaml.safe_load(f)
        except yaml.YAMLError as e:
            raise ValueError(f"recipe {path} is not valid YAML: {e}") from e
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise ValueError(f"recipe {path} must be a mapping with sections {list(SECTIONS)}")
    try:
        return _yaml_numbers(d)
    except RecursiveYAMLError as e:
        raise RecursiveYAMLError(f"recipe {path}: {e}") from None


def load_recipe(path: str | os.PathLike, overrides: list[str] | None = None, *, check_data: bool = True) -> Recipe:
    """Read a recipe YAML file, apply `--set` overrides, validate every section."""
    d = apply_overrides(read_recipe_dict(path), overrides or [])
    try:
        return Recipe.from_dict(d, check_data=check_data)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: {e}") from e
