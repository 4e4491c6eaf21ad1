"""A training run as an object: `Run` builds the data, the model and the outputs, and offers what the loop does
with them (step, log, evaluate, run the evaluators, save) and the end (finish: final weights and report).

The loop that drives it is `vitlab.train.loop`; the counters that travel in checkpoints are `RunState`; what
`train` returns is `TrainResult`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from ..data import build_eval_data, build_train_stream
from ..data.workers import skipped_summary
from ..inference.evaluate import EvalResult, Result
from ..models.config import to_hw
from ..models.resnet import ResNetV2
from ..models.vit import VisionTransformer
from ..perf.precision import resolve_precision
from ..utils.extras import needs
from ..utils.io import write_atomic, writing
from ..weights import create_model, save_weights
from . import checkpoint as ckpt
from .build import build_model, data_config_with_init, trained_preprocess
from .distill import build_distillation
from .distributed import (
    DistInfo,
    all_true,
    barrier,
    full_state_dict,
    gather_objects,
    load_optimizer_state_dict,
    optimizer_state_dict,
    wrap_model,
)
from .early_stop import EarlyStopper, Rule
from .early_stop import summary as early_stop_summary
from .evaluators import ClassificationRunner, Evaluation, build_evaluator, build_evaluator_data
from .meter import Meter
from .mixup import BatchMix
from .optim import build_optimizer
from .recipe import Recipe, size_at
from .report import open_metrics, read_metrics, speed_and_evaluators, write_report
from .rng import rng_state, seed_everything, set_rng_state
from .rundir import resume_point, write_recipe
from .schedule import lr_at
from .step import StepResult, all_finite, resize_batch, train_step
from .tune import train_precision

logger = logging.getLogger("vitlab.train")


class NonFiniteError(RuntimeError):
    """The run stopped on non-finite numbers: `train.max_bad_steps` non-finite steps in a row, an update that made
    the weights inf / nan, or weights / optimizer state about to be saved that are not finite. Nothing non-finite
    is written; the checkpoints already on disk (all finite) are kept."""


def _first_non_finite(tensors: Any, prefix: str = "") -> str | None:
    """The name of the first floating-point tensor holding an inf or nan in a (nested) state dict, else None."""
    if isinstance(tensors, torch.Tensor):
        if tensors.is_floating_point() and not all_finite([tensors]):
            return prefix or "tensor"
        return None
    items = tensors.items() if isinstance(tensors, dict) else enumerate(tensors) if isinstance(
        tensors, list | tuple) else ()
    for k, v in items:
        bad = _first_non_finite(v, f"{prefix}.{k}" if prefix else str(k))
        if bad is not None:
            return bad
    return None


@dataclass
class RunState:
    """Counters that travel in the checkpoint."""

    step: int = 0
    skipped_steps: int = 0
    bad_in_a_row: int = 0
    images_seen: int = 0
    train_time_s: float = 0.0
    evals: list[dict[str, Any]] = field(default_factory=list)
    best_val_top1: float | None = None  # early stopping: the val top-1 of the kept weights, their step
    best_step: int = 0
    early_stop: dict[str, Any] = field(default_factory=dict)  # `early_stop.EarlyStopper.state_dict()`
    stopped_at: int | None = None  # the step early stopping ended the run at

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunState:
        """From a checkpoint's counters (keys of older versions, e.g. `evals_since_best`, are dropped)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class TrainResult(Result):
    """What `train` returns (report.json holds it too, with `eval` summarised).

    Attributes:
        status: "completed", "completed (time budget N min)" or "interrupted (SIGTERM)" and the like.
        step: Optimizer steps done; total_steps: steps the run was set for.
        skipped_steps: Non-finite steps skipped (never applied).
        images_seen: Training images consumed (all processes).
        train_time_s: Seconds spent in training steps (evaluation and checkpoints not counted).
        run_dir: The run directory; resumed_from: the checkpoint this process resumed from, if any.
        world_size: Processes; precision: the autocast precision used ("auto" resolved).
        model: The final weights (a completed run, main process), else None.
        eval: The final evaluation on `eval_split` (a completed run, main process), else None.
        eval_split: The split `eval` is on.
        report: report.md (a completed run, main process), else None.
        images_per_s, mfu: Median training speed over the run's log rows (main process).
        evaluators: The last row of each `train.evaluators` entry, by name.
        bad_data: Bad files skipped (or replaced) by this process, by data ("train", "eval"): {"num_skipped",
            "skipped": the first `vitlab.data.workers.MAX_REPORTED` {"path", "reason"}} (main process).
        best_step, best_val_top1: With `train.early_stop_every`: the step whose weights the run ended with and
            their val top-1.
        early_stop: With `train.early_stop_every`: the rule, the val split's size and a top-1's standard error on
            it, the curve (every val evaluation), the chosen best and the stop point (`early_stop.summary`).
    """

    status: str
    step: int
    total_steps: int
    skipped_steps: int
    images_seen: int
    train_time_s: float
    run_dir: str
    resumed_from: str | None
    world_size: int
    precision: str
    model: str | None = None
    eval: EvalResult | None = None
    eval_split: str | None = None
    report: str | None = None
    images_per_s: float | None = None
    mfu: float | None = None
    evaluators: dict[str, dict[str, Any]] = field(default_factory=dict)
    bad_data: dict[str, dict[str, Any]] = field(default_factory=dict)
    best_step: int | None = None
    best_val_top1: float | None = None
    early_stop: dict[str, Any] | None = None


