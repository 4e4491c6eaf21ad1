"""Copy a state dict in our (timm's) names into a model: resample position embeddings, replace a head of
another class count, drop what the model has no place for, and refuse what cannot be made to fit."""

from __future__ import annotations

import warnings
from typing import cast

import torch
from torch import nn

from ..models.posembed import infer_grid, resample_pos_embed
from ..models.resnet import ResNetV2
from ..models.vit import VisionTransformer
from .report import LoadReport, ShapeMismatchError, WeightsError, WeightsWarning

_HEAD = ("head.weight", "head.bias")
# warnings.warn's stacklevel in the helpers below: apply_state_dict used 4; one frame deeper, the same user frame.
_STACKLEVEL = 5


def apply_state_dict(
    model: VisionTransformer | ResNetV2,
    state: dict[str, torch.Tensor],
    report: LoadReport,
    *,
    src_grid: tuple[int, int] | None = None,
    resize: str = "bicubic",
    strict: bool = True,
    assign: bool = False,
) -> LoadReport:
    """Load `state` (timm names) into `model` in place, recording every decision in `report`.

    Args:
        model: The destination.
        state: Tensors named as in `model.state_dict()`.
        report: Filled in and returned.
        src_grid: The checkpoint's patch grid (gh, gw); inferred as square when None.
        resize: Position-embedding resampling mode ("jax", "bilinear", "bicubic").
        strict: Raise on checkpoint tensors the model has no place for, and on missing ones (other than the
            head, which fine-tuning replaces anyway). With False they are only listed in the report.
        assign: Make the checkpoint's tensors the model's parameters instead of copying into them (no second
            copy in memory; for a freshly built model).

    Raises:
        ShapeMismatchError: a tensor's shape differs and neither resampling nor head replacement applies.
        WeightsError: with `strict`, missing or unexpected tensors.
    """
    target = model.state_dict()
    state = dict(state)
    pre_dropped = _drop_pre_logits(state, target, report)
    _fit_head(model, state, target, report, pre_dropped)
    updates: dict[str, torch.Tensor] = {}
    if "pos_embed" in state and "pos_embed" in target:
        vit = cast(VisionTransformer, model)  # only a ViT has position embeddings
        updates["pos_embed"] = _fit_pos_embed(vit, state["pos_embed"], target["pos_embed"], report,
                                              src_grid=src_grid, resize=resize)
    _match_rest(model, state, target, updates, report)
    if strict:
        _refuse_misfit(report)
    _copy_into(model, updates, target, assign=assign)
    report.loaded.extend(updates)
    return report


def _drop_pre_logits(state: dict[str, torch.Tensor], target: dict[str, torch.Tensor], report: LoadReport) -> bool:
    """Pre-logits (the paper's pre-training hidden layer): kept when the model has one, else dropped from `state`.
    Returns whether they were dropped."""
    pre = sorted(k for k in state if k.startswith("pre_logits."))
    pre_dropped = bool(pre) and "pre_logits.fc.weight" not in target
    if pre_dropped:
        rep = state["pre_logits.fc.weight"].shape[0] if "pre_logits.fc.weight" in state else "?"
        for k in pre:
            state.pop(k)
        report.dropped.extend(pre)
        msg = (f"dropped the checkpoint's pre-logits layer (Dense + tanh, width {rep}) because the model has "
               f"representation_size=None; build it with representation_size={rep} to keep it")
        report.messages.append(msg)
        warnings.warn(f"{report.source}: {msg}", WeightsWarning, stacklevel=_STACKLEVEL)
    return pre_dropped


def _fit_head(model: VisionTransformer | ResNetV2, state: dict[str, torch.Tensor], target: dict[str, torch.Tensor],
              report: LoadReport, pre_dropped: bool) -> None:
    """The classifier head: dropped (the model has none), replaced by a zero one (other class count, or it sat
    on dropped pre-logits), or kept (with a note when it is all zeros)."""
    if "head.weight" in state:
        if "head.weight" not in target:
            for k in _HEAD:
                if k in state:
                    state.pop(k)
                    report.dropped.append(k)
            report.messages.append("dropped the checkpoint's head: the model has num_classes=0")
        elif pre_dropped or state["head.weight"].shape != target["head.weight"].shape:
            _replace_head(model, state, target, report, pre_dropped)
        elif not state["head.weight"].any() and not state.get("head.bias", torch.zeros(1)).any():
            msg = ("the checkpoint's head is all zeros (as in the raw ImageNet-21k pre-training checkpoints): "
                   "its logits are constant; fine-tune a new head (num_classes=...) before using it to classify")
            report.messages.append(msg)
            if report.format == "npz":  # the released pre-training files; our own untrained saves are no news
                warnings.warn(f"{report.source}: {msg}", WeightsWarning, stacklevel=_STACKLEVEL)
    elif "head.weight" in target:
        _zero_head(model)
        report.replaced.extend(_HEAD)
        report.messages.append("the checkpoint has no head; the model's head is zero-initialised")


