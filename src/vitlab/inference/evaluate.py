"""Evaluation of a classifier: top-1, top-5, mean loss, per-class accuracy and the confusion matrix, optionally
with test-time augmentation; `evaluate_checkpoint` does the same for a saved model on a named dataset.

    result = evaluate(model, batches, num_classes=10)                  # an EvalResult
    result = evaluate_checkpoint("run/model.safetensors", "fashion_mnist", tta="hflip")
    print(result.top1, result.to_dict()["per_class"])

Used by training (`vitlab.train`) and by the `vitlab eval` command; imports nothing from training.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..data import BadImageWarning, build_eval_data, parse_data_spec, preprocess_of
from ..data.preprocess import data_overrides, preprocess_arg
from ..data.workers import skipped_summary
from ..deploy.optimize import MODES, optimize
from ..models.preprocess import Preprocess
from ..perf.allocator import release_freed_memory
from ..perf.precision import PRECISIONS, autocast, inference_precision
from ..weights import load_model

TTA_MODES = ("none", "hflip")
BATCH_SIZE = {"cuda": 256, "cpu": 16}  # evaluate_checkpoint's default per device: on the CPU the activations of
# a large batch are the peak memory (ViT-S/16 fp32: ~1.8 GB resident at 256, ~0.9 GB at 16) for no more speed


class Result:
    """Base of vitlab's result dataclasses: `to_dict()` for JSON, and read access by name (`r["top1"]`,
    `r.get("tta")`, `"top1" in r`) for code written when results were plain dicts."""

    def _names(self) -> set[str]:
        return {f.name for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    def __getitem__(self, key: str) -> Any:
        if key not in self._names():
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return key in self._names()

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in self._names() else default

    def keys(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self)]  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (nested results become dicts); fields that are None and optional are kept."""
        return {k: v.to_dict() if isinstance(v, Result) else v for k, v in
                ((f.name, getattr(self, f.name)) for f in dataclasses.fields(self))}  # type: ignore[arg-type]


@dataclass
class EvalResult(Result):
    """What `evaluate` measures.

    Attributes:
        top1: Fraction of samples whose highest logit is the label.
        top5: Fraction whose label is among the five highest logits (all of them with fewer than five classes).
        loss: Mean cross-entropy (of the averaged probabilities under test-time augmentation).
        num_samples: Samples evaluated.
        per_class: Accuracy of each class present in the data, by class name.
        confusion: (classes x classes) counts; rows: true class, columns: predicted.
        classes: Class names, in label order.
    """

    top1: float
    top5: float
    loss: float
    num_samples: int
    per_class: dict[str, float] = field(default_factory=dict)
    confusion: list[list[int]] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)


@dataclass
class CheckpointEval(EvalResult):
    """`evaluate_checkpoint`'s result: the metrics plus what was evaluated and how.

    Attributes:
        checkpoint: The checkpoint evaluated.
        data: The dataset spec.
        split: The split.
        mode: The `vitlab.optimize` speed mode ("fp32": plain eager).
        tta: Test-time augmentation ("none" or "hflip").
        precision: The autocast precision used ("auto" resolved).
        eval_resize: How images were brought to the model's size.
        preprocess: The preprocessing applied (`vitlab.models.preprocess.Preprocess.to_dict()`).
        crop_fraction: The centre-crop fraction when eval_resize is "center_crop", else None.
        expected_samples: How many samples the data should hold (None: unknown, see `expected_from`);
            `num_samples` is how many were evaluated.
        expected_from: Where `expected_samples` comes from, or why it is unknown.
        num_skipped: Bad files (or damaged tar members) skipped, found by the scan or when decoded.
        skipped: The first `vitlab.data.workers.MAX_REPORTED` of them, {"path", "reason"} each.
    """

    checkpoint: str = ""
    data: str = ""
    split: str = "test"
    mode: str = "fp32"
    tta: str = "none"
    precision: str = "fp32"
    eval_resize: str = ""
    preprocess: dict[str, Any] = field(default_factory=dict)
    crop_fraction: float | None = None
    expected_samples: int | None = None
    expected_from: str = ""
    num_skipped: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        if d["crop_fraction"] is None:
            del d["crop_fraction"]
        return d


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: Iterable[tuple[torch.Tensor, torch.Tensor]],
    num_classes: int,
    *,
    device: torch.device | str = "cpu",
    precision: str = "auto",
    class_names: list[str] | None = None,
    max_samples: int | None = None,
    tta: str = "none",
) -> EvalResult:
    """Top-1, top-5, mean loss, per-class accuracy and the confusion matrix over all of `data` (batches of images
    (B, C, H, W) and labels (B,)) or its first `max_samples` samples. The model's train/eval mode is restored.

    Args:
        precision: "auto" (bf16 autocast if it measures faster for this model and batch shape on this machine,
            see `vitlab.perf.precision.inference_precision`), "bf16" or "fp32".
        tta: "none", or "hflip": test-time augmentation that averages the class probabilities of each image and
            its mirror image (twice the compute; meaningful for models trained with horizontal flips). The loss is
            then the cross-entropy of the averaged probabilities.
    """
    return _evaluate(model, data, num_classes, device=device, precision=precision, class_names=class_names,
                     max_samples=max_samples, tta=tta)[0]


