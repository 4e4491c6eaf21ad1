"""The training loop, split as build_model / build_optimizer / train_step / evaluate / train.

`train(recipe, run_dir)` is the whole job; the CLI only parses and calls it. It never loses work: checkpoints
are atomic, SIGTERM and Ctrl-C finish the current step and save, a non-finite step is skipped (never applied)
and many in a row stop the run with the last good checkpoint kept, and `resume=True` continues exactly.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import random
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..allocator import keep_freed_memory
from ..config import ViTConfig
from ..data.stream import as_hw
from ..model import VisionTransformer
from . import checkpoint as ckpt
from .distributed import (
    DistInfo,
    all_reduce_mean,
    all_true,
    barrier,
    full_state_dict,
    setup_distributed,
    teardown_distributed,
    unwrap,
    wrap_model,
)
from .mixup import BatchMix
from .optim import build_optimizer
from .recipe import Recipe, data_config_from_dict, size_at
from .schedule import lr_at

# Keys of a run's recipe that may change between an interrupted run and its --resume.
RESUMABLE_CHANGES = {"train.eval_every", "train.checkpoint_every", "train.log_every", "train.keep_checkpoints",
                     "train.max_bad_steps", "train.eval_batch_size"}
RUN_MARKERS = ("recipe.yaml", "metrics.jsonl", "checkpoints")


class NonFiniteError(RuntimeError):
    """Too many non-finite steps in a row: the run stops, its last good checkpoint kept."""


class RunDirError(FileExistsError):
    """A run directory already holds a run and --resume was not given (or nothing to resume)."""


# -- building blocks --------------------------------------------------------------------------------------


def build_model(recipe: Recipe, num_classes: int, in_chans: int | None = None) -> VisionTransformer:
    """The recipe's model with the data's class count; from the `init` checkpoint when one is given.

    Fine-tuning (paper Sec. 3.2): the pre-trained head (and pre-logits) is replaced by a zero-initialised one
    when `init.drop_head`, and learned position embeddings are resampled on the 2-D grid to the new resolution.
    """
    over = dict(recipe.model.overrides)
    if "num_classes" in over and over["num_classes"] != num_classes:
        raise ValueError(f"model.num_classes={over['num_classes']} but the data has {num_classes} classes")
    over["num_classes"] = num_classes
    if in_chans is not None and over.get("in_chans", in_chans) != in_chans:
        raise ValueError(f"model.in_chans={over['in_chans']} but the data gives {in_chans} channels")
    cfg = ViTConfig.from_name(recipe.model.name, **over)
    model = VisionTransformer(cfg)
    if recipe.init.checkpoint:
        import warnings

        from ..weights import WeightsWarning, load_weights

        name = recipe.init.checkpoint  # a path, registry name, hf-hub:owner/repo, gs:// or https URL
        with warnings.catch_warnings(record=True) as caught:  # noted in the report instead (pre-logits dropped)
            warnings.simplefilter("always", WeightsWarning)
            try:
                report = load_weights(model, name, pos_embed_resize=recipe.init.pos_embed_resize)
            except FileNotFoundError as e:
                raise FileNotFoundError(f"init.checkpoint: {e}") from None
        report.messages.extend(str(w.message) for w in caught if issubclass(w.category, WeightsWarning))
        if recipe.init.drop_head and isinstance(model.head, nn.Linear):
            model.reset_classifier(num_classes)  # Sec. 3.2: a zero-initialised D x K head
            report.messages.append("init.drop_head: head replaced by a zero-initialised one")
        model.init_report = report  # type: ignore[attr-defined]
    return model


def init_preprocess(recipe: Recipe) -> Any:
    """The preprocessing `init.checkpoint` carries (`vitlab.preprocess.Preprocess`), or None (none, or unknown)."""
    if not recipe.init.checkpoint:
        return None
    from ..weights.checkpoint import read_preprocess

    try:
        return read_preprocess(recipe.init.checkpoint)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"init.checkpoint: {e}") from None


def data_config_with_init(recipe: Recipe) -> Any:
    """The recipe's DataConfig; when fine-tuning, the checkpoint's statistics and eval resize fill the fields the
    recipe's data section does not set (normalize, eval_resize, eval_crop_fraction): fine-tuning feeds the weights
    pixels prepared the way they were pre-trained on unless the recipe says otherwise."""
    from ..preprocess import data_config_fields

    data = dict(recipe.data)
    pre = init_preprocess(recipe)
    if pre is not None:
        try:
            fields = data_config_fields(pre)
        except ValueError as e:
            if "normalize" not in data:
                raise ValueError(f"init.checkpoint {recipe.init.checkpoint}: {e}; set data.normalize") from None
            fields = {"eval_resize": pre.resize, "eval_crop_fraction": pre.crop_fraction}
        data = {**fields, **data}
    return data_config_from_dict(data)


def _trained_preprocess(recipe: Recipe, data_cfg: Any, vit_cfg: ViTConfig) -> Any:
    """The eval preprocessing the run's data pipeline applies, stored with every model it saves."""
    from ..preprocess import from_data_config

    try:
        data_cfg = data_cfg or data_config_with_init(recipe)
        return from_data_config(data_cfg, vit_cfg.img_size, vit_cfg.in_chans)
    except (ValueError, TypeError, OSError):  # ready-made data with a recipe whose data section is a stub
        return None