def _replace_head(model: VisionTransformer | ResNetV2, state: dict[str, torch.Tensor], target: dict[str, torch.Tensor],
                  report: LoadReport, pre_dropped: bool) -> None:
    # A head trained on the pre-logits' outputs is meaningless without them, even when shapes agree
    # (ImageNet-21k B/16: representation 768 = width 768).
    src_w, dst_w = state["head.weight"], target["head.weight"]
    if not pre_dropped and (src_w.dim() != 2 or src_w.shape[1] != dst_w.shape[1]):
        raise ShapeMismatchError(
            f"{report.source}: head.weight is {tuple(src_w.shape)} in the checkpoint but "
            f"{tuple(dst_w.shape)} in the model, and its input width differs too"
        )
    for k in _HEAD:
        state.pop(k, None)
    _zero_head(model)
    report.replaced.extend(_HEAD)
    why = (f"it sat on the dropped pre-logits layer (input width {src_w.shape[1]})" if pre_dropped else
           f"checkpoint has {src_w.shape[0]} classes, the model {dst_w.shape[0]}")
    report.messages.append(f"replaced the head: {why}; the new head is zero-initialised (paper Sec. 3.2)")


def _fit_pos_embed(model: VisionTransformer, given: torch.Tensor, dst: torch.Tensor, report: LoadReport, *,
                   src_grid: tuple[int, int] | None, resize: str) -> torch.Tensor:
    """Position embeddings on another grid: resampled on the 2-D grid, prefix (class token) rows kept."""
    src = given[None] if given.dim() == 2 else given
    if src.shape == dst.shape:
        return src
    if src.dim() != 3 or src.shape[-1] != dst.shape[-1]:
        raise ShapeMismatchError(
            f"{report.source}: pos_embed is {tuple(given.shape)} in the checkpoint but "
            f"{tuple(dst.shape)} in the model (different width)"
        )
    prefix = model.cfg.pos_prefix_rows  # none with no_embed_class (DINOv2 with registers, DeiT-III)
    n = src.shape[1] - prefix
    try:
        grid = (src_grid[0], src_grid[1]) if src_grid is not None else infer_grid(n)
    except ValueError:
        raise ShapeMismatchError(
            f"{report.source}: cannot resample pos_embed: its {n} patch rows are not a square grid and the "
            "file does not say its size; pass checkpoint_grid=(gh, gw) to load_weights"
        ) from None
    if grid[0] * grid[1] != n:
        raise ShapeMismatchError(
            f"{report.source}: pos_embed has {n} patch rows, which does not fit the checkpoint's grid {grid}"
        )
    report.resampled["pos_embed"] = (
        f"grid {grid[0]}x{grid[1]} -> {model.grid_size[0]}x{model.grid_size[1]} ({resize}), "
        f"{prefix} prefix row(s) kept"
    )
    return resample_pos_embed(src.float(), model.grid_size, grid, prefix, resize)


def _match_rest(model: VisionTransformer | ResNetV2, state: dict[str, torch.Tensor], target: dict[str, torch.Tensor],
                updates: dict[str, torch.Tensor], report: LoadReport) -> None:
    """Everything else must match exactly: add it to `updates`; record missing and unexpected names."""
    for name, dst in target.items():
        if name in updates or name in report.replaced:
            continue
        if name not in state:
            report.missing.append(name)
            continue
        src = state[name]
        if tuple(src.shape) != tuple(dst.shape):
            raise ShapeMismatchError(
                f"{report.source}: {name} is {tuple(src.shape)} in the checkpoint but {tuple(dst.shape)} in the "
                f"model ({model.cfg.name or 'config'}: {_hint(name)}); build the model with the checkpoint's "
                "architecture, e.g. vitlab.load_model(path)"
            )
        updates[name] = src
    report.unexpected.extend(sorted(k for k in state if k not in target))


def _refuse_misfit(report: LoadReport) -> None:
    """The strict check: raise when tensors are missing from the checkpoint or have no place in the model."""
    if not (report.missing or report.unexpected):
        return
    parts = []
    if report.missing:
        parts.append(f"missing from the checkpoint: {_few(report.missing)}")
    if report.unexpected:
        parts.append(f"in the checkpoint but not in the model: {_few(report.unexpected)}")
    raise WeightsError(
        f"{report.source} ({report.format}) does not fit the model: {'; '.join(parts)}. "
        "Build the model with the checkpoint's architecture (vitlab.load_model) or pass strict=False"
    )


def _copy_into(model: VisionTransformer | ResNetV2, updates: dict[str, torch.Tensor],
               target: dict[str, torch.Tensor], *, assign: bool) -> None:
    with torch.no_grad():
        if assign:
            model.load_state_dict({k: v.to(dtype=target[k].dtype) for k, v in updates.items()}, strict=False,
                                  assign=True)
        else:
            params: dict[str, torch.Tensor] = dict(model.named_parameters())
            params.update(dict(model.named_buffers()))
            for name, value in updates.items():
                params[name].copy_(value.to(dtype=params[name].dtype))


def _zero_head(model: VisionTransformer | ResNetV2) -> None:
    if isinstance(model.head, nn.Linear):
        with torch.no_grad():
            model.head.weight.zero_()
            model.head.bias.zero_()


def _hint(name: str) -> str:
    if name.startswith("patch_embed"):
        return "patch size or input channels differ"
    if name in ("cls_token", "norm.weight", "norm.bias"):
        return "width differs"
    if ".mlp." in name:
        return "width or MLP size differ"
    if ".attn." in name or ".norm" in name:
        return "width differs"
    return "architecture differs"


def _few(names: list[str], k: int = 8) -> str:
    return ", ".join(names[:k]) + (f" and {len(names) - k} more" if len(names) > k else "")