@torch.no_grad()  # evaluate_checkpoint calls this directly: without it every batch kept its autograd graph
def _evaluate(model: nn.Module, data: Iterable[tuple[torch.Tensor, torch.Tensor]], num_classes: int, *,
              device: torch.device | str, precision: str, class_names: list[str] | None, max_samples: int | None,
              tta: str) -> tuple[EvalResult, str]:
    """`evaluate`, and the precision it used ("auto" decided on the first batch)."""
    if tta not in TTA_MODES:
        raise ValueError(f"unknown test-time augmentation {tta!r}; choose one of {', '.join(TTA_MODES)}")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    device = torch.device(device)
    was_training = model.training
    model.eval()
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64)
    top5 = 0
    loss_sum = 0.0
    n = 0
    k = min(5, num_classes)
    try:
        for x, y in data:
            if max_samples is not None:
                if n >= max_samples:
                    break
                x, y = x[: max_samples - n], y[: max_samples - n]
            x, y = x.to(device), y.to(device)
            if precision == "auto":  # timed on the first batch (cached per machine and shape)
                precision = inference_precision(model, x)
            with autocast(device, precision):
                logits = model(x).float()  # (B, classes)
                if tta == "hflip":  # log of the mean of the two views' probabilities
                    flipped = model(x.flip(-1)).float()
                    logits = torch.logsumexp(torch.stack([logits.log_softmax(1), flipped.log_softmax(1)]), 0)
                    logits = logits - math.log(2)
            loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
            pred = logits.argmax(1)
            top5 += (logits.topk(k, dim=1).indices == y[:, None]).any(1).sum().item()
            confusion += torch.bincount(y.cpu() * num_classes + pred.cpu(), minlength=num_classes**2).reshape(
                num_classes, num_classes)
            n += y.numel()
    finally:
        model.train(was_training)
    if n == 0:
        raise ValueError("evaluation data is empty")
    per_class_n = confusion.sum(1)
    per_class = (confusion.diag().double() / per_class_n.clamp(min=1)).tolist()
    names = list(class_names or [str(i) for i in range(num_classes)])
    result = EvalResult(
        top1=confusion.diag().sum().item() / n,
        top5=top5 / n,
        loss=loss_sum / n,
        num_samples=n,
        per_class={names[i]: per_class[i] for i in range(num_classes) if per_class_n[i] > 0},
        confusion=confusion.tolist(),
        classes=names,
    )
    return result, precision


