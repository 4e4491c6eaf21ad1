"""Small real checkpoints of every format vitlab reads, and damaged copies of them (for the fuzz and CLI tests).

Each builder writes into a directory and returns the path `load_model` takes (a file, or a transformers
directory). The models are tiny (width 64, one block, 8x8 images) so a file is a few kB and loads in
milliseconds.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

import vitlab
from vitlab.weights import export, save_weights
from vitlab.weights.preprocess_files import vit_jax

from .conftest import perturb_

FIXTURES = Path(__file__).parent / "fixtures"


def tiny_model() -> vitlab.VisionTransformer:
    torch.manual_seed(0)
    model = vitlab.create_model("ViT-Ti/16", embed_dim=64, depth=1, num_heads=1, mlp_dim=64, img_size=8,
                                patch_size=4, num_classes=3)
    return perturb_(model)  # no all-zero head (that is a warning of its own)


def _ours(d: Path) -> Path:
    return save_weights(tiny_model(), d / "model.safetensors", {"note": "fuzz"})


def _npz(d: Path) -> Path:  # vit_jax's released names, from Google's own code (tests/fixtures/vit_jax)
    return Path(shutil.copy(FIXTURES / "vit_jax" / "vit_released.npz", d / "vit.npz"))


def _npz_ours(d: Path) -> Path:  # the .npz vitlab writes
    return save_weights(tiny_model(), d / "ours.npz")


def _big_vision(d: Path) -> Path:
    return Path(shutil.copy(FIXTURES / "big_vision" / "tok_sincos_scan.npz", d / "bv.npz"))


def _timm_zip(d: Path) -> Path:
    path = d / "timm.pth"
    torch.save(tiny_model().state_dict(), path)
    return path


def _timm_legacy(d: Path) -> Path:  # torch < 1.6's format: a bare pickle stream, not a zip
    path = d / "legacy.pth"
    torch.save({"model": tiny_model().state_dict()}, path, _use_new_zipfile_serialization=False)
    return path


def _hf_dir(d: Path) -> Path:
    model = tiny_model()
    model.preprocess = vit_jax(8)  # so the directory has a preprocessor_config.json
    path, _ = export(model, d / "hf", "hf")
    return path


def _hf_bin_dir(d: Path) -> Path:  # pytorch_model.bin + config.json + preprocessor_config.json
    src = _hf_dir(d)
    out = d / "hf_bin"
    out.mkdir()
    from safetensors.torch import load_file

    torch.save(load_file(str(src / "model.safetensors")), out / "pytorch_model.bin")
    for name in ("config.json", "preprocessor_config.json"):
        if (src / name).exists():
            shutil.copy(src / name, out / name)
    return out


def _torchvision(d: Path) -> Path:
    path, _ = export(tiny_model(), d / "tv.pth", "torchvision")
    return path


def _timm_with_config(d: Path) -> Path:  # a safetensors without our header + our config.json beside it
    sub = d / "beside"
    sub.mkdir()
    model = tiny_model()
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(sub / "weights.safetensors"))
    (sub / "config.json").write_text(json.dumps(model.cfg.to_dict()))
    return sub / "weights.safetensors"


BUILDERS: dict[str, Callable[[Path], Path]] = {
    "vitlab_safetensors": _ours,
    "vit_jax_npz": _npz,
    "vitlab_npz": _npz_ours,
    "big_vision_npz": _big_vision,
    "timm_pth_zip": _timm_zip,
    "legacy_pickle_pth": _timm_legacy,
    "hf_dir": _hf_dir,
    "hf_bin_dir": _hf_bin_dir,
    "torchvision_pth": _torchvision,
    "safetensors_config_beside": _timm_with_config,
}


def main_file(path: Path) -> Path:
    """The file of a checkpoint that holds the tensors (a directory's weights file)."""
    if path.is_dir():
        for name in ("model.safetensors", "pytorch_model.bin"):
            if (path / name).exists():
                return path / name
    return path


# Malformed files of every family, each a (name, writer) the CLI test runs every command on.
def bad_files(d: Path) -> dict[str, Path]:
    """About a dozen representative damaged checkpoints, one per failure family."""
    d.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}

    def put(name: str, data: bytes) -> None:
        (d / name).write_bytes(data)
        out[name] = d / name

    good = d / "good"
    good.mkdir(exist_ok=True)
    st = _ours(good).read_bytes()
    npz = _npz(good).read_bytes()
    pth = _timm_zip(good).read_bytes()
    legacy = _timm_legacy(good).read_bytes()
    put("text.npz", b"just some notes\nnot an archive\n")
    put("truncated.npz", npz[: len(npz) // 2])
    put("bitflip.npz", npz[:200] + bytes([npz[200] ^ 0xFF]) + npz[201:])
    put("truncated.safetensors", st[: len(st) // 3])
    put("badheader.safetensors", st[:8] + b"[" + st[9:])
    put("image.pth", b"\x89PNG\r\n\x1a\n" + bytes(64))
    put("recipe.pth", b"model:\n  name: ViT-B/16\n")
    put("truncated.pth", pth[: len(pth) // 2])
    put("truncated_legacy.pth", legacy[: len(legacy) // 2])
    put("empty.safetensors", b"")
    hf = _hf_dir(d / "hfsrc")
    (hf / "config.json").write_text('{"model_type": "vit", "hidden_size": ')
    out["hf_bad_config"] = hf
    return out
