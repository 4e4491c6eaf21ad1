"""The three calls most users need: `load_weights`, `save_weights`, `load_model` (and `read_metadata`)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal, overload

import torch
from torch import nn

from ..models.config import RESIZE_MODES, ViTConfig
from ..models.hybrid import set_eps
from ..models.preprocess import resolve as resolve_preprocess
from ..models.resnet import ResNetConfig, ResNetV2
from ..models.vit import VisionTransformer
from . import bit, hf, hub, npz, ours
from .apply import apply_state_dict
from .checkpoint import Checkpoint, read_checkpoint
from .infer import infer_config
from .report import LoadReport, ShapeMismatchError, WeightsError

log = logging.getLogger("vitlab.weights")


def load_weights(
    model: VisionTransformer | ResNetV2,
    path: str | Path,
    *,
    pos_embed_resize: str | None = None,
    strict: bool = True,
    checkpoint_grid: tuple[int, int] | None = None,
) -> LoadReport:
    """Load a checkpoint of any supported format into `model`, in place.

    Formats (detected from the contents): vitlab `.safetensors`, Google vit_jax `.npz` (with or without the
    `opt/target/` prefix), big_vision ViT `.npz` (`params/...`, scanned or not), timm state dicts (`.pth` /
    `.bin` / `.safetensors`), transformers ViT directories or weight files, torchvision ViT state dicts. Pickles
    are read with `torch.load(weights_only=True)` only.

    Position embeddings on another grid are resampled on the 2-D grid (class-token row kept); a head with
    another class count is replaced by a zero-initialised one; a pre-logits layer the model lacks is dropped
    with a warning.

    Args:
        model: The destination, built with the architecture of the checkpoint (image size and classes may differ).
        path: File or directory, or any name `vitlab.weights.hub.resolve` takes: a registry name, "hf-hub:owner/repo",
            "gs://bucket/key", an https URL (downloaded once into the cache). `model.preprocess` becomes the
            registry entry's preprocessing, else the checkpoint's (when known).
        pos_embed_resize: "jax" | "bilinear" | "bicubic"; default "jax" for `.npz`, "bicubic" otherwise.
        strict: Raise when tensors are missing or left over (see `apply_state_dict`).
        checkpoint_grid: The checkpoint's patch grid (gh, gw), needed only to resample a non-square table from a
            file that does not say its size (square grids are inferred; ours and transformers' store it).

    Returns:
        What was loaded, resampled, replaced, dropped and missing.

    Example:
        >>> report = vitlab.load_weights(model, "ViT-B_16.npz")  # doctest: +SKIP
        >>> print(report)  # doctest: +SKIP
    """
    if not isinstance(model, VisionTransformer | ResNetV2):
        raise TypeError(f"load_weights needs a vitlab VisionTransformer or ResNetV2, got {type(model).__name__}")
    if pos_embed_resize is not None and pos_embed_resize not in RESIZE_MODES:
        raise ValueError(f"pos_embed_resize must be one of {RESIZE_MODES}, got {pos_embed_resize!r}")
    resolved = hub.resolve(path)
    ckpt = read_checkpoint(resolved.path)
    if bit.matches_state(ckpt.state) != isinstance(model, ResNetV2):  # a ResNet's file for a ViT, or the reverse
        kinds = ("a BiT ResNet", "a ViT") if isinstance(model, VisionTransformer) else ("a ViT", "a BiT ResNet")
        raise WeightsError(f"{ckpt.source} holds {kinds[0]}'s weights but the model is {kinds[1]}: build the model "
                           "the checkpoint describes (vitlab.load_model(path))")
    if checkpoint_grid is not None:
        gh, gw = checkpoint_grid
        ckpt.grid = (gh, gw)
    report = _apply(model, ckpt, LoadReport(str(ckpt.source), ckpt.format), pos_embed_resize, strict)
    eps = ckpt.known.get("hybrid_eps")
    if isinstance(model, ResNetV2):
        bit.adopt_eps(model, ckpt, report)  # the BiT ResNet's numerics follow the weights' source too
    elif eps is not None and (backbone := model.patch_embed.backbone) is not None and eps != model.cfg.hybrid_eps:
        # the ResNet's numerics follow the weights' source (docs/weights.md, "Hybrid numerics")
        set_eps(backbone, eps)
        report.messages.append(f"hybrid_eps: {model.cfg.hybrid_eps!r} -> {eps!r}, the epsilons of the weights' source")
        model.cfg = model.cfg.replace(hybrid_eps=eps)
    entry_pp = hub.entry_preprocess(resolved.entry) or ckpt.preprocess  # the entry's facts, else the file's
    if entry_pp is not None:
        model.preprocess = resolve_preprocess(entry_pp, img_size=model.cfg.img_size, in_chans=model.cfg.in_chans)
    return report


def _apply(model: VisionTransformer | ResNetV2, ckpt: Checkpoint, report: LoadReport, resize: str | None,
           strict: bool, assign: bool = False) -> LoadReport:
    apply_state_dict(model, ckpt.state, report, src_grid=ckpt.grid, resize=resize or ckpt.default_resize,
                     strict=strict, assign=assign)
    for msg in report.messages:
        log.info("%s: %s", report.source, msg)
    return report


def save_weights(model: VisionTransformer | ResNetV2, path: str | Path, metadata: dict[str, Any] | None = None, *,
                 overwrite: bool = False) -> Path:
    """Write `model`'s weights; the format follows the suffix, and the file is written atomically.

    `.safetensors`: our format, the ViTConfig, `metadata` (any JSON: recipe, metrics, class names) and
    `model.preprocess` (the input preprocessing the weights expect, when set) in the header, so `load_model(path)`
    needs nothing else. `.npz`: Google's vit_jax names, readable by vit_jax and
    by timm's `_load_weights` (the config is not stored; `load_model` infers it, heads included).

    Args:
        model: A vitlab VisionTransformer.
        path: Destination ending in `.safetensors` or `.npz`.
        metadata: JSON-serialisable dict stored with a `.safetensors` file (read back by `read_metadata`).
        overwrite: Replace an existing file (otherwise FileExistsError).

    Returns:
        The path written.
    """
    if not isinstance(model, VisionTransformer | ResNetV2):
        raise TypeError(f"save_weights needs a vitlab VisionTransformer or ResNetV2, got {type(model).__name__}")
    if metadata is not None and not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
    path = Path(path)
    state = model.state_dict()
    if any(t.is_meta for t in state.values()):
        raise ValueError("the model is on the meta device (no data); materialise it before saving")
    if path.suffix == ".safetensors":
        return ours.save_safetensors(state, path, model.cfg, metadata, overwrite,
                                     preprocess=getattr(model, "preprocess", None))
    if path.suffix == ".npz":
        if isinstance(model, ResNetV2):  # Google's BiT layout
            return npz.save_npz(bit.to_npz(state), path, overwrite)
        arrays, notes = npz.from_ours(state, model.cfg)
        for note in notes:
            log.info("%s: %s", path, note)
        if metadata:
            log.warning("%s: .npz files carry no metadata; %d metadata key(s) not written", path, len(metadata))
        return npz.save_npz(arrays, path, overwrite)
    raise ValueError(f"cannot tell the format of {path}: use a .safetensors (vitlab) or .npz (Google) suffix")


@overload
def load_model(
    path: str | Path, *, pos_embed_resize: str | None = None, return_report: Literal[False] = False, **overrides: Any
) -> VisionTransformer: ...


@overload
def load_model(
    path: str | Path, *, pos_embed_resize: str | None = None, return_report: Literal[True], **overrides: Any
) -> tuple[VisionTransformer, LoadReport]: ...


@overload
def load_model(
    path: str | Path, *, pos_embed_resize: str | None = None, return_report: bool, **overrides: Any
) -> VisionTransformer | tuple[VisionTransformer, LoadReport]: ...


def load_model(
    path: str | Path,
    *,
    pos_embed_resize: str | None = None,
    return_report: bool = False,
    **overrides: Any,
) -> VisionTransformer | tuple[VisionTransformer, LoadReport]:
    """Build the model a checkpoint was made with and load it, from the file alone.

    `path` is a file or directory or any name `vitlab.weights.hub.resolve` takes (registry name, "hf-hub:owner/repo",
    "gs://...", https URL); a registry entry's config overrides and preprocessing apply (yours win).

    The architecture comes from the stored ViTConfig (our `.safetensors`, or a config.json beside the file), a
    transformers config.json, or else the tensor shapes (see `vitlab.weights.infer`); what was inferred is
    logged and listed in the report. `overrides` change config fields before loading, e.g. `num_classes=10`
    (new zero head) or `img_size=384` (position embeddings resampled).

    Returns:
        The model in eval mode, and with `return_report` the LoadReport too. `model.preprocess` is the input
        preprocessing the checkpoint carries or its format implies (None when unknown; see docs/weights.md).
    """
    resolved = hub.resolve(path)
    overrides = {**hub.entry_overrides(resolved.entry), **overrides}
    ckpt = read_checkpoint(resolved.path)
    entry_pp = hub.entry_preprocess(resolved.entry)
    if entry_pp is not None:  # the registry's facts about the weights come before the file's convention
        ckpt.preprocess = entry_pp
    report = LoadReport(str(ckpt.source), ckpt.format)
    if ckpt.config is not None:
        cfg = ckpt.config
        report.sources = {k: ckpt.sources.get(k, f"the config stored with the weights ({ckpt.format})")
                          for k in _ARCH_FIELDS}
    else:
        shapes: dict[str, str] = {}
        known = {**ckpt.known, **{k: v for k, v in overrides.items() if k in _DECIDING}}
        cfg, report.inferred, notes = infer_config(ckpt.state, known, ckpt.grid, str(ckpt.source),
                                                   img_size_hint=overrides.get("img_size"), sources=shapes)
        report.sources = {**{k: ckpt.sources.get(k, f"the file's config ({ckpt.format})") for k in ckpt.known
                             if k in _ARCH_FIELDS}, **shapes}
        report.messages.extend(notes)
        if ckpt.format == "hf" and "layer_norm_eps" not in ckpt.known and "layer_norm_eps" not in overrides:
            report.messages.append("no config.json beside the transformers weights: layer_norm_eps=1e-6 assumed "
                                   "(transformers' default is 1e-12; pass layer_norm_eps=... if it was used)")
        if report.inferred.get("img_size") is not None and ckpt.grid is None:
            ckpt.grid = cfg.grid_size  # the file's grid: cfg has the inferred img_size
        log.info("%s: inferred from tensor shapes: %s", ckpt.source,
                 ", ".join(f"{k}={v}" for k, v in report.inferred.items()))
    if overrides:
        cfg = cfg.replace(**overrides)
        report.sources.update({k: "load_model argument" for k in overrides if k in _ARCH_FIELDS})
    try:
        model = _uninitialised(cfg, ckpt)
    except ValueError as e:
        if isinstance(e, WeightsError):
            raise
        raise WeightsError(f"{ckpt.source}: cannot build the model: {e}") from e
    if model is None:  # it has state outside its state dict, which only its own constructor makes
        model = VisionTransformer(cfg) if isinstance(cfg, ViTConfig) else ResNetV2(cfg)
    # strict: every parameter is then loaded, resampled, or (the head) replaced and zeroed; none is left empty
    _apply(model, ckpt, report, pos_embed_resize, strict=True, assign=True)
    if ckpt.preprocess is not None:  # the checkpoint's own preprocessing, at the size the model is built for
        model.preprocess = resolve_preprocess(ckpt.preprocess, img_size=cfg.img_size, in_chans=cfg.in_chans)
    model.eval()
    return (model, report) if return_report else model


# The fields whose values change a model's numbers (the report says where each came from).
_ARCH_FIELDS = ("embed_dim", "depth", "num_heads", "mlp_dim", "patch_size", "img_size", "in_chans", "num_classes",
                "class_token", "pool", "pos_embed", "representation_size", "layer_norm_eps", "qkv_bias", "act", "mlp",
                "mlp_norm", "layer_scale", "reg_tokens", "no_embed_class", "distilled", "fc_norm", "pre_norm",
                "patch_bias", "hybrid_layers", "hybrid_width", "rope", "rope_theta", "rope_ref_grid")
# Fields the tensors cannot decide: a load_model argument settles them before the shapes are read (so a refusal
# that names one of them is answered by passing it).
_DECIDING = ("num_heads", "act", "layer_norm_eps", "no_embed_class", "pool", "rope", "rope_theta", "rope_ref_grid")


class _NoInit(VisionTransformer):
    def init_weights(self) -> None:  # every tensor is about to be overwritten by the checkpoint
        pass


class _NoInitResNet(ResNetV2):
    def init_weights(self) -> None:
        pass


def _uninitialised(cfg: ViTConfig | ResNetConfig, ckpt: Checkpoint | None = None) -> Any:
    """A VisionTransformer with CPU storage that is not initialised: built on the meta device, without
    init_weights (whose random draws cost seconds for the large variants, and on meta a one-time import).
    None when the model holds tensors a checkpoint does not carry (non-persistent buffers).

    With `ckpt`, its tensors' shapes are checked against the model's while the model is still on the meta
    device, so a config that disagrees with the file (a config.json claiming width 131072 beside a small file)
    fails before any memory is allocated (`check_fits`)."""
    with torch.device("meta"):
        model: Any = _NoInit(cfg) if isinstance(cfg, ViTConfig) else _NoInitResNet(cfg)
    if ckpt is not None:
        check_fits(model, ckpt)
    if set(model.state_dict()) != {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}:
        return None
    for module in model.modules():  # Module.to_empty would do, but on meta tensors it imports sympy (seconds)
        for name, p in list(module.named_parameters(recurse=False)):
            module.register_parameter(name, nn.Parameter(torch.empty(p.shape, dtype=p.dtype), p.requires_grad))
        for name, b in list(module.named_buffers(recurse=False)):
            module.register_buffer(name, torch.empty(b.shape, dtype=b.dtype))
    model.__class__ = model.__class__.__base__  # a plain VisionTransformer / ResNetV2 from here on
    return model


# Config fields whose values show up as tensor dimensions: a mismatching dimension names its field.
_SIZE_FIELDS = ("embed_dim", "mlp_dim", "in_chans", "patch_size", "num_classes", "representation_size",
                "hybrid_width", "width")


def check_fits(meta_model: VisionTransformer, ckpt: Checkpoint) -> None:
    """Raise before the model is allocated when the checkpoint's tensors cannot fill `meta_model` (a model on
    the meta device): a shape that differs where neither position-embedding resampling nor a new head applies,
    or a model too large for this machine's memory.

    Raises:
        ShapeMismatchError: the config (stored, beside the file, or overridden) disagrees with a tensor; the
            message names the config field(s) and the tensor.
        WeightsError: the configured model would not fit in memory.
    """
    cfg = meta_model.cfg
    beside = (ckpt.source if ckpt.source.is_dir() else ckpt.source.parent) / "config.json"
    if ckpt.format == "vitlab":
        where = "the config stored in the file"
    elif beside.exists() and (ckpt.config is not None or ckpt.format == "hf"):
        where = str(beside)
    else:
        where = "the config (inferred from the tensors, with the overrides given)"
    hf_names = {ours: theirs for theirs, ours in hf.CONFIG_FIELDS.items()} if ckpt.format == "hf" else {}
    target = meta_model.state_dict()
    first = ("patch_embed.proj.weight", "blocks.0.mlp.fc1.weight")  # the tensors that fix width and MLP size
    for name, t in sorted(ckpt.state.items(), key=lambda kv: (kv[0] not in first, kv[0])):
        want = target.get(name)
        if want is None or name == "pos_embed" or name.startswith("pre_logits."):
            continue  # unexpected / resampled / dropped: apply_state_dict decides and reports
        got, need = tuple(t.shape), tuple(want.shape)
        if name in ("head.weight", "head.bias"):  # another class count is a new head; the input width must fit
            got, need = got[1:], need[1:]
        if got == need:
            continue
        values = {f: getattr(cfg, f) for f in _SIZE_FIELDS if isinstance(getattr(cfg, f, None), int)}
        fields = [f"{hf_names.get(f, f)}={v}" for f, v in values.items() if v in need and v not in got] or \
                 [f"{hf_names.get(f, f)}={v}" for f, v in values.items() if v in need]
        raise ShapeMismatchError(
            f"{ckpt.source}: {where} gives {', '.join(fields) or 'a model'} whose {name} is {tuple(want.shape)}, "
            f"but the checkpoint's {name} is {tuple(t.shape)}: the config does not describe these weights "
            "(nothing was allocated)")
    depth = 1 + max((int(k.split(".")[1]) for k in ckpt.state if k.startswith("blocks.") and
                     k.split(".")[1].isdigit()), default=-1)
    if depth and depth != getattr(cfg, "depth", depth):
        field = hf_names.get("depth", "depth")
        raise ShapeMismatchError(f"{ckpt.source}: {where} gives {field}={cfg.depth}, but the checkpoint has {depth} "
                                 "blocks (blocks.0 ...): the config does not describe these weights")
    n_bytes = sum(p.numel() * p.element_size() for p in target.values())
    available = _memory_bytes()
    if available is not None and n_bytes > available:
        shown = ", ".join(f"{f}={getattr(cfg, f)}" for f in ("embed_dim", "depth", "mlp_dim", "width", "layers",
                                                               "num_classes") if hasattr(cfg, f))
        raise WeightsError(
            f"{ckpt.source}: {where} gives a model of {n_bytes / 2**30:.1f} GiB of parameters ({shown}), more than "
            f"this machine's {available / 2**30:.1f} GiB of memory; the checkpoint holds "
            f"{sum(t.numel() * t.element_size() for t in ckpt.state.values()) / 2**20:.1f} MiB")


def _memory_bytes() -> int | None:
    """Physical memory of this machine (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The metadata stored with a checkpoint: for ours, exactly the dict given to `save_weights`; for a
    transformers checkpoint, {"class_names": [...]} from its id2label; otherwise {}. `path` may be any name
    `vitlab.weights.hub.resolve` takes."""
    path = hub.resolve(path).path
    if path.is_file() and path.suffix == ".npz":
        return {}  # parameters only, as Google's files
    if path.is_file() and path.suffix == ".safetensors":
        header = ours.read_header(path)
        if ours.CONFIG_KEY in header or ours.META_KEY in header:
            return ours.read_meta(path)
    return read_checkpoint(path).meta


def read_config(path: str | Path) -> ViTConfig | ResNetConfig:
    """The config (ViTConfig, or a BiT ResNet's ResNetConfig) of a checkpoint: stored, from its config.json, or
    inferred from its tensor shapes (with a
    registry entry's config overrides when `path` names one; any name `vitlab.weights.hub.resolve` takes)."""
    resolved = hub.resolve(path)
    over = hub.entry_overrides(resolved.entry)
    ckpt = read_checkpoint(resolved.path)
    if ckpt.config is not None:
        cfg = ckpt.config
    else:
        cfg = infer_config(ckpt.state, ckpt.known, ckpt.grid, str(ckpt.source), img_size_hint=over.get("img_size"))[0]
    return cfg.replace(**over) if over else cfg
