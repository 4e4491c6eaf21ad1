"""Linear probing (`train.linear_probe: true`): a linear classifier on the frozen features of a pre-trained backbone,
DINOv2's evaluation of its features (Oquab et al. 2023, Sec. 7) and the usual first look at a DINOv2 / SigLIP / CLIP
backbone on a new dataset.

The backbone (`init.checkpoint`, built by `build_model`) runs once over the unaugmented train split and the
evaluation split (`vitlab.analysis.fewshot.extract_features`, features="probe": class token concatenated with the
mean patch token; a backbone without a class token gives its pooled features). Then a zero-initialised linear layer
is trained on the cached features with the recipe's optimizer, schedule, batch size and length through the loop's
own `train_step`, and scored with `vitlab.inference.evaluate`. The paper's closed-form ridge probe
(`vitlab.analysis.fewshot.fit_ridge`) fitted on all the train features is reported beside it (`ridge_top1`), a number
with no learning rate to tune. The run directory gets metrics.jsonl, probe_head.safetensors (the classifier, its
metadata naming the backbone and the features) and the report.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from ..analysis.fewshot import extract_features, fit_ridge
from ..data import build_eval_data
from ..inference.evaluate import evaluate
from ..perf.precision import autocast, resolve_precision
from ..utils.io import write_atomic
from .build import build_model, data_config_with_init
from .distributed import DistInfo
from .evaluators import first_samples
from .optim import build_optimizer
from .outputs import TrainResult
from .recipe import Recipe
from .report import write_report
from .rundir import write_recipe
from .schedule import lr_at
from .step import train_step


def _batches(x: torch.Tensor, y: torch.Tensor, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, len(y), batch_size)]


def linear_probe(recipe: Recipe, run_dir: Path, info: DistInfo) -> TrainResult:
    """Extract the backbone's features once, train the linear classifier on them, evaluate; a `TrainResult`."""
    tr, ev = recipe.train, recipe.train.evaluation  # ev: the split scored, its images and batch size
    if info.distributed:
        raise ValueError("train.linear_probe runs in one process (its features fit one): launch it without torchrun")
    data_cfg = data_config_with_init(recipe)
    cfg = recipe.model.model_config(num_classes=0)
    kw: dict[str, Any] = dict(img_size=cfg.img_size, in_chans=cfg.in_chans, batch_size=ev.batch_size or 256)
    train_data = build_eval_data(data_cfg, "train", **kw)
    test_data = build_eval_data(data_cfg, ev.split, **kw)
    k = train_data.num_classes
    backbone = build_model(recipe, num_classes=k).to(info.device)
    precision = resolve_precision(tr.precision, info.device)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_recipe(run_dir, recipe)
    t0 = time.perf_counter()
    with autocast(info.device, precision):
        xs, ys = extract_features(backbone, train_data, info.device, features="probe")
        test_batches = test_data if ev.max_samples is None else first_samples(test_data, ev.max_samples)
        xt, yt = extract_features(backbone, test_batches, info.device, features="probe")
    feature_s = time.perf_counter() - t0
    x, y = torch.from_numpy(xs), torch.from_numpy(ys)
    torch.manual_seed(tr.seed)
    head = nn.Linear(x.shape[1], k).to(info.device)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    opt = build_optimizer(head, recipe.optim)
    total = tr.steps or max(1, math.ceil((tr.epochs or 1) * len(y) / tr.batch_size))
    g = torch.Generator().manual_seed(tr.seed)
    order = torch.randperm(len(y), generator=g)
    rows: list[dict[str, Any]] = []
    t1 = time.perf_counter()
    for step in range(1, total + 1):
        pos = (step - 1) * tr.batch_size % len(y)
        if pos + tr.batch_size > len(y):  # an epoch's end: a fresh order (the short remainder is dropped)
            order, pos = torch.randperm(len(y), generator=g), 0
        idx = order[pos : pos + tr.batch_size]
        lr = lr_at(step - 1, total, recipe.optim.lr, recipe.schedule)
        r = train_step(head, opt, [(x[idx], y[idx])], lr=lr, device=info.device, precision="fp32",
                       clip_grad_norm=recipe.optim.clip_grad_norm, label_smoothing=tr.label_smoothing)
        if step % tr.log_every == 0 or step == total:
            rows.append({"step": step, "split": "train", "loss": r.loss, "lr": lr, "grad_norm": r.grad_norm,
                         "train_time_s": time.perf_counter() - t1})
    classes = list(getattr(train_data, "classes", None) or [str(i) for i in range(k)])
    result = evaluate(head, _batches(torch.from_numpy(xt), torch.from_numpy(yt), 1024), k, device=info.device,
                      precision="fp32", class_names=classes)
    ridge = fit_ridge(xs, ys, k)
    ridge_top1 = float((ridge.predict(xt) == yt).mean())
    rows.append({"step": total, "split": ev.row_split, "top1": result.top1, "top5": result.top5,
                 "loss": result.loss, "ridge_top1": ridge_top1})
    write_atomic(run_dir / "metrics.jsonl", "".join(json.dumps(row) + "\n" for row in rows), overwrite=True)
    head_path = run_dir / "probe_head.safetensors"
    meta = {"backbone": str(recipe.init.checkpoint), "features": "probe", "feature_dim": str(x.shape[1]),
            "classes": json.dumps(classes), "recipe": json.dumps(recipe.to_dict())}
    write_atomic(head_path, lambda p: save_file({n: t.detach().cpu().contiguous() for n, t in
                                                 head.state_dict().items()}, str(p), metadata=meta), overwrite=True)
    out = TrainResult(status="completed", step=total, total_steps=total, skipped_steps=0,
                      images_seen=total * tr.batch_size, train_time_s=time.perf_counter() - t1 + feature_s,
                      run_dir=str(run_dir), resumed_from=None, world_size=1, precision=precision,
                      model=str(head_path), eval=result, eval_split=ev.split,
                      evaluators={"probe": {"step": total, "ridge_top1": ridge_top1, "feature_dim": int(x.shape[1]),
                                            "train_features": len(ys), "feature_s": feature_s}})
    report = {k: v for k, v in out.to_dict().items() if v is not None}
    out.report = str(write_report(run_dir, report, recipe))
    return out


__all__ = ["linear_probe"]
