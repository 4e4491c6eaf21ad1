"""A training run as an object: `Run` builds the data, the model, the evaluations and the outputs, and offers what
the loop does with them: `step` (one optimizer step, logged), `evaluate` (the evaluations due), `save` (a
checkpoint) and `finish` (the final weights, the report and the result).

The loop that drives it is `vitlab.train.loop`; the counters that travel in checkpoints are `RunState`; the
evaluations are `evaluators.py`'s, what the run writes and `TrainResult` (what `train` returns) `outputs.py`'s.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from ..data import build_train_stream
from ..data.workers import skipped_summary
from ..inference.evaluate import EvalResult
from ..models.config import ViTConfig, to_hw
from ..models.resnet import ResNetConfig, ResNetV2
from ..models.vit import VisionTransformer
from ..perf.int8_train import check_int8_training, int8_training_caveat
from ..weights import create_model
from . import distributed as dist
from .build import build_model, data_config_with_init, trained_preprocess
from .distill import build_distillation
from .early_stop import summary as early_stop_summary
from .evalconfig import ClassificationEvaluator, EarlyStopEvaluator, check_evaluators
from .evaluators import ClassificationRunner, EarlyStopRunner, build_evaluations, build_evaluator_data
from .meter import Meter
from .mixup import BatchMix
from .optim import build_optimizer
from .outputs import Outputs, TrainResult
from .recipe import Recipe, size_at
from .report import read_metrics, speed_and_evaluators
from .rng import rng_state, seed_everything, set_rng_state
from .rundir import resume_point
from .schedule import lr_at
from .step import NonFiniteError, StepResult, resize_batch, train_step
from .tune import run_precision

logger = logging.getLogger("vitlab.train")


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


class Run:
    """One training run: its data, model, optimizer, evaluations, outputs and counters, and what is done with them.

    Building it builds its parts in the order they depend on each other, each once: the data, the model (from the
    latest checkpoint with `resume`), the precision (measured on that model for "auto"), the optimizer and EMA,
    the evaluations (`train.evaluators`, in that precision) and the outputs (main process). The loop calls `step`,
    `evaluate` and `save`; `evaluate(final=True)` ends a completed run and `finish` writes the final model and the
    report. `with Run(...) as run:` closes the outputs.
    """

    def __init__(self, recipe: Recipe, run_dir: Path, info: dist.DistInfo, *, resume: bool = False,
                 progress: bool = False, on_step: Callable[[int, StepResult], None] | None = None,
                 on_loss: Callable[[torch.Tensor], torch.Tensor] | None = None, stream: Any = None,
                 eval_data: Any = None) -> None:
        self.recipe, self.tr, self.run_dir, self.info = recipe, recipe.train, run_dir, info
        self.on_step, self.on_loss = on_step, on_loss
        self.specs = check_evaluators(self.tr.evaluators)  # in the order they run, a classification one included
        self.eval_name = next(n for n, s in self.specs.items() if isinstance(s, ClassificationEvaluator))
        self.early_stopping = next((s for s in self.specs.values() if isinstance(s, EarlyStopEvaluator)), None)
        if self.tr.int8:
            # before any data or model is built
            check_int8_training(info.device, fsdp=info.distributed and self.tr.parallel == "fsdp")
            if info.is_main:
                logger.info("train.int8: linear layers' forward and input-gradient GEMMs in int8 (SwitchBack), "
                            "weight gradients in the step's precision")
                if caveat := int8_training_caveat(self.tr.compile):
                    logger.warning(caveat)
        seed_everything(self.tr.seed)
        self.model_cfg = recipe.model.model_config(num_classes=0)  # a ViTConfig, or a ResNetConfig for a BiT ResNet
        self.data_cfg: Any = None
        self._build_data(stream, eval_data)
        saved = self._build_model(resume)
        self.precision = run_precision(self.model, self.model_cfg, recipe, info, self.num_classes)  # "auto": timed
        self._build_training(saved)
        self._build_evaluations(saved.get("best"))
        self.final_eval: EvalResult | None = None  # the classification evaluation of `evaluate(final=True)`
        self.out = Outputs(run_dir, recipe, main=info.is_main, classes=self.classes, total_steps=self.total_steps,
                           trained_pre=self.trained_pre)
        try:
            self.out.open(resume=resume, progress=progress, step=self.state.step,
                          again={e.name for e in self.evaluations if e.final})
        except BaseException:  # e.g. a full disk: close what did open (the error is the one to report)
            self.__exit__(*sys.exc_info())
            raise

    @property
    def vit_cfg(self) -> ViTConfig | ResNetConfig:
        """Deprecated: `model_cfg` (a ResNetConfig for a BiT ResNet)."""
        warnings.warn("Run.vit_cfg is deprecated: use Run.model_cfg (it may hold a ResNetConfig)", DeprecationWarning,
                      stacklevel=2)
        return self.model_cfg

    # building, in this order

    def _build_data(self, stream: Any, eval_data: Any) -> None:
        """The training stream (every rank) and, on the main process, what each evaluator reads (`eval_data`, when
        given, is the classification evaluator's). Each optimizer step pulls accum_steps micro-batches; the ranks'
        micro-batches make the global batch."""
        tr, info, cfg = self.tr, self.info, self.model_cfg
        micro = tr.batch_size // tr.accum_steps
        if stream is None:
            self.data_cfg = data_config_with_init(self.recipe)
            stream = build_train_stream(self.data_cfg, img_size=cfg.img_size, in_chans=cfg.in_chans,
                                        batch_size=micro // info.world_size, seed=tr.seed, rank=info.rank,
                                        world_size=info.world_size)
        self.stream = stream
        self.num_classes = stream.num_classes
        self.classes = list(getattr(stream, "classes", None) or [str(i) for i in range(self.num_classes)])
        self.eval_data: dict[str, Any] = {}  # by evaluator name (main process only)
        if info.is_main:
            given = {self.eval_name: eval_data} if eval_data is not None else {}
            if len(given) < len(self.specs):
                self.data_cfg = self.data_cfg or data_config_with_init(self.recipe)
            kw: dict[str, Any] = dict(img_size=cfg.img_size, in_chans=cfg.in_chans, batch_size=micro)
            self.eval_data = {n: given[n] if n in given else build_evaluator_data(s, self.data_cfg, **kw)
                              for n, s in self.specs.items()}
        self.total_steps = tr.steps or max(1, math.ceil(tr.epochs * stream.epoch_size / tr.batch_size))
        self.stream_resizes = hasattr(stream, "set_output_size")  # in-memory data crops straight to the size
        self.budget_s = tr.time_budget_min * 60 if tr.time_budget_min else None

    def _build_model(self, resume: bool) -> dict[str, Any]:
        """The model, every rank the same init (same seed; DDP also broadcasts rank 0's), and with `resume` the
        checkpoint's weights and counters; the rest of the checkpoint's training state is returned."""
        tr, info = self.tr, self.info
        model = build_model(self.recipe, num_classes=self.num_classes).to(info.device)
        self.trained_pre = trained_preprocess(self.recipe, self.data_cfg, self.model_cfg)  # saved with the weights
        for size, _ in tr.resize_schedule or []:
            if isinstance(model, VisionTransformer) and size % model.patch_embed.pixel_patch:  # a ResNet takes any
                raise ValueError(f"train.resize_schedule: size {size} is not a multiple of the model's "
                                 f"{model.patch_embed.pixel_patch} pixels per token")
        if tr.grad_checkpointing:
            model.set_grad_checkpointing(True)
        if self.early_stopping is not None and tr.parallel == "fsdp" and info.distributed:
            raise ValueError("train.evaluators: early_stop keeps the best weights in the main process: use "
                             "parallel: ddp")
        self.model = model
        self.state = RunState()
        self.resumed_from: str | None = None
        if not resume:
            return {}
        weights_path, weights, saved = resume_point(self.run_dir / "checkpoints", info.world_size, info.device)
        model.load_state_dict(weights, strict=True)
        self.resumed_from = str(weights_path)
        self.state = RunState.from_dict(saved["run"])
        return saved

    def _build_training(self, saved: dict[str, Any]) -> None:
        """The wrapped model (DDP / FSDP), optimizer and EMA, with a resumed run's state (`saved`) and data
        position and RNGs, DeiT distillation's teacher and loss (`distill`), then torch.compile, mixup and the speed
        meter."""
        tr, info, model = self.tr, self.info, self.model
        self.loss_fn = build_distillation(self.recipe.distill, model, self.trained_pre, self.num_classes,
                                          tr.label_smoothing, info.device)
        self.net = dist.wrap_model(model, info, tr.parallel)
        self.optimizer = build_optimizer(self.net if tr.parallel == "fsdp" else model, self.recipe.optim)
        self.ema = None
        if tr.ema_decay is not None:
            from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

            self.ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(tr.ema_decay), use_buffers=True)
        rank = info.rank if info.distributed else 0
        if saved:
            dist.load_optimizer_state_dict(self.optimizer, self.net, saved["optimizer"], info, tr.parallel)
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

    def _build_evaluations(self, best_weights: dict[str, torch.Tensor] | None) -> None:
        """`train.evaluators` (`evaluators.build_evaluations`), in the run's precision; the classification one (the
        run's result) and early stopping (from a resumed run's kept weights) are also kept by role."""
        self.evaluations = build_evaluations(
            self.specs, self.eval_data if self.info.is_main else None, num_classes=self.num_classes,
            class_names=self.classes, raw=self.model if self.ema is not None else None, state=self.state,
            best_weights=best_weights, images_per_step=self.tr.batch_size, epoch_images=int(self.stream.epoch_size),
            device=self.info.device, precision=self.precision)
        runners = [e.runner for e in self.evaluations]
        self.evaluation = next((r for r in runners if isinstance(r, ClassificationRunner)), None)  # main process
        self.selection = next((r for r in runners if isinstance(r, EarlyStopRunner)), None)  # early stopping (main)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: Any) -> None:
        """Close the outputs (`Outputs.close`)."""
        try:
            self.out.close()
        except Exception:
            if exc[0] is None:  # after an error, a close failing the same way (a full disk) must not hide it
                raise

    # what the loop calls

    def step(self) -> StepResult | None:
        """One optimizer step at the schedule's position, logged every `train.log_every` steps and at the last; None
        when the time budget is spent.

        Raises:
            NonFiniteError: `train.max_bad_steps` non-finite steps in a row, or an update that overflowed the weights.
        """
        t0 = time.perf_counter()
        tr, state = self.tr, self.state
        at = state.step
        if self.budget_s is not None:  # the schedule runs on whichever clock is further along
            at = max(at, int(state.train_time_s / self.budget_s * self.total_steps))
            if at >= self.total_steps:
                return None
        lr = lr_at(at, self.total_steps, self.recipe.optim.lr, self.recipe.schedule)
        size = size_at(tr.resize_schedule, at / self.total_steps, 0)  # progressive resizing
        hw = (size, size) if size else to_hw(self.model_cfg.img_size)
        if self.stream_resizes:
            self.stream.set_output_size(hw)
        batches = [next(self.it) for _ in range(tr.accum_steps)]
        if not self.stream_resizes:
            batches = [(resize_batch(x, hw), y) for x, y in batches]
        result = train_step(self.net, self.optimizer, batches, lr=lr, device=self.info.device,
                            precision=self.precision, clip_grad_norm=self.recipe.optim.clip_grad_norm,
                            label_smoothing=tr.label_smoothing, mix=self.mix, accum_steps=tr.accum_steps,
                            info=self.info, on_loss=self.on_loss, loss_fn=self.loss_fn, int8=tr.int8)
        if not result.weights_finite:  # in memory only: raised before anything can save or evaluate them
            raise NonFiniteError(
                f"step {state.step + 1}'s update overflowed float32 (loss {result.loss:.4g}, grad norm "
                f"{result.grad_norm:.4g}, lr {lr:.4g}): the weights would be inf or nan, so the run stops "
                f"without saving them. {self.out.last_checkpoint()} Lower optim.lr or optim.weight_decay.")
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
                f"at step {state.step}; none was applied. {self.out.last_checkpoint()} "
                f"Lower optim.lr, set optim.clip_grad_norm, or use train.precision=fp32.")
        self.out.tick()
        if state.step % tr.log_every == 0 or state.step == self.total_steps:
            speed = self.meter.interval(state.train_time_s, state.images_seen, state.step, self.total_steps, hw)
            self.out.log_train({"step": state.step, "split": "train", "loss": result.loss, "lr": result.lr,
                                "grad_norm": result.grad_norm, "images_per_s": speed.images_per_s, "mfu": speed.mfu,
                                "eta_s": speed.eta_s, "img_size": hw[0], "skipped_steps": state.skipped_steps,
                                "train_time_s": state.train_time_s})
        return result

    def evaluate(self, final: bool = False) -> bool:
        """Run the evaluations due at this step on the current weights (the EMA's if on) and log their rows, a
        barrier after each (every rank calls); whether early stopping says stop (the evaluations after its own are
        then not run). `final`: the end of a completed run: early stopping's best weights are put back first, then
        the evaluations that run at the end (the classification one's result is the run's, `final_eval`)."""
        state, info = self.state, self.info
        if final and self.selection is not None and self.selection.best_weights is not None:
            target = self.ema.module if self.ema is not None else self.model  # the run ends with its best val weights
            target.load_state_dict(self.selection.best_weights)
        due = [e for e in self.evaluations if e.due(state.step, self.total_steps, final)]
        if not due:
            return False
        m = self.eval_model()  # every rank: gathering FSDP shards is a collective
        for e in due:
            if e.runner is not None:  # the main process
                row = e.runner.run(m, state.step)
                self.out.log_eval(row, state.train_time_s)
                if e.runner is self.evaluation:
                    state.evals.append(row)
            if not e.stops:
                dist.barrier(info)
            elif not dist.all_true(self.selection is None or not self.selection.stop, info):  # every rank learns it
                return True
        if final and self.evaluation is not None:
            self.final_eval = self.evaluation.result
        return False

    def eval_model(self) -> VisionTransformer | ResNetV2:
        """A plain module with the current weights (the EMA's if on); FSDP gathers the full state (every rank)."""
        if self.ema is not None:
            return cast(VisionTransformer | ResNetV2, self.ema.module)
        if self.info.distributed and self.tr.parallel == "fsdp":
            sd = dist.full_state_dict(self.net, self.info)  # collective; with cpu_offload only rank 0 gets the tensors
            return self._plain(sd).to(self.info.device) if self.info.is_main else self.model
        return self.model

    def _plain(self, state_dict: dict[str, torch.Tensor]) -> VisionTransformer | ResNetV2:
        """An unwrapped model of the run's architecture holding `state_dict`."""
        plain = create_model(self.model.cfg)
        plain.load_state_dict(state_dict)
        return plain

    def save(self) -> None:
        """A checkpoint of the current step (every rank calls: data positions and RNGs are gathered)."""
        tr, info, state = self.tr, self.info, self.state
        data_states = dist.gather_objects(self.stream.state_dict(), info)
        rngs = dist.gather_objects(rng_state(), info)
        sd = dist.full_state_dict(self.net, info) if tr.parallel == "fsdp" and info.distributed else None
        opt_sd = dist.optimizer_state_dict(self.optimizer, self.net, info, tr.parallel)
        if not info.is_main:
            return
        train_state = {"optimizer": opt_sd, "run": state.__dict__, "data": data_states, "rng": rngs,
                       "ema": self.ema.state_dict() if self.ema is not None else None, "world_size": info.world_size,
                       "best": self.selection.best_weights if self.selection is not None else None}
        self.out.save_checkpoint(state.step, self.model if sd is None else self._plain(sd), train_state,
                                 tr.keep_checkpoints)

    def finish(self, status: str) -> TrainResult:
        """The result; for a completed run (after `evaluate(final=True)`) also the final weights (model.safetensors)
        and the report."""
        s, info = self.state, self.info
        out = TrainResult(status=status, step=s.step, total_steps=self.total_steps, skipped_steps=s.skipped_steps,
                          images_seen=s.images_seen, train_time_s=s.train_time_s, run_dir=str(self.run_dir),
                          resumed_from=self.resumed_from, world_size=info.world_size, precision=self.precision)
        if self.early_stopping is not None:
            out.best_step, out.best_val_top1 = s.best_step, s.best_val_top1
            if self.selection is not None:
                out.early_stop = early_stop_summary(self.selection.stopper, val_images=self.selection.val_images,
                                                    stopped_at=s.stopped_at, total_steps=self.total_steps)
        m = self.eval_model() if status.startswith("completed") else None  # every rank (FSDP gathers)
        if not info.is_main:
            return out
        out.images_per_s, out.mfu, out.evaluators = speed_and_evaluators(read_metrics(self.run_dir / "metrics.jsonl"))
        if m is not None and self.final_eval is not None:
            split = self.specs[self.eval_name].split
            metrics = {f"{split}_{k}": getattr(self.final_eval, k) for k in ("top1", "top5", "loss", "num_samples")}
            out.model = self.out.save_final(m, {"step": s.step, "metrics": metrics, "ema": self.ema is not None})
            out.eval, out.eval_split = self.final_eval, split
            out.bad_data = {name: skipped_summary(getattr(d, "report", None)) for name, d in
                            (("train", self.stream), ("eval", self.eval_data.get(self.eval_name))) if d is not None}
            out.report = self.out.write_report(out)
        return out