def build_optimizer_for(model: nn.Module, recipe: Recipe) -> torch.optim.Optimizer:
    """`optim.build_optimizer` re-exported under the loop's naming (build_model / build_optimizer / ...)."""
    return build_optimizer(model, recipe.optim)


@functools.cache
def cpu_has_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU has AMX bf16 tiles (Linux: the amx_bf16 flag in /proc/cpuinfo; False elsewhere)."""
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            return any(line.startswith("flags") and "amx_bf16" in line.split() for line in f)
    except OSError:
        return False


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """"auto" -> "bf16" where bf16 is the fast path (a CUDA GPU with bf16, a CPU with AMX), else "fp32". Without
    AMX, bf16 autocast on a CPU runs slower than fp32 (measured 2x slower on AVX-512 alone, docs/speed.md)."""
    if precision != "auto":
        return precision
    device = torch.device(device)
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if device.type == "cpu" and cpu_has_amx() else "fp32"


def autocast(device: torch.device, precision: str):
    """bf16 autocast on CPU and GPU (weights stay fp32); a no-op context for fp32; "auto" as `resolve_precision`."""
    if resolve_precision(precision, device) == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@dataclass
class StepResult:
    """What one optimizer step did: mean loss of its micro-batches, global grad norm, whether it was applied."""

    loss: float
    grad_norm: float
    applied: bool


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    lr: float,
    device: torch.device,
    precision: str = "bf16",
    clip_grad_norm: float | None = None,
    label_smoothing: float = 0.0,
    mix: BatchMix | None = None,
    accum_steps: int = 1,
    info: DistInfo | None = None,
    on_loss: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> StepResult:
    """One optimizer step over `accum_steps` micro-batches: forward, backward, clip, and the update only if the
    loss and the global gradient norm are finite on every process (otherwise the gradients are dropped).

    Args:
        on_loss: A hook applied to each micro-batch loss (tests inject NaN through it).
    """
    info = info or DistInfo(device=device)
    for group in optimizer.param_groups:
        group["lr"] = lr
    model.train()
    total = 0.0
    batches = list(micro_batches)
    if len(batches) != accum_steps:
        raise ValueError(f"expected {accum_steps} micro-batches, got {len(batches)}")
    for i, (x, y) in enumerate(batches):
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        if mix is not None and mix.enabled:
            x, y = mix(x, y)  # y: (B, classes) soft targets
        sync = i == accum_steps - 1 or not isinstance(model, nn.parallel.DistributedDataParallel)
        with contextlib.nullcontext() if sync else model.no_sync(), autocast(device, precision):
            logits = model(x)  # (B, classes)
        loss = F.cross_entropy(logits.float(), y, label_smoothing=label_smoothing)
        if on_loss is not None:
            loss = on_loss(loss)
        (loss / accum_steps).backward()
        total += loss.item()
    loss_value = all_reduce_mean(total / accum_steps, info)
    params = [p for p in model.parameters() if p.grad is not None]
    # The global norm over all parameters (clipped when asked; inf threshold just measures it).
    norm = torch.nn.utils.clip_grad_norm_(params, clip_grad_norm if clip_grad_norm else float("inf"), foreach=True)
    grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    applied = all_true(math.isfinite(loss_value) and math.isfinite(grad_norm), info)
    if applied:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(loss_value, grad_norm, applied)


TTA_MODES = ("none", "hflip")


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: Iterable[tuple[torch.Tensor, torch.Tensor]],
    num_classes: int,
    *,
    device: torch.device | str = "cpu",
    precision: str = "bf16",
    class_names: list[str] | None = None,
    max_samples: int | None = None,
    tta: str = "none",
) -> dict[str, Any]:
    """Top-1, top-5, mean loss, per-class accuracy and the confusion matrix (rows: true class, cols: predicted),
    over all of `data` or its first `max_samples` samples.

    Args:
        tta: "none", or "hflip": test-time augmentation that averages the class probabilities of each image and
            its mirror image (twice the compute; meaningful for models trained with horizontal flips). The loss is
            then the cross-entropy of the averaged probabilities.
    """
    if tta not in TTA_MODES:
        raise ValueError(f"unknown test-time augmentation {tta!r}; choose one of {', '.join(TTA_MODES)}")
    device = torch.device(device)
    was_training = model.training
    model.eval()
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64)
    top5 = 0
    loss_sum = 0.0
    n = 0
    k = min(5, num_classes)
    for x, y in data:
        if max_samples is not None:
            if n >= max_samples:
                break
            x, y = x[: max_samples - n], y[: max_samples - n]
        x, y = x.to(device), y.to(device)
        with autocast(device, precision):
            logits = model(x).float()  # (B, classes)
            if tta == "hflip":  # log of the mean of the two views' probabilities
                flipped = model(x.flip(-1)).float()
                logits = torch.logsumexp(torch.stack([logits.log_softmax(1), flipped.log_softmax(1)]), 0) - math.log(2)
        loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
        pred = logits.argmax(1)
        top5 += (logits.topk(k, dim=1).indices == y[:, None]).any(1).sum().item()
        confusion += torch.bincount(y.cpu() * num_classes + pred.cpu(), minlength=num_classes**2).reshape(
            num_classes, num_classes)
        n += y.numel()
    model.train(was_training)
    if n == 0:
        raise ValueError("evaluation data is empty")
    per_class_n = confusion.sum(1)
    per_class = (confusion.diag().double() / per_class_n.clamp(min=1)).tolist()
    names = class_names or [str(i) for i in range(num_classes)]
    return {
        "top1": confusion.diag().sum().item() / n,
        "top5": top5 / n,
        "loss": loss_sum / n,
        "num_samples": n,
        "per_class": {names[i]: per_class[i] for i in range(num_classes) if per_class_n[i] > 0},
        "confusion": confusion.tolist(),
        "classes": names,
    }


# -- RNG state, for exact resume --------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """Every RNG the loop touches, as tensors and plain numbers (loads with weights_only=True)."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *map(float, np_state[2:])],
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(gauss)))
    random.setstate((state["python"][0], tuple(state["python"][1]), state["python"][2]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# -- signals ----------------------------------------------------------------------------------------------


class StopFlag:
    """SIGTERM / SIGINT set a flag; the loop finishes its step, saves and exits. A second Ctrl-C aborts."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._old: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if self.reason is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # second Ctrl-C: give up at once (the last checkpoint is intact)
        self.reason = signal.Signals(signum).name

    def __enter__(self) -> StopFlag:
        import threading

        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


# -- the whole job ----------------------------------------------------------------------------------------


@dataclass
class RunState:
    """Counters that travel in the checkpoint."""

    step: int = 0
    skipped_steps: int = 0
    bad_in_a_row: int = 0
    images_seen: int = 0
    train_time_s: float = 0.0
    evals: list[dict[str, Any]] = field(default_factory=list)


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and k != "overrides":
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_run_dir(run_dir: Path, resume: bool) -> None:
    """Refuse to write into a run directory that holds a run unless resuming; refuse to resume nothing."""
    held = [m for m in RUN_MARKERS if (run_dir / m).exists()]
    if held and not resume:
        raise RunDirError(f"run directory {run_dir} already holds a run ({', '.join(held)}); pass --resume to "
                          f"continue it or choose another -o RUN_DIR")
    if resume and not ckpt.list_checkpoints(run_dir / "checkpoints"):
        raise RunDirError(f"--resume: no checkpoint in {run_dir / 'checkpoints'} to resume from")


def _check_same_recipe(run_dir: Path, recipe: Recipe) -> None:
    from .recipe import Recipe as _R

    saved_path = run_dir / "recipe.yaml"
    if not saved_path.is_file():
        return
    import yaml

    saved = _flatten(_R.from_dict(yaml.safe_load(saved_path.read_text()), check_data=False).to_dict())
    now = _flatten(recipe.to_dict())
    diff = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k) and k not in RESUMABLE_CHANGES)
    if diff:
        details = "; ".join(f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in diff)
        raise ValueError(f"--resume: the recipe differs from the run's {saved_path} ({details}); resuming needs the "
                         f"same recipe (only {sorted(RESUMABLE_CHANGES)} may change)")


def _write_text_atomic(path: Path, text: str) -> None:
    ckpt.atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def train(
    recipe: Recipe,
    run_dir: str | os.PathLike,
    *,
    resume: bool = False,
    progress: bool = True,
    device: str | None = None,
    on_step: Callable[[int, StepResult], None] | None = None,
    on_loss: Callable[[torch.Tensor], torch.Tensor] | None = None,
    stream: Any = None,
    eval_data: Any = None,
) -> dict[str, Any]:
    """Run a recipe to its end (or to a SIGTERM / Ctrl-C, after which `resume=True` continues exactly).

    Args:
        recipe: The recipe.
        run_dir: Where checkpoints, metrics.jsonl, TensorBoard logs, the final model and the report go.
        resume: Continue the run in `run_dir` from its latest checkpoint.
        progress: Show a tqdm progress bar (main process only).
        device: "cpu" / "cuda"; None picks CUDA when available.
        on_step: Called after every optimizer step with (step, result).
        on_loss: Hook on each micro-batch loss (fault injection in tests).
        stream, eval_data: Ready-made data (tests); by default built from `recipe.data`.

    Returns:
        The summary written to report.json: status, steps, final metrics, paths.
    """

    run_dir = Path(run_dir)
    keep_freed_memory()  # no page-fault storm from re-mmapping activations every step (vitlab/allocator.py)
    info = setup_distributed(device)
    tr = recipe.train
    if info.is_main:
        check_run_dir(run_dir, resume)
        if resume:
            _check_same_recipe(run_dir, recipe)
    barrier(info)
    if tr.batch_size % (tr.accum_steps * info.world_size):
        raise ValueError(f"train.batch_size {tr.batch_size} must divide by accum_steps x processes = "
                         f"{tr.accum_steps} x {info.world_size}")
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    if tr.deterministic:
        torch.use_deterministic_algorithms(True)
    try:
        summary = _train(recipe, run_dir, info, resume=resume, progress=progress, on_step=on_step, on_loss=on_loss,
                         stream=stream, eval_data=eval_data)
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
    teardown_distributed(info)  # after a clean finish only: a failed peer would never reach the barrier
    return summary


def _train(recipe: Recipe, run_dir: Path, info: DistInfo, *, resume: bool, progress: bool,
           on_step: Callable[[int, StepResult], None] | None, on_loss: Callable[[torch.Tensor], torch.Tensor] | None,
           stream: Any, eval_data: Any) -> dict[str, Any]:
    from ..data import build_eval_data, build_train_stream

    tr = recipe.train
    seed_everything(tr.seed)
    precision = resolve_precision(tr.precision, info.device)  # "auto" decided once, recorded in the summary

    # Data: each optimizer step pulls accum_steps micro-batches; ranks' micro-batches make the global one.
    vit_cfg = recipe.model.vit_config(num_classes=0)
    micro = tr.batch_size // tr.accum_steps
    data_cfg = None
    if stream is None:
        data_cfg = data_config_with_init(recipe)
        stream = build_train_stream(data_cfg, img_size=vit_cfg.img_size, in_chans=vit_cfg.in_chans,
                                    batch_size=micro // info.world_size, seed=tr.seed, rank=info.rank,
                                    world_size=info.world_size)
    num_classes = stream.num_classes
    classes = list(getattr(stream, "classes", None) or [str(i) for i in range(num_classes)])
    if eval_data is None and info.is_main:
        data_cfg = data_cfg or data_config_with_init(recipe)
        eval_data = build_eval_data(data_cfg, tr.eval_split, img_size=vit_cfg.img_size, in_chans=vit_cfg.in_chans,
                                    batch_size=tr.eval_batch_size or micro)
    total_steps = tr.steps or max(1, math.ceil(tr.epochs * stream.epoch_size / tr.batch_size))

    # Model, optimizer, EMA. Every rank builds the same init (same seed); DDP also broadcasts rank 0's.
    model = build_model(recipe, num_classes=num_classes).to(info.device)
    trained_pre = _trained_preprocess(recipe, data_cfg, vit_cfg)  # what the saved model's header will say
    for size, _ in tr.resize_schedule or []:
        if size % model.patch_embed.pixel_patch:
            raise ValueError(f"train.resize_schedule: size {size} is not a multiple of the model's "
                             f"{model.patch_embed.pixel_patch} pixels per token")
    if tr.grad_checkpointing:
        model.set_grad_checkpointing(True)
    state = RunState()
    resumed_from = None
    ckpt_dir = run_dir / "checkpoints"
    if resume:
        found = ckpt.latest_checkpoint(ckpt_dir)
        if found is None:
            raise RunDirError(f"--resume: no loadable checkpoint in {ckpt_dir}")
        _, weights_path, saved = found
        if saved.get("world_size", 1) != info.world_size:
            raise ValueError(f"--resume: the checkpoint was written by {saved.get('world_size', 1)} processes, this "
                             f"run has {info.world_size}; resume with the same number (data positions are per process)")
        from safetensors.torch import load_file

        model.load_state_dict(load_file(str(weights_path), device=str(info.device)), strict=True)
        resumed_from = str(weights_path)
    net = wrap_model(model, info, tr.parallel)
    optimizer = build_optimizer(net if tr.parallel == "fsdp" else model, recipe.optim)
    ema = None
    if tr.ema_decay is not None:
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(tr.ema_decay), use_buffers=True)
    if resume:
        if info.distributed and tr.parallel == "fsdp":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            set_optimizer_state_dict(net, optimizer, saved["optimizer"],
                                     options=StateDictOptions(full_state_dict=True))
        else:
            optimizer.load_state_dict(saved["optimizer"])
        if ema is not None:
            ema.load_state_dict(saved["ema"])
        state = RunState(**saved["run"])
        stream.load_state_dict(saved["data"][info.rank] if info.distributed else saved["data"][0])
        set_rng_state(saved["rng"][info.rank] if info.distributed else saved["rng"][0])
    else:
        torch.manual_seed(tr.seed + 1000 * info.rank + 1)  # dropout / mixup differ per rank, fixed per seed
    if tr.compile:
        net = torch.compile(net)
    mix = BatchMix(num_classes, tr.mixup, tr.cutmix)

    # Outputs (main process only).
    writer = None
    metrics_f = None
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not resume:
            _write_text_atomic(run_dir / "recipe.yaml", recipe.to_yaml())
        metrics_f = open(run_dir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115 (closed in finally)
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(run_dir / "tb"), purge_step=state.step if resume else None)

    def log(row: dict[str, Any]) -> None:
        if metrics_f is not None:
            metrics_f.write(json.dumps(row) + "\n")
            metrics_f.flush()
        if writer is not None:
            for k, v in row.items():
                if k not in ("step", "split") and isinstance(v, int | float):
                    writer.add_scalar(f"{row['split']}/{k}", v, row["step"])

    meta_base = {"recipe": recipe.to_dict(), "classes": classes, "total_steps": total_steps}

    def save_weights_to(path: Path, weights_model: nn.Module | None, extra: dict[str, Any]) -> None:
        from ..weights import save_weights

        if trained_pre is not None:
            weights_model.preprocess = trained_pre
        save_weights(weights_model, path, metadata={**meta_base, **extra})

    def eval_model() -> nn.Module:
        # a plain module with the current weights (EMA's if on); FSDP gathers the full state
        if ema is not None:
            return ema.module
        if info.distributed and tr.parallel == "fsdp":
            sd = full_state_dict(net, info)  # collective; with cpu_offload only rank 0 receives the tensors
            if not info.is_main:
                return model
            plain = VisionTransformer(model.cfg)
            plain.load_state_dict(sd)
            return plain.to(info.device)
        return model

    def save(step: int) -> None:
        data_states = _gather(stream.state_dict(), info)
        rngs = _gather(rng_state(), info)
        sd = full_state_dict(net, info) if tr.parallel == "fsdp" and info.distributed else None
        opt_sd = _optimizer_state(optimizer, net, info, tr.parallel)
        if not info.is_main:
            return
        plain = model
        if sd is not None:
            plain = VisionTransformer(model.cfg)
            plain.load_state_dict(sd)
        train_state = {"optimizer": opt_sd, "run": state.__dict__, "data": data_states, "rng": rngs,
                       "ema": ema.state_dict() if ema is not None else None, "world_size": info.world_size}
        ckpt.save_checkpoint(ckpt_dir, step, lambda p: save_weights_to(p, plain, {"step": step}), train_state,
                             tr.keep_checkpoints)

    def run_eval(step: int) -> dict[str, Any]:
        result: dict[str, Any] = {}
        m = eval_model()  # every rank: gathering FSDP shards is a collective
        if info.is_main:
            result = evaluate(m, eval_data, num_classes, device=info.device, precision=precision,
                              class_names=classes, max_samples=tr.eval_max_samples)
            row = {"step": step, "split": f"eval_{tr.eval_split}", "top1": result["top1"], "top5": result["top5"],
                   "loss": result["loss"], "train_time_s": state.train_time_s}
            if ema is not None:
                raw = evaluate(model, eval_data, num_classes, device=info.device, precision=precision,
                               max_samples=tr.eval_max_samples)
                row["top1_raw"] = raw["top1"]
            log(row)
            state.evals.append(row)
        barrier(info)
        return result

    # Progressive resizing: the size each step's images come in at, from the schedule's progress.
    full_hw = as_hw(vit_cfg.img_size)
    stream_resizes = hasattr(stream, "set_output_size")  # in-memory data crops straight to the size

    def train_hw(progress_step: int) -> tuple[int, int]:
        size = size_at(tr.resize_schedule, progress_step / total_steps, 0)
        return (size, size) if size else full_hw

    status = "completed"
    final_eval: dict[str, Any] = {}
    it = iter(stream)
    pbar = None
    if info.is_main and progress:
        from tqdm import tqdm

        pbar = tqdm(total=total_steps, initial=state.step, unit="step", dynamic_ncols=True, desc="train")
    try:
        with StopFlag() as stop:
            t_last = time.perf_counter()
            imgs_since = 0
            budget_s = tr.time_budget_min * 60 if tr.time_budget_min else None
            while state.step < total_steps:
                t0 = time.perf_counter()
                progress_step = state.step
                if budget_s is not None:  # the schedule runs on whichever clock is further along
                    progress_step = max(progress_step, int(state.train_time_s / budget_s * total_steps))
                    if progress_step >= total_steps:
                        status = f"completed (time budget {tr.time_budget_min:g} min)"
                        break
                lr = lr_at(progress_step, total_steps, recipe.optim.lr, recipe.schedule)
                hw = train_hw(progress_step)
                if stream_resizes:
                    stream.set_output_size(hw)
                batches = [next(it) for _ in range(tr.accum_steps)]
                if not stream_resizes:
                    batches = [(resize_batch(x, hw), y) for x, y in batches]
                result = train_step(net, optimizer, batches, lr=lr, device=info.device, precision=precision,
                                    clip_grad_norm=recipe.optim.clip_grad_norm, label_smoothing=tr.label_smoothing,
                                    mix=mix, accum_steps=tr.accum_steps, info=info, on_loss=on_loss)
                if result.applied:
                    state.bad_in_a_row = 0
                    if ema is not None:
                        ema.update_parameters(model)
                else:
                    state.skipped_steps += 1
                    state.bad_in_a_row += 1
                state.step += 1
                state.images_seen += tr.batch_size
                state.train_time_s += time.perf_counter() - t0
                imgs_since += tr.batch_size
                if on_step is not None:
                    on_step(state.step, result)
                if state.bad_in_a_row >= tr.max_bad_steps:
                    raise NonFiniteError(
                        f"{state.bad_in_a_row} non-finite steps in a row (loss {result.loss}, grad norm "
                        f"{result.grad_norm}) at step {state.step}; none was applied. The last good checkpoint "
                        f"is kept in {ckpt_dir}. Lower optim.lr, raise optim.clip_grad_norm, or use "
                        f"train.precision=fp32.")
                if state.step % tr.log_every == 0 or state.step == total_steps:
                    now = time.perf_counter()
                    ips = imgs_since / max(now - t_last, 1e-9)
                    t_last, imgs_since = now, 0
                    log({"step": state.step, "split": "train", "loss": result.loss, "lr": lr,
                         "grad_norm": result.grad_norm, "images_per_s": ips, "img_size": hw[0],
                         "skipped_steps": state.skipped_steps, "train_time_s": state.train_time_s})
                    if pbar is not None:
                        pbar.set_postfix(loss=f"{result.loss:.4f}", lr=f"{lr:.2e}", img_s=f"{ips:.0f}", refresh=False)
                if pbar is not None:
                    pbar.update(1)
                done = state.step == total_steps
                if tr.eval_every and state.step % tr.eval_every == 0 and not done:
                    run_eval(state.step)
                stopping = all_true(stop.reason is None, info) is False
                if (tr.checkpoint_every and state.step % tr.checkpoint_every == 0 and not done) or stopping:
                    save(state.step)  # a skipped step changed no weight, so the state is still a good one
                if stopping:
                    status = f"interrupted ({stop.reason or 'signal on another process'})"
                    break
            if state.step == total_steps or status.startswith("completed"):
                final_eval = run_eval(state.step)
                save(state.step)
    finally:
        if pbar is not None:
            pbar.close()
        if writer is not None:
            writer.close()
        if metrics_f is not None:
            metrics_f.close()

    summary: dict[str, Any] = {"status": status, "step": state.step, "total_steps": total_steps,
                               "skipped_steps": state.skipped_steps, "images_seen": state.images_seen,
                               "train_time_s": state.train_time_s, "run_dir": str(run_dir),
                               "resumed_from": resumed_from, "world_size": info.world_size,
                               "precision": precision}
    m = eval_model() if status.startswith("completed") else None  # every rank (FSDP gathers)
    if info.is_main and m is not None:
        final_path = run_dir / "model.safetensors"
        metrics = {k: final_eval[k] for k in ("top1", "top5", "loss", "num_samples")}
        ckpt.atomic_write(final_path, lambda p: save_weights_to(
            p, m, {"step": state.step, "metrics": {f"{tr.eval_split}_{k}": v for k, v in metrics.items()},
                   "ema": ema is not None}))
        summary.update({"model": str(final_path), "eval": final_eval, "eval_split": tr.eval_split})
        from .report import write_report

        summary["report"] = str(write_report(run_dir, summary, recipe))
    return summary


def resize_batch(x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """Images (B, C, H, W) resized to hw (bilinear, antialiased when shrinking); unchanged if already hw."""
    if tuple(x.shape[-2:]) == tuple(hw):
        return x
    return F.interpolate(x, size=hw, mode="bilinear", align_corners=False, antialias=True)


def _gather(obj: Any, info: DistInfo) -> list[Any]:
    """Every process's `obj`, in rank order (the data position and RNGs differ per rank)."""
    if not info.distributed:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def _optimizer_state(optimizer: torch.optim.Optimizer, net: nn.Module, info: DistInfo, parallel: str) -> Any:
    if info.distributed and parallel == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(net, optimizer, options=StateDictOptions(full_state_dict=True,
                                                                                 cpu_offload=True))
    return optimizer.state_dict()


def unwrap_model(net: nn.Module) -> nn.Module:
    return unwrap(net)