class Run:
    """One training run: its data, model, optimizer, evaluations, outputs and counters, and what can be done with them.

    Building it builds its parts in the order they depend on each other, each once: the data, the model (from the
    latest checkpoint with `resume`), the precision (measured on that model for "auto"), the optimizer and EMA,
    the evaluations (in that precision) and the outputs (main process). `step`, `log_train`, `run_evaluators` and
    `save` are what the loop calls; `close` closes the outputs and `finish` writes the final model and the report.
    """

    def __init__(self, recipe: Recipe, run_dir: Path, info: DistInfo, *, resume: bool = False, progress: bool = False,
                 on_step: Callable[[int, StepResult], None] | None = None,
                 on_loss: Callable[[torch.Tensor], torch.Tensor] | None = None, stream: Any = None,
                 eval_data: Any = None) -> None:
        self.recipe, self.tr, self.run_dir, self.info = recipe, recipe.train, run_dir, info
        self.on_step, self.on_loss = on_step, on_loss
        self.ckpt_dir = run_dir / "checkpoints"
        seed_everything(self.tr.seed)
        self.vit_cfg = recipe.model.vit_config(num_classes=0)
        self.data_cfg: Any = None
        self._build_data(stream, eval_data)
        saved = self._build_model(resume)
        self.precision = self._decide_precision()
        self._build_training(saved)
        self._build_evaluations()
        try:
            self._open_outputs(resume, progress)
        except BaseException:  # e.g. a full disk: close what did open (the error is the one to report)
            self.__exit__(*sys.exc_info())
            raise

    # building, in this order

    def _build_data(self, stream: Any, eval_data: Any) -> None:
        """The training stream (every rank) and, on the main process, the evaluation data: `eval_split`, early
        stopping's val split and what each of `train.evaluators` reads. Each optimizer step pulls accum_steps
        micro-batches; the ranks' micro-batches make the global batch."""
        tr, info, cfg = self.tr, self.info, self.vit_cfg
        micro = tr.batch_size // tr.accum_steps
        if stream is None:
            self.data_cfg = data_config_with_init(self.recipe)
            stream = build_train_stream(self.data_cfg, img_size=cfg.img_size, in_chans=cfg.in_chans,
                                        batch_size=micro // info.world_size, seed=tr.seed, rank=info.rank,
                                        world_size=info.world_size)
        self.stream = stream
        self.num_classes = stream.num_classes
        self.classes = list(getattr(stream, "classes", None) or [str(i) for i in range(self.num_classes)])
        self.eval_data = eval_data
        self.val_data: Any = None  # early stopping's split (main process only)
        self.evaluator_data: list[Any] = []  # per `train.evaluators` entry (main process only)
        if info.is_main:
            kw: dict[str, Any] = dict(img_size=cfg.img_size, in_chans=cfg.in_chans,
                                      batch_size=tr.eval_batch_size or micro)
            if eval_data is None or tr.evaluators or tr.early_stop_every:
                self.data_cfg = self.data_cfg or data_config_with_init(self.recipe)
            if eval_data is None:
                self.eval_data = build_eval_data(self.data_cfg, tr.eval_split, **kw)
            if tr.early_stop_every:
                self.val_data = build_eval_data(self.data_cfg, "val", **kw)
            self.evaluator_data = [build_evaluator_data(spec, self.data_cfg, **kw) for spec in tr.evaluators]
        self.total_steps = tr.steps or max(1, math.ceil(tr.epochs * stream.epoch_size / tr.batch_size))
        self.stream_resizes = hasattr(stream, "set_output_size")  # in-memory data crops straight to the size
        self.budget_s = tr.time_budget_min * 60 if tr.time_budget_min else None

    def _build_model(self, resume: bool) -> dict[str, Any]:
        """The model, every rank the same init (same seed; DDP also broadcasts rank 0's), and with `resume` the
        checkpoint's weights and counters; the rest of the checkpoint's training state is returned."""
        tr, info = self.tr, self.info
        model = build_model(self.recipe, num_classes=self.num_classes).to(info.device)
        self.trained_pre = trained_preprocess(self.recipe, self.data_cfg, self.vit_cfg)  # saved with the weights
        for size, _ in tr.resize_schedule or []:
            if isinstance(model, VisionTransformer) and size % model.patch_embed.pixel_patch:  # a ResNet takes any
                raise ValueError(f"train.resize_schedule: size {size} is not a multiple of the model's "
                                 f"{model.patch_embed.pixel_patch} pixels per token")
        if tr.grad_checkpointing:
            model.set_grad_checkpointing(True)
        if tr.early_stop_every and tr.parallel == "fsdp" and info.distributed:
            raise ValueError("train.early_stop_every keeps the best weights in the main process: use parallel: ddp")
        self.model = model
        self.state = RunState()
        self.best_weights: dict[str, torch.Tensor] | None = None  # early stopping's kept weights (main process)
        self.resumed_from: str | None = None
        if not resume:
            return {}
        weights_path, weights, saved = resume_point(self.ckpt_dir, info.world_size, info.device)
        model.load_state_dict(weights, strict=True)
        self.resumed_from = str(weights_path)
        self.state = RunState.from_dict(saved["run"])
        self.best_weights = saved.get("best")
        return saved

    def _decide_precision(self) -> str:
        """`train.precision`, "auto" resolved; on a CPU decided by timing this model's step in fp32 and bf16 here
        (`tune.py`; the main process measures, the others take its answer)."""
        tr, info = self.tr, self.info
        if tr.precision != "auto" or info.device.type != "cpu":
            return resolve_precision(tr.precision, info.device)
        choice: list[str | None] = [None]
        if info.is_main:
            micro = tr.batch_size // tr.accum_steps // info.world_size  # (B, C, H, W) of one micro-batch
            shape = (micro, self.vit_cfg.in_chans, *to_hw(self.vit_cfg.img_size))
            choice[0] = train_precision(self.model, lambda m: build_optimizer(m, self.recipe.optim), shape,
                                        self.num_classes, info.device, clip_grad_norm=self.recipe.optim.clip_grad_norm)
        if info.distributed:
            torch.distributed.broadcast_object_list(choice, src=0)
        return cast(str, choice[0])

    def _build_training(self, saved: dict[str, Any]) -> None:
        """The wrapped model (DDP / FSDP), optimizer and EMA, with a resumed run's state (`saved`) and data
        position and RNGs, DeiT distillation's teacher and loss (`distill`), then torch.compile, mixup and the speed
        meter."""
        tr, info, model = self.tr, self.info, self.model
        self.loss_fn = build_distillation(self.recipe.distill, model, self.trained_pre, self.num_classes,
                                          tr.label_smoothing, info.device)
        self.net = wrap_model(model, info, tr.parallel)
        self.optimizer = build_optimizer(self.net if tr.parallel == "fsdp" else model, self.recipe.optim)
        self.ema = None
        if tr.ema_decay is not None:
            from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

            self.ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(tr.ema_decay), use_buffers=True)
        rank = info.rank if info.distributed else 0
        if saved:
            load_optimizer_state_dict(self.optimizer, self.net, saved["optimizer"], info, tr.parallel)
            if self.ema is not None:
                self.ema.load_state_dict(saved["ema"])
            self.stream.load_state_dict(saved["data"][rank])
            set_rng_state(saved["rng"][rank])
        else:
            torch.manual_seed(tr.seed + 1000 * info.rank + 1)  # dropout / mixup differ per rank, fixed per seed
        if tr.compile:
            self.net = cast(nn.Module, torch.compile(self.net))
        self.mix = BatchMix(self.num_classes, tr.mixup, tr.cutmix)
        self.it = iter(self.stream)
        self.meter = Meter(model.cfg, info.device.type, self.precision, info.world_size)
        self.meter.start(self.state.train_time_s, self.state.images_seen, self.state.step)

    def _build_evaluations(self) -> None:
        """The run's evaluations, in the order they run at a step: on `eval_split` (every `eval_every` steps and at
        the end; the run's result), early stopping's on the val split (every `early_stop_every` steps and at the
        last) and `train.evaluators`. Their runners (main process only) evaluate in the run's precision."""
        tr, main = self.tr, self.info.is_main
        kw: dict[str, Any] = dict(device=self.info.device, precision=self.precision)
        split = f"eval_{tr.eval_split}"
        raw = self.model if self.ema is not None else None  # with EMA, the raw weights' top-1 too
        self.evaluation = Evaluation(split, tr.eval_every, True, ClassificationRunner(
            split, self.eval_data, self.num_classes, max_samples=tr.eval_max_samples, class_names=self.classes,
            raw=raw, **kw) if main else None)
        self.selection: Evaluation | None = None
        self.stopper: EarlyStopper | None = None
        if tr.early_stop_every:
            rule = Rule(tr.early_stop_metric, tr.early_stop_smoothing, tr.early_stop_smooth_evals,
                        tr.early_stop_patience_epochs)
            self.stopper = EarlyStopper(rule, tr.batch_size, int(self.stream.epoch_size))
            self.stopper.load_state_dict(self.state.early_stop)
            self.selection = Evaluation("eval_val", tr.early_stop_every, False, ClassificationRunner(
                "eval_val", self.val_data, self.num_classes, **kw) if main else None)
        self.evaluators = [self.evaluation, *([self.selection] if self.selection else [])]
        for i, spec in enumerate(tr.evaluators):
            runner = build_evaluator(spec, self.evaluator_data[i], **kw) if main else None
            self.evaluators.append(Evaluation(spec.name, spec.every, True, runner))

    def _open_outputs(self, resume: bool, progress: bool) -> None:
        """recipe.yaml, metrics.jsonl, TensorBoard and the progress bar (main process only)."""
        self.metrics_f: Any = None
        self.writer: Any = None
        self.pbar: Any = None
        if not self.info.is_main:
            return
        with needs("train", "training's TensorBoard log"):  # before anything is written or opened
            from torch.utils.tensorboard import SummaryWriter
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not resume:
            write_recipe(self.run_dir, self.recipe)
        # the rows and events an earlier process of the run wrote after the checkpoint this one goes on from (step
        # S; 0 for a run started again) are dropped: they are logged again. Step S's own were written before its
        # checkpoint and stay (but the final evaluation's, at the last step, is done again), so TensorBoard purges
        # from S + 1 (its purge_step drops events at and after it).
        step = self.state.step
        again = {e.name for e in self.evaluators if e.final} if step >= self.total_steps else set()
        self.metrics_f = open_metrics(self.run_dir / "metrics.jsonl", step, again_at_step=again)  # closed in close()
        with writing(self.run_dir / "tb"):  # it writes its first event file at once
            self.writer = SummaryWriter(str(self.run_dir / "tb"), purge_step=step + 1)
        if progress:
            from tqdm import tqdm

            self.pbar = tqdm(total=self.total_steps, initial=self.state.step, unit="step", dynamic_ncols=True,
                             desc="train")

    def close(self) -> None:
        """Close the progress bar, TensorBoard and metrics.jsonl (the `with` block does it). All are closed even
        when one fails (a full disk); then the first failure is raised."""
        outs = ((self.pbar, None), (self.writer, "tb"), (self.metrics_f, "metrics.jsonl"))
        self.pbar = self.writer = self.metrics_f = None
        failed: Exception | None = None
        for out, name in outs:
            try:
                if out is not None:
                    with writing(self.run_dir / (name or "")):
                        out.close()
            except Exception as e:
                failed = failed or e
        if failed is not None:
            raise failed

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.close()
        except Exception:
            if exc[0] is None:  # after an error, a close failing the same way (a full disk) must not hide it
                raise

    # what the loop calls

    def log(self, row: dict[str, Any]) -> None:
        """A metrics.jsonl row and its numbers in TensorBoard under `split/name`."""
        if self.metrics_f is not None:
            with writing(self.run_dir / "metrics.jsonl"):  # a full disk: "cannot write ...metrics.jsonl: ..."
                self.metrics_f.write(json.dumps(row) + "\n")
                self.metrics_f.flush()
        if self.writer is not None:
            with writing(self.run_dir / "tb"):
                for k, v in row.items():
                    if k not in ("step", "split") and isinstance(v, int | float):
                        self.writer.add_scalar(f"{row['split']}/{k}", v, row["step"])

    def step(self) -> StepResult | None:
        """One optimizer step at the schedule's position, or None when the time budget is spent.

        Raises:
            NonFiniteError: `train.max_bad_steps` non-finite steps in a row.
        """
        t0 = time.perf_counter()
        tr, state = self.tr, self.state
        at = state.step
        if self.budget_s is not None:  # the schedule runs on whichever clock is further along
            at = max(at, int(state.train_time_s / self.budget_s * self.total_steps))
            if at >= self.total_steps:
                return None
        self.lr = lr_at(at, self.total_steps, self.recipe.optim.lr, self.recipe.schedule)
        size = size_at(tr.resize_schedule, at / self.total_steps, 0)  # progressive resizing
        self.hw = (size, size) if size else to_hw(self.vit_cfg.img_size)
        if self.stream_resizes:
            self.stream.set_output_size(self.hw)
        batches = [next(self.it) for _ in range(tr.accum_steps)]
        if not self.stream_resizes:
            batches = [(resize_batch(x, self.hw), y) for x, y in batches]
        result = train_step(self.net, self.optimizer, batches, lr=self.lr, device=self.info.device,
                            precision=self.precision, clip_grad_norm=self.recipe.optim.clip_grad_norm,
                            label_smoothing=tr.label_smoothing, mix=self.mix, accum_steps=tr.accum_steps,
                            info=self.info, on_loss=self.on_loss, loss_fn=self.loss_fn)
        if not result.weights_finite:  # in memory only: raised before anything can save or evaluate them
            raise NonFiniteError(
                f"step {state.step + 1}'s update overflowed float32 (loss {result.loss:.4g}, grad norm "
                f"{result.grad_norm:.4g}, lr {self.lr:.4g}): the weights would be inf or nan, so the run stops "
                f"without saving them. {self.last_checkpoint()} Lower optim.lr or optim.weight_decay.")
        if result.applied:
            state.bad_in_a_row = 0
            if self.ema is not None:
                self.ema.update_parameters(self.model)
        else:
            state.skipped_steps += 1
            state.bad_in_a_row += 1
        state.step += 1
        state.images_seen += tr.batch_size
        state.train_time_s += time.perf_counter() - t0
        if self.on_step is not None:
            self.on_step(state.step, result)
        if state.bad_in_a_row >= tr.max_bad_steps:
            raise NonFiniteError(
                f"{state.bad_in_a_row} non-finite steps in a row (loss {result.loss}, grad norm {result.grad_norm}) "
                f"at step {state.step}; none was applied. {self.last_checkpoint()} "
                f"Lower optim.lr, set optim.clip_grad_norm, or use train.precision=fp32.")
        if self.pbar is not None:
            self.pbar.update(1)
        return result

    def last_checkpoint(self) -> str:
        """A sentence that says which checkpoint is on disk to resume from (every checkpoint written is finite)."""
        steps = ckpt.list_checkpoints(self.ckpt_dir) if self.ckpt_dir.is_dir() else []
        if not steps:
            return "No checkpoint had been written yet."
        return f"The last good checkpoint, step {steps[-1]}, is kept in {self.ckpt_dir}."

    def check_finite(self, what: str, **parts: Any) -> None:
        """NonFiniteError naming the first inf / nan tensor of `parts` (state dicts), before `what` is written."""
        for name, part in parts.items():
            bad = _first_non_finite(part)
            if bad is not None:
                raise NonFiniteError(f"refusing to write {what}: {name} {bad} holds inf or nan values. "
                                     f"{self.last_checkpoint()}")

    def log_train(self, result: StepResult) -> None:
        """The training row: loss, lr, grad norm, images/s, MFU, ETA, image size, skipped steps."""
        s = self.state
        speed = self.meter.interval(s.train_time_s, s.images_seen, s.step, self.total_steps, self.hw)
        self.log({"step": s.step, "split": "train", "loss": result.loss, "lr": self.lr, "grad_norm": result.grad_norm,
                  "images_per_s": speed.images_per_s, "mfu": speed.mfu, "eta_s": speed.eta_s, "img_size": self.hw[0],
                  "skipped_steps": s.skipped_steps, "train_time_s": s.train_time_s})
        if self.pbar is not None:
            self.pbar.set_postfix(loss=f"{result.loss:.4f}", lr=f"{self.lr:.2e}", img_s=f"{speed.images_per_s:.0f}",
                                  mfu=f"{speed.mfu:.1%}", refresh=False)
        eta = f"{speed.eta_s / 60:.1f} min" if math.isfinite(speed.eta_s) else "-"
        logger.info("step %d/%d: loss %.4f, lr %.2e, %.0f images/s, MFU %.1f%%, ETA %s", s.step, self.total_steps,
                    result.loss, self.lr, speed.images_per_s, 100 * speed.mfu, eta)

    def eval_model(self) -> VisionTransformer | ResNetV2:
        """A plain module with the current weights (the EMA's if on); FSDP gathers the full state (every rank)."""
        if self.ema is not None:
            return cast(VisionTransformer | ResNetV2, self.ema.module)
        if self.info.distributed and self.tr.parallel == "fsdp":
            sd = full_state_dict(self.net, self.info)  # collective; with cpu_offload only rank 0 gets the tensors
            if not self.info.is_main:
                return self.model
            plain = create_model(self.model.cfg)
            plain.load_state_dict(sd)
            return plain.to(self.info.device)
        return self.model

    def run_evaluators(self, final: bool = False) -> bool:
        """The evaluations due at this step (those that run at the end of the run when `final`), in order, each row
        logged; whether early stopping says stop, in which case the evaluations after its val one are not run.
        Every rank calls."""
        step = self.state.step
        return self._run([e for e in self.evaluators if e.due(step, self.total_steps, final)])

    def evaluate(self) -> EvalResult | None:
        """Evaluate on `train.eval_split` now (main process; every rank calls) and log it; with EMA, the raw weights'
        top-1 too. The result (main process), else None."""
        self._run([self.evaluation])
        return self.eval_result

    def select(self) -> bool:
        """Early stopping's evaluation on the val split now (`keep_best`); whether to stop. Every rank calls."""
        return self._run([self.selection] if self.selection is not None else [])

    @property
    def eval_result(self) -> EvalResult | None:
        """The latest evaluation on `train.eval_split` (main process), else None."""
        runner = self.evaluation.runner
        return runner.result if isinstance(runner, ClassificationRunner) else None

    def _run(self, evaluations: list[Evaluation]) -> bool:
        """Run `evaluations` on the current weights (main process) and log their rows; a barrier follows each (every
        rank calls). Whether early stopping says stop (the rest are then not run)."""
        if not evaluations:
            return False
        info, state = self.info, self.state
        m = self.eval_model()  # every rank: gathering FSDP shards is a collective
        for e in evaluations:
            stop = False
            if e.runner is not None:  # the main process
                row = e.runner.run(m, state.step)
                logger.info("step %d: %s %s", state.step, e.name, ", ".join(
                    f"{k} {v:.4f}" for k, v in row.items() if k not in ("step", "split")))
                row["train_time_s"] = state.train_time_s
                self.log(row)
                if e is self.evaluation:
                    state.evals.append(row)
                if e is self.selection:
                    stop = self.keep_best(row, m)
            if e is self.selection:  # every rank learns whether to stop
                if not all_true(not stop, info):
                    return True
            else:
                barrier(info)
        return False

    def keep_best(self, row: dict[str, Any], model: nn.Module) -> bool:
        """Early stopping (main process): judge the val evaluation `row` (`early_stop.EarlyStopper`: the val loss,
        or a smoothed top-1), keep `model`'s weights on a new best; whether to stop (`train.early_stop_patience_epochs`
        epochs of training without a new best)."""
        state, stopper = self.state, self.stopper
        assert stopper is not None
        d = stopper.update(state.step, loss=row["loss"], top1=row["top1"])
        if d.new_best:
            state.best_val_top1, state.best_step = row["top1"], state.step
            self.best_weights = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        state.early_stop = stopper.state_dict()
        if d.stop:
            state.stopped_at = state.step
        best = stopper.best_value if stopper.best_value is not None else float("nan")
        logger.info("step %d: %s %.4f; best %.4f at step %d", state.step, stopper.rule.describe(), d.value, best,
                    state.best_step)
        return d.stop

    def restore_best(self) -> None:
        """Early stopping: put the kept (best val) weights into the evaluated model (main process)."""
        if self.best_weights is not None and self.info.is_main:
            target = self.ema.module if self.ema is not None else self.model
            target.load_state_dict(self.best_weights)

    def save(self) -> None:
        """A checkpoint of the current step (every rank calls: data positions and RNGs are gathered)."""
        tr, info, state = self.tr, self.info, self.state
        data_states = gather_objects(self.stream.state_dict(), info)
        rngs = gather_objects(rng_state(), info)
        sd = full_state_dict(self.net, info) if tr.parallel == "fsdp" and info.distributed else None
        opt_sd = optimizer_state_dict(self.optimizer, self.net, info, tr.parallel)
        if not info.is_main:
            return
        plain = self.model
        if sd is not None:
            plain = create_model(self.model.cfg)
            plain.load_state_dict(sd)
        train_state = {"optimizer": opt_sd, "run": state.__dict__, "data": data_states, "rng": rngs,
                       "ema": self.ema.state_dict() if self.ema is not None else None, "world_size": info.world_size,
                       "best": self.best_weights}
        step = state.step
        self.check_finite(f"the checkpoint of step {step}", weights=plain.state_dict(), optimizer_state=opt_sd,
                          ema=train_state["ema"])
        ckpt.save_checkpoint(self.ckpt_dir, step, lambda p: self._save_weights(p, plain, {"step": step}),
                             train_state, tr.keep_checkpoints)

    def _save_weights(self, path: Path, model: VisionTransformer | ResNetV2, extra: dict[str, Any]) -> None:
        if self.trained_pre is not None:
            model.preprocess = self.trained_pre
        meta = {"recipe": self.recipe.to_dict(), "classes": self.classes, "total_steps": self.total_steps}
        save_weights(model, path, metadata={**meta, **extra})

    def finish(self, status: str, final_eval: EvalResult | None) -> TrainResult:
        """The result; for a completed run also the final weights (model.safetensors) and the report."""
        s, info = self.state, self.info
        out = TrainResult(status=status, step=s.step, total_steps=self.total_steps, skipped_steps=s.skipped_steps,
                          images_seen=s.images_seen, train_time_s=s.train_time_s, run_dir=str(self.run_dir),
                          resumed_from=self.resumed_from, world_size=info.world_size, precision=self.precision)
        if self.tr.early_stop_every:
            out.best_step, out.best_val_top1 = s.best_step, s.best_val_top1
            if self.stopper is not None:
                val_images = int(getattr(self.val_data, "num_samples", 0) or 0)
                out.early_stop = early_stop_summary(self.stopper, val_images=val_images, stopped_at=s.stopped_at,
                                                    total_steps=self.total_steps)
        m = self.eval_model() if status.startswith("completed") else None  # every rank (FSDP gathers)
        if not info.is_main:
            return out
        out.images_per_s, out.mfu, out.evaluators = speed_and_evaluators(read_metrics(self.run_dir / "metrics.jsonl"))
        if m is not None and final_eval is not None:
            final_path = self.run_dir / "model.safetensors"
            self.check_finite(str(final_path), weights=m.state_dict())
            metrics = {f"{self.tr.eval_split}_{k}": getattr(final_eval, k) for k in ("top1", "top5", "loss",
                                                                                     "num_samples")}
            write_atomic(final_path, lambda p: self._save_weights(
                p, m, {"step": s.step, "metrics": metrics, "ema": self.ema is not None}), overwrite=True)
            out.model, out.eval, out.eval_split = str(final_path), final_eval, self.tr.eval_split
            out.bad_data = {name: skipped_summary(getattr(d, "report", None)) for name, d in
                            (("train", self.stream), ("eval", self.eval_data)) if d is not None}
            report = {k: v for k, v in out.to_dict().items() if v is not None}
            out.report = str(write_report(self.run_dir, report, self.recipe))
        return out
