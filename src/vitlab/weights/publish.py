"""Publishing a model in the ecosystem's shapes: the Hub's folder layout, and files other libraries load.

    save_pretrained(model, "my-vit")                     # config.json + model.safetensors (+ README.md)
    model = from_pretrained("my-vit")                    # or "owner/repo" on the Hugging Face Hub
    push_to_hub(model, "owner/my-vit")                   # the same folder, uploaded in one commit
    export(model, "hf-dir", "hf")                        # transformers' ViTForImageClassification directory

The Hub folder is what `huggingface_hub`'s `PyTorchModelHubMixin` writes (config.json beside model.safetensors)
with vitlab's config.json:

    {"library_name": "vitlab", "vitlab_version": "0.1.0",
     "config": {ViTConfig fields}, "preprocess": {Preprocess fields}}      # "preprocess" only when known

model.safetensors is vitlab's own file (`save_weights`: the config, metadata and preprocessing in its header,
timm's tensor names). huggingface_hub is imported only when the Hub is used.

`export` writes the five formats of `vitlab convert --to`:
    vitlab       our .safetensors (`save_weights`)
    npz          Google's vit_jax names (`save_weights`)
    hf           a transformers directory: config.json (model_type "vit", or the family that computes the model:
                 dinov2, dinov2_with_registers, clip_vision_model, siglip_vision_model, deit, vit_mae; see
                 `vitlab.weights.hf_families`), model.safetensors in transformers' names, preprocessor_config.json
                 from the model's preprocessing
    torchvision  a state dict for torchvision's `VisionTransformer(...)` (`vit_b_16` family), .pth
    timm         a state dict in timm's names for `timm.create_model(arch, **kwargs)`, .safetensors or .pth (a model
                 with RoPE: timm's Eva class, `vitlab.weights.eva`)
A model another library cannot compute is refused with the reason (hybrids for transformers and torchvision,
the pre-logits layer for transformers and timm, average pooling for transformers and torchvision).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file

from ..models.config import ViTConfig
from ..models.posembed import sincos_2d
from ..models.preprocess import Preprocess
from ..models.resnet import ResNetConfig
from ..utils.io import atomic_write, staged
from ..utils.version import __version__
from . import eva, hf, hf_families, hub, ours, torchvision
from .api import load_model, save_weights
from .checkpoint import TIMM_ARCH_HEADER, TIMM_KWARGS_HEADER
from .report import WeightsError

if TYPE_CHECKING:
    from ..models.resnet import ResNetV2
    from ..models.vit import VisionTransformer

log = logging.getLogger("vitlab.weights")

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
PREPROCESSOR_NAME = "preprocessor_config.json"
EXPORT_FORMATS = ("vitlab", "npz", "hf", "torchvision", "timm")


# -- the Hub's layout ------------------------------------------------------------------------------------------


def save_pretrained(
    model: VisionTransformer | ResNetV2,
    save_directory: str | Path,
    *,
    metadata: dict[str, Any] | None = None,
    model_card: bool = True,
) -> Path:
    """Write `model` as a Hub folder: config.json, model.safetensors, and a README.md model card if none is there.

    Files already in the folder are replaced (each atomically); others are left alone.

    Args:
        model: A vitlab VisionTransformer or BiT ResNetV2.
        save_directory: The folder (created if needed).
        metadata: JSON-serialisable facts stored with the weights (class names, recipe, metrics).
        model_card: Write README.md when the folder has none.

    Returns:
        The folder.
    """
    folder = Path(save_directory)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{folder} is a file; save_pretrained writes a folder")
    folder.mkdir(parents=True, exist_ok=True)
    with staged():  # the weights and their config.json together, or neither
        save_weights(model, folder / WEIGHTS_NAME, metadata, overwrite=True)
        _write_json(folder / CONFIG_NAME, hub_config(model))
    if model_card and not (folder / "README.md").exists():
        with atomic_write(folder / "README.md") as tmp:
            tmp.write_text(_model_card(model, metadata))
    return folder


def hub_config(model: VisionTransformer | ResNetV2) -> dict[str, Any]:
    """The config.json of a Hub folder: the model's config (ViTConfig or ResNetConfig) and, when known, the
    preprocessing."""
    out: dict[str, Any] = {"library_name": "vitlab", "vitlab_version": __version__, "config": model.cfg.to_dict()}
    preprocess = getattr(model, "preprocess", None)
    if preprocess is not None:
        out["preprocess"] = preprocess.to_dict()
    return out


def from_pretrained(
    name_or_path: str | Path,
    *,
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    force_download: bool = False,
    token: str | bool | None = None,
    local_files_only: bool = False,
    **overrides: Any,
) -> VisionTransformer | ResNetV2:
    """Load a model from a Hub folder: a local directory, or "owner/repo" on the Hugging Face Hub.

    What `load_model` does with the folder: a vitlab folder (`save_pretrained`'s, of a ViT or a BiT ResNet) takes
    the architecture and preprocessing from config.json; other folders (transformers' ViT, timm's hub repos) are
    read as theirs. Hub downloads are
    `vitlab.weights.hub.hub_download`'s, as for every Hub name `load_model` takes (huggingface_hub's cache,
    `HF_HUB_OFFLINE` / `VITLAB_OFFLINE`, tokens, the errors that say what to do).

    Args:
        name_or_path: Directory, "owner/repo" (or "hf-hub:owner/repo"), or a weights file.
        revision: Hub branch, tag or commit.
        cache_dir: Hub cache folder (default: huggingface_hub's).
        force_download: Download again even when cached.
        token: Hub token for private or gated repos.
        local_files_only: Use only the Hub cache, never the network.
        overrides: Config fields to change before loading (e.g. num_classes=10 for a new zero head).

    Returns:
        The model in eval mode.
    """
    path = Path(name_or_path)
    if not path.exists():
        loc = hub.hub_location(str(name_or_path))
        if revision is not None:
            loc = dataclasses.replace(loc, revision=revision)
        path = hub.hub_download(loc, cache_dir=cache_dir, token=token, force_download=force_download,
                                local_files_only=local_files_only)
    config_file = path / CONFIG_NAME
    if path.is_dir() and not (path / WEIGHTS_NAME).exists() and config_file.exists():
        config = _read_json(config_file)
        if isinstance(config.get("config"), dict) and "model_type" not in config:
            raise WeightsError(f"{path}: a vitlab Hub folder needs {WEIGHTS_NAME} beside config.json")
    # a vitlab folder: config.json is its truth (as on the Hub), the weights' header the fallback; other folders
    # (transformers', timm's) and files as `load_model` reads them
    return load_model(path, **overrides)


def push_to_hub(
    model: VisionTransformer | ResNetV2,
    repo_id: str,
    *,
    metadata: dict[str, Any] | None = None,
    commit_message: str = "Upload a vitlab model",
    private: bool | None = None,
    token: str | None = None,
    branch: str | None = None,
    create_pr: bool | None = None,
) -> Any:
    """Upload `model` to a Hub repo (created if missing) as `save_pretrained`'s folder, in one commit.

    Returns:
        huggingface_hub's CommitInfo.
    """
    _require_hub("push_to_hub")
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    with tempfile.TemporaryDirectory(prefix="vitlab-push-") as tmp:
        save_pretrained(model, tmp, metadata=metadata)
        return api.upload_folder(repo_id=repo_id, repo_type="model", folder_path=tmp,
                                 commit_message=commit_message, revision=branch, create_pr=create_pr)


def _require_hub(what: str) -> None:
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        raise ImportError(f"{what} needs huggingface_hub (a vitlab dependency): pip install huggingface_hub") from None


def _model_card(model: VisionTransformer | ResNetV2, metadata: dict[str, Any] | None) -> str:
    c = model.cfg
    params = sum(p.numel() for p in model.parameters())
    preprocess = getattr(model, "preprocess", None)
    if isinstance(c, ResNetConfig):
        kind, tag = "BiT ResNet-v2", "resnet"
        what = (f"{'-'.join(map(str, c.layers))} bottleneck units per stage, stem width {c.width}, "
                f"GroupNorm + weight standardisation at {c.img_size}")
    else:
        kind, tag = "Vision Transformer", "vision-transformer"
        what = (f"{c.depth} blocks, width {c.embed_dim}, {c.num_heads} heads, "
                f"{c.pixel_patch}x{c.pixel_patch} pixels per token at {c.img_size}")
    cls = type(model).__name__
    lines = [
        "---", "library_name: vitlab", "pipeline_tag: image-classification",
        "tags:", f"- {tag}", "- image-classification", "---", "",
        f"# {c.name or cls}", "",
        f"A {kind} saved with vitlab: {what}, {c.num_classes} classes, {params:,} parameters.", "",
        f"Preprocessing: {preprocess.describe() if preprocess is not None else 'unknown'}.", "",
        "```python", "import vitlab", "",
        'model = vitlab.load_model("<this folder or repo>")', "```", "",
    ]
    if metadata and isinstance(metadata.get("metrics"), dict):
        lines += ["Metrics: " + ", ".join(f"{k} {v}" for k, v in metadata["metrics"].items()), ""]
    return "\n".join(lines)


# -- other libraries' files ------------------------------------------------------------------------------------


def export(
    model: VisionTransformer,
    dst: str | Path,
    to: str,
    *,
    metadata: dict[str, Any] | None = None,
    overwrite: bool = False,
    hf_model_type: str | None = None,
) -> tuple[Path, list[str]]:
    """Write `model` as file(s) that `to`'s library loads (see the module docstring for the formats).

    Args:
        model: A vitlab VisionTransformer.
        dst: File, or for "hf" a directory.
        to: One of EXPORT_FORMATS.
        metadata: For "vitlab", stored in the header. Its class names ("classes" as `vitlab train` writes them,
            or "class_names"; `ours.stored_class_names`) become id2label / label2id for "hf", and a header entry of
            a "timm" / "torchvision" .safetensors file (`timm.label_names`, `torchvision.categories`: the words
            those libraries use); a .pth state dict has no place for them (a note says so).
        overwrite: Replace existing files.
        hf_model_type: For "hf", the transformers model_type to write ("vit" or one of
            `vitlab.weights.hf_families.WRITE`); default: the one that computes the model (ViT for the paper's,
            DINOv2, CLIP, SigLIP or DeiT for those options; MAE's encoder only when asked).

    Returns:
        The path written and notes (how to load it, what was made explicit, what differs).

    Raises:
        WeightsError: the target library cannot compute this model (the message says why).
    """
    if to not in EXPORT_FORMATS:
        raise ValueError(f"unknown format {to!r}; one of {EXPORT_FORMATS}")
    dst = Path(dst)
    cfg, name = model.cfg, str(dst)  # errors name the file that was not written
    state = model.state_dict()
    if any(t.is_meta for t in state.values()):
        raise ValueError("the model is on the meta device (no data); materialise it before saving")
    state = {k: v.detach().to("cpu") for k, v in state.items()}
    names = ours.stored_class_names(metadata or {}, cfg.num_classes)
    if to in ("vitlab", "npz"):
        want = ".safetensors" if to == "vitlab" else ".npz"
        if dst.suffix != want:
            raise ValueError(f"{dst}: --to {to} writes a {want} file; name it so")
        return save_weights(model, dst, metadata if to == "vitlab" else None, overwrite=overwrite), []
    if to == "hf":  # the transformers class that computes the model: ViT, or a family (hf_families.model_type_for)
        kind = hf_families.model_type_for(cfg, name, hf_model_type)
        if kind == "vit":
            tensors, notes = hf.from_ours(state, cfg, name)
            config = hf.config_to_hf(cfg, names)
        else:
            notes = []
            tensors, config = hf_families.from_ours(state, cfg, name, kind, notes, names)
        _write_hf_dir(dst, tensors, config, getattr(model, "preprocess", None), overwrite, notes)
        notes.append(f"load with transformers.{config['architectures'][0]}.from_pretrained({str(dst)!r})")
        return dst, notes
    if to == "torchvision":
        tensors, notes = torchvision.from_ours(state, cfg, name)
        args = torchvision.model_args(cfg, name)
        _warn_inexact(dst, notes)
        _write_state(tensors, dst, overwrite, {"torchvision.args": json.dumps(args)},
                     names=(ours.NAME_HEADERS["torchvision"], names), notes=notes)
        builder = torchvision.builder_name(cfg)
        how = "torchvision.models.vision_transformer.VisionTransformer(" + ", ".join(
            f"{k}={v!r}" for k, v in args.items()) + ")"
        if builder:
            how += f" (the shape of torchvision.models.{builder})"
        notes.append(f"load strictly into {how}")
        return dst, notes
    arch, kwargs, notes = timm_args(cfg, name)
    _warn_inexact(dst, notes)
    tensors = eva.from_ours(state, cfg, name) if cfg.rope is not None else dict(state)  # RoPE: timm's Eva names
    if "pos_embed" not in tensors and cfg.pos_embed == "sincos2d":
        pos = torch.zeros(1, cfg.seq_len, cfg.embed_dim, dtype=tensors["patch_embed.proj.weight"].dtype)
        pos[0, cfg.num_prefix_tokens :] = sincos_2d(*cfg.grid_size, cfg.embed_dim).to(pos.dtype)
        tensors["pos_embed"] = pos
    _write_state(tensors, dst, overwrite, {TIMM_ARCH_HEADER: arch, TIMM_KWARGS_HEADER: json.dumps(kwargs)},
                 names=(ours.NAME_HEADERS["timm"], names), notes=notes)
    notes.append(f"load with timm.create_model({arch!r}, pretrained=False, **{kwargs!r}).load_state_dict(...)")
    return dst, notes


def _warn_inexact(dst: Path, notes: list[str]) -> None:
    """Say it loudly when the other library will not compute exactly what the model computes."""
    for note in notes:
        if "logits differ" in note:
            log.warning("%s: %s", dst, note)


def timm_args(cfg: ViTConfig, source: str = "model") -> tuple[str, dict[str, Any], list[str]]:
    """timm's architecture name and `create_model` keyword arguments that build `cfg`'s network, plus notes.

    Raises:
        WeightsError: timm's VisionTransformer cannot compute it.
    """
    if cfg.rope is not None:  # EVA-02 / DINOv3: timm's Eva class (eva.py)
        return eva.timm_args(cfg, source)
    notes: list[str] = []
    if cfg.representation_size is not None:
        raise WeightsError(f"{source}: cannot write a timm VisionTransformer: it has a pre-logits layer "
                           f"(representation_size={cfg.representation_size}), which timm 1.x's VisionTransformer "
                           "no longer has. Use --to torchvision or --to npz")
    D = cfg.embed_dim
    ratio = cfg.mlp_dim / D
    if int(D * ratio) != cfg.mlp_dim:
        raise WeightsError(f"{source}: mlp_dim {cfg.mlp_dim} is not int(embed_dim * mlp_ratio) for any float ratio")
    h, w = cfg.img_hw
    kwargs: dict[str, Any] = {
        "img_size": h if h == w else [h, w], "patch_size": cfg.patch_size, "in_chans": cfg.in_chans,
        "num_classes": cfg.num_classes, "embed_dim": D, "depth": cfg.depth, "num_heads": cfg.num_heads,
        "mlp_ratio": ratio, "qkv_bias": cfg.qkv_bias, "class_token": cfg.class_token,
        "global_pool": "token" if cfg.pool == "token" else "avg",
    }
    if cfg.pool == "gap":
        kwargs["fc_norm"] = False  # ours normalises every token before pooling (timm's default for avg is after)
    if cfg.pos_embed == "none":
        kwargs["pos_embed"] = "none"
    elif cfg.pos_embed == "sincos2d":
        notes.append("wrote the fixed sin-cos table as timm's learned pos_embed (class-token row zero)")
    if cfg.hybrid_layers is None:
        arch = _timm_family_args(cfg, kwargs, notes, source)
        return arch, kwargs, notes
    if cfg.layer_norm_eps != 1e-6:
        notes.append(f"the model's LayerNorm eps is {cfg.layer_norm_eps:g} but timm builds 1e-6: logits differ "
                     "slightly unless the timm model is built with "
                     f"norm_layer=partial(nn.LayerNorm, eps={cfg.layer_norm_eps:g})")
    hybrids = {(3, 4, 9): "vit_base_r50_s16_224", (2, 2, 2, 2): "vit_small_r26_s32_224", (): "vit_tiny_r_s16_p8_224"}
    hybrid_arch = hybrids.get(cfg.hybrid_layers)
    if hybrid_arch is None or cfg.hybrid_width != 64:
        raise WeightsError(f"{source}: timm builds hybrids with ResNet stages {sorted(hybrids)} of width 64 only; "
                           f"this one has {cfg.hybrid_layers}, width {cfg.hybrid_width}")
    if cfg.hybrid_eps != "timm":
        notes.append(f"the model's ResNet uses {cfg.hybrid_eps}'s epsilons (weight standardisation, GroupNorm), timm's "
                     "ResNetV2 its own: logits differ slightly, most for filters of small variance")
    return hybrid_arch, kwargs, notes


# timm architectures whose registered arguments hold what JSON keyword arguments cannot (a norm layer's eps, the
# SwiGLU MLP class, the distilled model class); every other argument is overridden by `timm_args`' kwargs.
_TIMM_BASES = {"clip": "vit_base_patch16_clip_224",  # norm_layer=nn.LayerNorm (eps 1e-5), pre_norm
               "swiglu": "vit_giant_patch14_dinov2",  # mlp_layer=SwiGLUPacked, act_layer=SiLU
               "distilled": "deit_base_distilled_patch16_224"}  # VisionTransformerDistilled


def _timm_family_args(cfg: ViTConfig, kwargs: dict[str, Any], notes: list[str], source: str) -> str:
    """The timm architecture to build `cfg` from, with the later families' options added to `kwargs`."""
    if cfg.patch_bias == cfg.pre_norm:
        raise WeightsError(f"{source}: cannot write a timm VisionTransformer: timm's patch projection has a bias "
                           f"exactly when pre_norm is off, and this model has patch_bias={cfg.patch_bias}, "
                           f"pre_norm={cfg.pre_norm}")
    needs = [k for k, on in (("clip", cfg.layer_norm_eps == 1e-5), ("swiglu", cfg.mlp == "swiglu"),
                              ("distilled", cfg.distilled)) if on]
    if len(needs) > 1:
        raise WeightsError(f"{source}: cannot write a timm VisionTransformer: no timm architecture combines "
                           f"{' and '.join(needs)} (LayerNorm eps 1e-5, SwiGLU, distillation token)")
    if cfg.layer_norm_eps not in (1e-6, 1e-5):
        notes.append(f"the model's LayerNorm eps is {cfg.layer_norm_eps:g} but timm builds 1e-6: logits differ "
                     "slightly unless the timm model is built with "
                     f"norm_layer=partial(nn.LayerNorm, eps={cfg.layer_norm_eps:g})")
    kwargs.update(init_values=cfg.layer_scale, reg_tokens=cfg.reg_tokens, no_embed_class=cfg.no_embed_class,
                  pre_norm=cfg.pre_norm, scale_mlp_norm=cfg.mlp_norm)
    if cfg.act != "gelu" or needs == ["swiglu"]:
        kwargs["act_layer"] = cfg.act
    if cfg.pool == "map":
        kwargs["global_pool"] = "map"
    elif cfg.fc_norm:
        kwargs["fc_norm"] = True
    if needs:
        return _TIMM_BASES[needs[0]]
    sizes = {192: "tiny", 384: "small", 768: "base", 1024: "large", 1280: "huge"}
    arch = f"vit_{sizes.get(cfg.embed_dim, 'base')}_patch{cfg.patch_size}_224"
    return arch if arch in _TIMM_PLAIN else "vit_base_patch16_224"  # a registered name; kwargs set the rest


_TIMM_PLAIN = {"vit_tiny_patch16_224", "vit_small_patch16_224", "vit_small_patch32_224", "vit_small_patch8_224",
               "vit_base_patch8_224", "vit_base_patch16_224", "vit_base_patch32_224", "vit_large_patch16_224",
               "vit_large_patch32_224", "vit_huge_patch14_224"}


def _write_state(tensors: dict[str, torch.Tensor], dst: Path, overwrite: bool, header: dict[str, str], *,
                 names: tuple[str, list[str] | None] = ("", None), notes: list[str] | None = None) -> None:
    """A state dict as .safetensors (with `header`, and the class names `names[1]` under the key `names[0]`) or as
    a torch.save pickle (.pth / .pt / .bin: tensors only, so known class names are left out with a note)."""
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    key, class_names = names
    if dst.suffix == ".safetensors":
        if class_names:
            header = {**header, key: json.dumps(class_names)}
        with atomic_write(dst, overwrite=overwrite) as tmp:
            save_file(tensors, str(tmp), metadata={"format": "pt", **header})
    elif dst.suffix in (".pth", ".pt", ".bin"):
        with atomic_write(dst, overwrite=overwrite) as tmp:
            torch.save(tensors, tmp)
        if class_names and notes is not None:
            shown = ", ".join(class_names[:5]) + (", ..." if len(class_names) > 5 else "")
            notes.append(f"the class names ({shown}) are not in {dst.name}: a {dst.suffix} state dict holds tensors "
                         f"only; name it .safetensors to keep them (header {key!r})")
    else:
        raise ValueError(f"{dst}: name the file .safetensors or .pth")


def _write_hf_dir(dst: Path, tensors: dict[str, torch.Tensor], config: dict[str, Any],
                  preprocess: Preprocess | None, overwrite: bool, notes: list[str]) -> None:
    if dst.exists() and not dst.is_dir():
        raise NotADirectoryError(f"{dst} is a file; --to hf writes a directory")
    if dst.is_dir() and any(dst.iterdir()) and not overwrite:
        raise FileExistsError(f"{dst} exists and is not empty; pass --force to write into it")
    dst.mkdir(parents=True, exist_ok=True)
    with staged():  # all files or none: a full disk at the config leaves the earlier weights, not a mix
        ours.save_safetensors(tensors, dst / WEIGHTS_NAME, overwrite=True)
        _write_json(dst / CONFIG_NAME, config)
        if preprocess is not None:
            _write_json(dst / PREPROCESSOR_NAME, hf.preprocessor_config(preprocess))
    if preprocess is None:
        (dst / PREPROCESSOR_NAME).unlink(missing_ok=True)
        notes.append(f"the model's preprocessing is unknown: no {PREPROCESSOR_NAME} written")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    with atomic_write(path, overwrite=True) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise
    except (OSError, ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError (not text at all)
        raise WeightsError(f"{path}: unreadable: {type(e).__name__}: {e}") from e
    if not isinstance(data, dict):
        raise WeightsError(f"{path}: expected a JSON object")
    return data