def evaluate_checkpoint(
    checkpoint: str,
    data: str,
    *,
    split: str = "test",
    batch_size: int | None = None,
    precision: str = "auto",
    device: str | None = None,
    mode: str = "fp32",
    tta: str = "none",
    preprocess: Preprocess | Mapping[str, Any] | None = None,
    progress: bool = False,
    **deprecated: Any,
) -> CheckpointEval:
    """Evaluate a checkpoint on `split` of the dataset `data` (a `vitlab.data.parse_data_spec` string).

    Images are prepared as the checkpoint says (`vitlab.models.preprocess.resolve`: its stored preprocessing, else its
    format's convention, else a default with a warning) unless `preprocess` says otherwise.

    Args:
        checkpoint: A .safetensors written by vitlab, or anything `vitlab.load_model` reads.
        batch_size: Images per forward pass; None: `BATCH_SIZE` of the device (256 on a GPU, 16 on the CPU). Peak
            memory grows with it, never with the number of images: the data is read a batch at a time.
        precision: Autocast precision of the eager model ("auto", "bf16", "fp32"); ignored with a speed `mode`.
        device: "cpu" / "cuda"; None picks CUDA when available.
        mode: A `vitlab.optimize` speed mode instead of plain eager ("fp32"); the top-1 then measures that mode.
        tta: "none" or "hflip" (see `evaluate`).
        preprocess: A whole `Preprocess`, or some of its fields over the checkpoint's own (e.g. `{"resize":
            "center_crop", "crop_fraction": 0.875}`); None: the checkpoint's own. The dataset pipelines resize
            bilinearly whatever `interpolation` says.
        progress: Show a progress bar over the batches.
        deprecated: The keyword arguments `preprocess` replaces (`eval_resize`, `crop_fraction` (which implied
            "center_crop"), `normalize`, `interpolation`): still taken, with a DeprecationWarning.

    Raises:
        ValueError: Unknown mode / tta / precision, a bad preprocessing field or value, or a class count that
            differs.
        FileNotFoundError, OSError: The checkpoint or the data cannot be read.
        vitlab.data.DataError: A malformed data file (or, with data strict mode, any bad image or damaged shard).

    Warns:
        BadImageWarning: For each bad file or damaged tar member skipped, and once more when fewer samples were
            evaluated than expected (the result's `expected_samples`, `num_skipped` and `skipped` say which).
    """
    overrides = preprocess_arg(preprocess, deprecated, "evaluate_checkpoint", resize_name="eval_resize")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    if tta not in TTA_MODES:
        raise ValueError(f"unknown test-time augmentation {tta!r}; choose one of {', '.join(TTA_MODES)}")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    model = load_model(checkpoint)
    model.to(dev)
    cfg = model.cfg
    # evaluate the way the weights expect their inputs (normalisation, channel expansion, eval resize)
    pre = preprocess_of(model, overrides, what=str(checkpoint))
    data_cfg = parse_data_spec(data).replace(**data_overrides(pre))
    if batch_size is None:
        batch_size = BATCH_SIZE.get(dev.type, BATCH_SIZE["cuda"])
    ev = build_eval_data(data_cfg, split, img_size=cfg.img_size, in_chans=cfg.in_chans, batch_size=batch_size)
    if ev.num_classes != cfg.num_classes:
        raise ValueError(f"the checkpoint has {cfg.num_classes} classes but {data} has {ev.num_classes}")
    net: nn.Module = model
    if mode != "fp32":
        net, precision = optimize(model, mode), "fp32"  # the mode sets its own dtype; no autocast around it
    result, precision = _evaluate(net, _batches(ev, progress), cfg.num_classes, device=dev, precision=precision,
                                  class_names=list(ev.classes), max_samples=None, tta=tta)
    bad, expected = _skipped(ev, result, data, split)
    return CheckpointEval(
        **{f.name: getattr(result, f.name) for f in dataclasses.fields(EvalResult)},
        checkpoint=str(checkpoint), data=data, split=split, mode=mode, tta=tta, precision=precision,
        eval_resize=data_cfg.eval_resize, preprocess=pre.to_dict(),
        crop_fraction=data_cfg.eval_crop_fraction if data_cfg.eval_resize == "center_crop" else None,
        expected_samples=expected,
        expected_from=ev.report.get("expected_from", "the samples the data lists (after its scan for bad files)"),
        **bad,
    )


def _batches(ev: Iterable, progress: bool) -> Iterator:
    """The eval batches, behind a tqdm bar when `progress`; the heap's free pages go back to the kernel before each
    (`release_freed_memory`), so that the peak memory does not creep up with the number of batches."""
    if progress:
        from tqdm import tqdm

        ev = tqdm(ev, desc="eval", unit="batch", dynamic_ncols=True, leave=False)
    for batch in ev:
        release_freed_memory()
        yield batch


def _skipped(ev: Any, result: EvalResult, data: str, split: str) -> tuple[dict[str, Any], int | None]:
    """The data's skipped-files summary and expected sample count; warns when fewer samples were evaluated."""
    bad = skipped_summary(ev.report)
    expected = ev.report.get("expected_samples", ev.num_samples)
    if expected is not None and result.num_samples < expected:
        warnings.warn(f"evaluated {result.num_samples} of the {expected} samples expected in {data} / {split} "
                      f"({bad['num_skipped']} skipped; see the result's 'skipped')", BadImageWarning,
                      stacklevel=3)  # evaluate_checkpoint's caller, as before this helper
    return bad, expected
