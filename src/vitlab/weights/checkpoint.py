"""Read any supported checkpoint into one shape: tensors in our names plus what the file says about itself.

Format detection looks at what is there, not at the file name alone: a directory with a transformers
`config.json`, an `.npz` archive, a `.safetensors` file with our header, or tensor names (timm, transformers,
torchvision) inside a `.safetensors` / `.pth` / `.bin` file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..models import preprocess as pp
from ..models.config import ViTConfig, to_hw
from ..models.resnet import ResNetConfig, config_from_dict
from . import big_vision, bit, dinov2, eva, hf, hf_families, npz, openclip, ours, safety, timm, timm_arch, torchvision
from . import preprocess_files as files
from .converted import Converted, Unfixed
from .hub import entry_preprocess, resolve
from .infer import infer_config
from .report import WeightsError

FORMATS = ("vitlab", "npz", "big_vision", "timm", "hf", "torchvision", "openclip", "dinov2")
# Where training scripts nest the model's state dict inside a checkpoint dict.
_NESTED = ("state_dict", "model", "model_state_dict", "module", "state_dict_ema", "model_ema")
_HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


@dataclass
class Checkpoint:
    """A checkpoint read into our names.

    Attributes:
        source: What was read (file or directory).
        format: One of FORMATS.
        state: Tensors named as in our model (timm's names).
        config: The full ViTConfig when the file carries one (ours, or ours beside it).
        known: Config fields the file states outright (transformers config.json, heads of a .npz).
        sources: For each field of `known` (or of `config`), where in the file it was read ("config.json
            model_args", "architecture name vit_so400m_patch14_siglip_gap_224", ...); shown in the LoadReport.
        grid: The checkpoint's position-embedding grid, when its config fixes it.
        meta: Free-form metadata stored with it (ours: what `save_weights` was given; transformers, timm and
            torchvision: "class_names" from id2label, label_names or the header `export` wrote).
        default_resize: Position-embedding resampling mode native to the format.
        preprocess: The input preprocessing the weights expect, from the file (ours: its header; transformers:
            preprocessor_config.json; timm hub: config.json's pretrained_cfg) or the format's convention (vit_jax
            `.npz`: [-1, 1], whole image; torchvision: ImageNet statistics, shorter side 256, crop 224); None when
            unknown (a bare timm or transformers state dict). Its img_size is the checkpoint's own; the resolver
            (`vitlab.models.preprocess.resolve`) puts the model's in its place.
    """

    source: Path
    format: str
    state: dict[str, torch.Tensor]
    config: ViTConfig | ResNetConfig | None = None
    known: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    grid: tuple[int, int] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    default_resize: str = "bicubic"
    preprocess: pp.Preprocess | None = None

    def __post_init__(self) -> None:
        if self.preprocess is None:
            self.preprocess = _convention(self)


def _convention(ckpt: Checkpoint) -> pp.Preprocess | None:
    """The preprocessing a format implies when the file does not say (None: the format has no single one)."""
    if ckpt.format not in ("npz", "big_vision", "torchvision"):
        return None
    size = _img_size(ckpt)
    if ckpt.format == "torchvision":
        # ViT_*_Weights.IMAGENET1K_V1 at 224: shorter side 256, crop 224, bilinear; the SWAG_E2E weights at 384 /
        # 512 / 518: resize = crop, bicubic (ViT_L_16 V1's 242 and SWAG_LINEAR need their registry entry)
        if size == 224:
            return files.torchvision_classification(224, 256, "bilinear", "torchvision convention (IMAGENET1K_V1)")
        side = size if isinstance(size, int) else size[0]  # torchvision's ViTs are square
        return files.torchvision_classification(side, side, "bicubic", "torchvision convention (SWAG_E2E_V1)")
    if ckpt.format == "big_vision":
        # big_vision's ImageNet ViT configs (vit_i1k.py, vit_s16_i1k.py) evaluate with
        # decode|resize_small(256)|central_crop(224)|value_range(-1, 1): shorter side to size / 0.875, centre crop;
        # resize_small's "area" method is TF's box filter, closest here is PIL's antialiased bilinear
        return pp.Preprocess(size, pp.INCEPTION.mean, pp.INCEPTION.std, "center_crop", 0.875, "bilinear", "rgb",
                             "big_vision convention (configs/vit_i1k.py pp_eval)")
    return files.vit_jax(size)


def _img_size(ckpt: Checkpoint) -> int | tuple[int, int]:
    """The checkpoint's input size: its config, what it states, or its position-embedding grid; else 224."""
    if ckpt.config is not None:
        return ckpt.config.img_size
    if "img_size" in ckpt.known:
        return ckpt.known["img_size"]
    try:
        return infer_config(ckpt.state, ckpt.known, ckpt.grid, str(ckpt.source))[0].img_size
    except (WeightsError, ValueError, KeyError, IndexError):
        return 224


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Read `path` (file or directory) in whichever supported format it is.

    Raises:
        FileNotFoundError: nothing at `path`.
        UnsafeCheckpointError: a pickle that would run code.
        WeightsError: an unknown or unsupported layout (the message names what was found).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    src = str(path)
    if path.is_dir():
        return _read_dir(path)
    if path.suffix == ".npz":
        arrays = safety.np_load(path)
        if bit.matches_npz(arrays):  # Google's BiT ResNet: resnet/root_block/...
            state, hints = bit.npz_to_ours(arrays, src)
            return Checkpoint(path, "npz", state, known=hints)
        if big_vision.matches(arrays):  # params/ prefix, top-level pos_embedding, scanned blocks, MAP head
            state, hints = big_vision.to_ours(arrays, src)
            return Checkpoint(path, "big_vision", state, known={"act": "gelu", **hints}, sources=_google_sources(),
                              default_resize="jax")  # scipy zoom, order 1
        state, hints = npz.to_ours(arrays, src)
        return Checkpoint(path, "npz", state, known={"act": "gelu", **hints}, sources=_google_sources(),
                          default_resize="jax")
    if path.suffix == ".safetensors":
        header = ours.read_header(path)
        tensors = ours.load_tensors(path)
        cfg = ours.read_config(path) if ours.CONFIG_KEY in header else None
        if cfg is not None:
            meta = ours.read_meta(path)
            return Checkpoint(path, "vitlab", timm.to_ours(tensors, src), config=cfg, grid=cfg.grid_size,
                              meta=meta, preprocess=ours.read_preprocess(path, header) or _from_recipe(meta, cfg))
        names = ours.read_header_class_names(path, header)  # a timm / torchvision file `export` wrote
    else:
        tensors = _unwrap(safety.torch_load(path), src)
        names, header = None, {}
    ckpt = _from_tensors(tensors, path)
    if names:
        ckpt.meta["class_names"] = names
    if ckpt.format == "timm" and TIMM_ARCH_HEADER in header:
        _timm_header(ckpt, header)
    _config_beside(ckpt)
    return ckpt


# What `vitlab export --to timm` writes in a .safetensors header: the architecture and its keyword arguments.
TIMM_ARCH_HEADER, TIMM_KWARGS_HEADER = "timm.architecture", "timm.kwargs"


def _timm_header(ckpt: Checkpoint, header: dict[str, str]) -> None:
    """The fields of a timm file `vitlab export` wrote: its header names timm's architecture and the create_model
    keyword arguments that build the network, as a timm Hub config.json's architecture and model_args do."""
    where = f"{ckpt.source} header {TIMM_KWARGS_HEADER}"
    try:
        kwargs = json.loads(header.get(TIMM_KWARGS_HEADER, "{}"))
    except ValueError as e:
        raise WeightsError(f"{where}: not JSON: {_short(e)}") from e
    if not isinstance(kwargs, dict):
        raise WeightsError(f"{where}: an object of keyword arguments expected, got {type(kwargs).__name__}")
    fields = timm_arch.fields_for(header[TIMM_ARCH_HEADER], kwargs, str(ckpt.source))
    for name, (value, source) in timm_arch.trusted(fields, ckpt.state).items():
        if name not in ckpt.known or isinstance(ckpt.known[name], Unfixed):  # what the tensors leave open
            ckpt.known[name], ckpt.sources[name] = value, f"the file's header ({source})"


def _google_sources() -> dict[str, str]:
    """Where the fields of a Google `.npz` come from: the heads from the query kernel's shape; the activation by the
    convention timm and torchvision read these files with (exact GELU). Google's flax MlpBlock calls nn.gelu, the
    tanh approximation: `act="gelu_tanh"` reproduces Google's own forward (docs/weights.md, "vit_jax .npz")."""
    return {"num_heads": "the .npz query kernel's shape (D, heads, D/heads)",
            "act": "exact GELU, as timm reads Google's .npz (Google's flax code: act='gelu_tanh')"}


def _read_dir(path: Path) -> Checkpoint:
    if (path / openclip.CONFIG_FILE).exists():  # an OpenCLIP Hub folder: open_clip_config.json beside its weights
        weights_file = next((path / n for n in openclip.WEIGHT_FILES if (path / n).exists()), None)
        if weights_file is None:
            raise WeightsError(f"{path}: {openclip.CONFIG_FILE} without OpenCLIP weights "
                               f"({', '.join(openclip.WEIGHT_FILES)})")
        ckpt = _from_tensors(ours.load_tensors(weights_file) if weights_file.suffix == ".safetensors" else _unwrap(
            safety.torch_load(weights_file), str(weights_file)), weights_file)
        ckpt.source = path
        return ckpt
    cfg_file = path / "config.json"
    weights = next((path / n for n in _HF_WEIGHTS if (path / n).exists()), None)
    if weights is None:
        if (path / "model.safetensors.index.json").exists():
            raise WeightsError(f"{path}: sharded transformers checkpoints are not supported (ViTs fit one file)")
        found = sorted(p.name for p in path.iterdir())[:10]
        raise WeightsError(f"{path}: a directory needs {' or '.join(_HF_WEIGHTS)} (found: {found})")
    if weights.suffix == ".safetensors" and ours.CONFIG_KEY in ours.read_header(weights):
        ckpt = read_checkpoint(weights)  # our own file (`save_pretrained`'s folder): its config, metadata, preprocess
        ckpt.source = path
        if cfg_file.exists():
            _hub_folder_config(ckpt, cfg_file)
        return ckpt
    if not cfg_file.exists():
        raise WeightsError(f"{path}: a transformers checkpoint directory needs config.json")
    tensors = ours.load_tensors(weights) if weights.suffix == ".safetensors" else _unwrap(
        safety.torch_load(weights), str(weights))
    ckpt = _from_tensors(tensors, weights)
    ckpt.source = path
    _config_beside(ckpt)
    return ckpt


def _from_tensors(tensors: dict[str, torch.Tensor], path: Path) -> Checkpoint:
    src = str(path)
    keys = set(tensors)
    family = _hf_family(path, keys)
    if family is not None:  # transformers' DINOv2 / CLIP / SigLIP / MAE / DeiT, by config.json's model_type
        return _foreign(path, "hf", hf_families.convert(tensors, family, src, str(_beside(path))))
    if dinov2.matches(keys):  # before timm's: the same block names, with mask_token / register_tokens
        return _foreign(path, "dinov2", dinov2.convert(tensors, src))
    if openclip.matches(keys):
        return _foreign(path, "openclip", _openclip(tensors, path))
    if eva.matches(keys):  # timm's Eva class (EVA-02, DINOv3): its own names, RoPE
        return _foreign(path, "timm", eva.convert(tensors, src))
    if bit.matches_timm(keys):  # timm's resnetv2_*_bit (a BiT ResNet, vitlab.models.resnet)
        return Checkpoint(path, "timm", bit.timm_to_ours(tensors, src))
    if timm.matches(keys):
        return Checkpoint(path, "timm", timm.to_ours(tensors, src))
    if hf.matches(keys):
        return Checkpoint(path, "hf", hf.to_ours(tensors, src))
    if torchvision.matches(keys):
        return Checkpoint(path, "torchvision", torchvision.to_ours(tensors, src))
    sample = ", ".join(sorted(keys)[:6])
    raise WeightsError(
        f"{path}: not a ViT checkpoint in any known layout (timm, transformers, torchvision, vit_jax .npz, "
        f"vitlab .safetensors); first tensor names: {sample}"
    )


def _beside(path: Path) -> Path:
    return (path if path.is_dir() else path.parent) / "config.json"


def _hf_family(path: Path, keys: set[str]) -> dict[str, Any] | None:
    """The transformers config.json beside `path` when its model_type is a family `hf_families` reads (or
    refuses) and the tensors are a transformers vision model's."""
    file = _beside(path)
    if not hf_families.matches(keys) or not file.exists():
        return None
    data = _read_json(file, "config.json beside the checkpoint")
    return data if hf_families.handles(data) else None


def _openclip(tensors: dict[str, torch.Tensor], path: Path) -> Converted:
    """An OpenCLIP state dict, with the open_clip_config.json beside it (its model_cfg and preprocess_cfg)."""
    file = path.parent / openclip.CONFIG_FILE
    config = _read_json(file, "OpenCLIP config beside the checkpoint") if file.exists() else None
    conv = openclip.convert(tensors, str(path), config, str(file))
    if isinstance(config, dict):
        conv.preprocess = openclip.preprocess_from(config, conv.known["img_size"], str(file))
    return conv


def _foreign(path: Path, fmt: str, conv: Converted) -> Checkpoint:
    """A Checkpoint of a converted foreign layout; its grid from the image size the file fixes."""
    grid = None
    if "img_size" in conv.known:
        h, w = to_hw(conv.known["img_size"])
        patch = int(conv.state["patch_embed.proj.weight"].shape[-1])
        grid = (h // patch, w // patch)
    return Checkpoint(path, fmt, conv.state, known=conv.known, sources=conv.sources, grid=grid,
                      default_resize=conv.default_resize, preprocess=conv.preprocess)


def _unwrap(obj: Any, source: str) -> dict[str, torch.Tensor]:
    """The tensor dict inside a training checkpoint ({"model": ..., "optimizer": ...}), prefixes removed."""
    for _ in range(3):
        if isinstance(obj, dict) and not any(isinstance(v, torch.Tensor) for v in obj.values()):
            inner = next((obj[k] for k in _NESTED if isinstance(obj.get(k), dict)), None)
            if inner is None:
                break
            obj = inner
    if not isinstance(obj, dict) or not obj:
        raise WeightsError(f"{source}: expected a state dict (name -> tensor), got {type(obj).__name__}")
    odd = [k for k in obj if not isinstance(k, str)]
    if odd:  # torch.save({0: tensor}): a list or dict of tensors by number, not a module's state dict
        shown = ", ".join(f"{k!r} ({type(k).__name__})" for k in odd[:4]) + (", ..." if len(odd) > 4 else "")
        raise WeightsError(f"{source}: not a state dict: its keys must be tensor names (strings); found "
                           f"{len(odd)} non-string key{'s' if len(odd) > 1 else ''}: {shown}")
    tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise WeightsError(f"{source}: holds no tensors at its top level (keys: {sorted(obj)[:8]})")
    for prefix in ("module.", "_orig_mod.", "model."):  # DDP, torch.compile, wrappers
        if all(k.startswith(prefix) for k in tensors):
            tensors = {k.removeprefix(prefix): v for k, v in tensors.items()}
    return tensors


def _hub_folder_config(ckpt: Checkpoint, file: Path) -> None:
    """A vitlab Hub folder's config.json ({"library_name": "vitlab", "config": {...}, "preprocess": {...}}, as
    `vitlab.weights.publish.save_pretrained` writes it) is the folder's truth, as on the Hub: its config (a ViT's or
    a BiT ResNet's) and preprocessing win over the weights file's header, whose grid stays the file's (an edited
    img_size resamples the position embeddings). Another library's config.json is left alone."""
    data = _read_json(file, "config.json of the folder")
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict) or "model_type" in data:
        return
    try:
        ckpt.config = config_from_dict(data["config"])
        if data.get("preprocess"):
            ckpt.preprocess = pp.Preprocess.from_dict(data["preprocess"])
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise WeightsError(f"{file}: {type(e).__name__}: {_short(e)}") from e


def _config_beside(ckpt: Checkpoint) -> None:
    """Use a config.json next to the weights: a transformers config, or a vitlab config (possibly nested)."""
    base = ckpt.source if ckpt.source.is_dir() else ckpt.source.parent
    file = base / "config.json"
    if not file.exists():
        return
    data = _read_json(file, "config.json beside the checkpoint")
    if hf.is_hf_config(data):
        if ckpt.format != "hf":
            return  # someone else's config; the tensors speak for themselves
        _processor_beside(ckpt, base)
        if hf_families.handles(data):  # its fields were read with the tensors (_from_tensors)
            if names := hf_families.class_names(data):
                ckpt.meta["class_names"] = names
            return
        try:
            known = hf.config_from_hf(data, str(file))
        except (TypeError, ValueError, KeyError, AttributeError) as e:  # values of the wrong type or form
            if isinstance(e, WeightsError):
                raise
            raise WeightsError(f"{file}: bad transformers config.json: {type(e).__name__}: {e}") from e
        if "class_names" in known:
            ckpt.meta["class_names"] = known.pop("class_names")
        ckpt.known.update(known)
        if "img_size" in known and "patch_size" in known:
            img = known["img_size"]
            h, w = img if isinstance(img, tuple) else (img, img)
            ckpt.grid = (h // known["patch_size"], w // known["patch_size"])
        return
    if isinstance(data, dict) and isinstance(data.get("pretrained_cfg"), dict):
        _timm_config(ckpt, data, file)
        return
    for key in (ours.CONFIG_KEY, "config", "model"):
        if isinstance(data, dict) and isinstance(data.get(key), dict):
            data = data[key]
            break
    try:
        cfg = config_from_dict(data)  # a ViT's or (with "arch": "resnetv2") a BiT ResNet's
    except (TypeError, ValueError):
        return  # not a config of ours: ignore it rather than guess
    ckpt.config = cfg
    ckpt.grid = cfg.grid_size


def _from_recipe(meta: dict[str, Any], cfg: ViTConfig | ResNetConfig) -> pp.Preprocess | None:
    """Files `vitlab train` wrote before the header held the preprocessing: the recipe's data section says it."""
    data = (meta.get("recipe") or {}).get("data") if isinstance(meta.get("recipe"), dict) else None
    if not isinstance(data, dict):
        return None
    center = data.get("eval_resize") == "center_crop"
    try:
        return pp.from_stats(
            data.get("normalize", "inception"), cfg.img_size, cfg.in_chans,
            resize="center_crop" if center else "resize",
            crop_fraction=float(data.get("eval_crop_fraction", 0.875)) if center else 1.0,
            channels="grey" if cfg.in_chans == 1 else ("grey_to_rgb" if data.get("expand_channels") else "rgb"),
            source="the recipe stored in the metadata")
    except (ValueError, TypeError):
        return None


def _processor_beside(ckpt: Checkpoint, base: Path) -> None:
    """transformers' preprocessor_config.json next to the weights -> ckpt.preprocess."""
    file = base / "preprocessor_config.json"
    if not file.exists():
        return
    data = _read_json(file, "preprocessor config beside the checkpoint")
    try:
        ckpt.preprocess = files.from_hf_processor(data, str(file))
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise WeightsError(f"{file}: bad preprocessor config beside the checkpoint: {type(e).__name__}: {e}") from e


def _read_json(file: Path, what: str) -> Any:
    """A JSON file next to a checkpoint; WeightsError naming it when it is not JSON (or not text at all)."""
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise
    except (OSError, ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError; absurd nesting
        kind = safety.sniff(file)
        looks = "" if kind.name in ("json", "text") else f" (looks like {kind.description})"
        raise WeightsError(f"{file}: unreadable {what}{looks}: {type(e).__name__}: {_short(e)}") from e


def _short(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else "")[:200]


def _timm_config(ckpt: Checkpoint, data: dict[str, Any], file: Path) -> None:
    """A timm hub config.json ({"architecture", "num_classes", "model_args"?, "pretrained_cfg": {...}}): the
    preprocessing, and every architecture field its architecture name and model_args fix as timm builds them
    (`vitlab.weights.timm_arch.fields_for`), each with where it came from."""
    if ckpt.format not in ("timm", "npz", "big_vision"):
        return
    try:
        ckpt.preprocess = files.from_timm_cfg(data["pretrained_cfg"], f"{file} pretrained_cfg")
    except WeightsError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise WeightsError(f"{file}: bad timm pretrained_cfg: {e}") from e
    model_args, pool = data.get("model_args"), data.get("global_pool")
    if model_args is not None and not isinstance(model_args, dict):
        raise WeightsError(f"{file}: model_args must be an object, got {type(model_args).__name__}")
    fields = timm_arch.fields_for(str(data.get("architecture", "")), model_args, str(file),
                                  pretrained_cfg=data["pretrained_cfg"], num_classes=data.get("num_classes"),
                                  global_pool=pool if isinstance(pool, str) and pool else None)
    for name, (value, where) in timm_arch.trusted(fields, ckpt.state).items():
        if name not in ckpt.known or isinstance(ckpt.known[name], Unfixed):  # what the tensors leave open
            ckpt.known[name], ckpt.sources[name] = value, where
    names = data.get("label_names")
    if isinstance(names, list) and names and all(isinstance(n, str) for n in names):
        ckpt.meta.setdefault("class_names", names)


def read_preprocess(name_or_path: str | Path) -> pp.Preprocess | None:
    """The preprocessing a checkpoint carries or its format implies (None when unknown), without building a model.

    A registry name's entry states it; a vitlab `.safetensors` file is read from its header only.
    """
    return _read_preprocess(name_or_path)[0]


def resolved_preprocess(name_or_path: str | Path, overrides: pp.Preprocess | dict[str, Any] | None = None, *,
                        what: str | None = None) -> pp.Preprocess:
    """The preprocessing to use for a checkpoint (`vitlab.models.preprocess.resolve`): `overrides`, else
    `read_preprocess`'s, else the default at the size and channels of its architecture, with one warning naming
    `what` (default: the name)."""
    own, ckpt = _read_preprocess(name_or_path)
    what = what or str(name_or_path)
    if own is not None or ckpt is None:
        return pp.resolve(own, overrides=overrides, what=what)
    arch = ckpt.config or infer_config(ckpt.state, ckpt.known, ckpt.grid, str(ckpt.source))[0]
    return pp.resolve(None, img_size=arch.img_size, in_chans=arch.in_chans, overrides=overrides, what=what)


def _read_preprocess(name_or_path: str | Path) -> tuple[pp.Preprocess | None, Checkpoint | None]:
    """The one reader behind both: (the preprocessing or None, the Checkpoint when it had to be read whole)."""
    path, entry = Path(name_or_path), None
    if not path.exists():
        resolved = resolve(name_or_path)
        path, entry = resolved.path, resolved.entry
    own = entry_preprocess(entry)
    if own is None and path.is_file() and path.suffix == ".safetensors":
        header = ours.read_header(path)
        if ours.CONFIG_KEY in header:
            own = ours.read_preprocess(path, header)
    if own is not None:
        return own, None
    ckpt = read_checkpoint(path)
    return ckpt.preprocess, ckpt
