"""The loaders' errors: one type (`WeightsError`) for every bad checkpoint, naming the file and what it actually
is; `UnsafeCheckpointError` only for a pickle that asks to run code; a config that disagrees with the tensors
refused before the model is allocated."""

from __future__ import annotations

import json
import pickle
import struct
import zipfile

import numpy as np
import pytest
import torch

import vitlab
from vitlab.weights import ShapeMismatchError, UnsafeCheckpointError, WeightsError
from vitlab.weights.safety import sniff

from .weights_corpus import _hf_dir, _npz, _timm_with_config, _timm_zip, tiny_model

# What a file named like a checkpoint may really be -> the words the error must use.
NOT_CHECKPOINTS = {
    "text": (b"these are my notes\nnot weights\n", r"looks like a text file \(first line: 'these are my notes'\)"),
    "yaml": (b"model:\n  name: ViT-B/16\n", r"looks like a YAML text file \(first line: 'model:'\)"),
    "json": (b'{"model_type": "vit"}', r"looks like a JSON text file"),
    "html": (b"<!DOCTYPE html><html><body>404</body></html>", r"looks like an HTML page"),
    "png": (b"\x89PNG\r\n\x1a\n" + bytes(40), r"looks like a PNG image"),
    "jpeg": (b"\xff\xd8\xff\xe0" + bytes(40), r"looks like a JPEG image"),
    "gif": (b"GIF89a" + bytes(40), r"looks like a GIF image"),
    "gzip": (b"\x1f\x8b\x08\x00" + bytes(40), r"looks like a gzip-compressed file"),
    "empty": (b"", r"looks like an empty file"),
    "binary": (bytes(range(7, 40)) + b"\x00", r"looks like no known format \(first bytes: 07 08"),
}


def _tar_bytes(tmp_path):
    import tarfile

    (tmp_path / "member.txt").write_text("x")
    with tarfile.open(tmp_path / "t.tar", "w") as t:
        t.add(tmp_path / "member.txt", "member.txt")
    return (tmp_path / "t.tar").read_bytes()


@pytest.mark.parametrize("what", sorted(NOT_CHECKPOINTS))
@pytest.mark.parametrize("suffix", [".npz", ".pth", ".bin", ".safetensors"])
def test_a_file_that_is_not_a_checkpoint_is_named_for_what_it_is(tmp_path, what, suffix):
    """Before: a text or YAML file named .pth was "a pickle that asks to run code" (UnsafeCheckpointError), a
    text .npz gave numpy's "Failed to interpret file ... as a pickle"; a PNG .safetensors safetensors' header
    error. Now each says what the file looks like, and none is called unsafe."""
    data, words = NOT_CHECKPOINTS[what]
    path = tmp_path / f"weights{suffix}"
    path.write_bytes(data)
    with pytest.raises(WeightsError, match=rf"weights\{suffix}: not a .*{words}") as info:
        vitlab.load_model(path)
    assert not isinstance(info.value, UnsafeCheckpointError)
    with pytest.raises(WeightsError, match=words):
        vitlab.load_weights(tiny_model(), path)
    with pytest.raises(WeightsError, match=words):
        vitlab.weights.read_config(path)


def test_archives_of_the_wrong_kind_are_named(tmp_path):
    """A tar (a WebDataset shard) given as a checkpoint, a PyTorch zip renamed .npz, an .npz renamed .pth, and a
    zip of images: each is named, not parsed as something it is not."""
    (tmp_path / "shard.pth").write_bytes(_tar_bytes(tmp_path))
    with pytest.raises(WeightsError, match=r"shard\.pth: not a PyTorch checkpoint: looks like a tar archive"):
        vitlab.load_model(tmp_path / "shard.pth")
    pth = _timm_zip(tmp_path)
    pth.rename(tmp_path / "renamed.npz")
    with pytest.raises(WeightsError, match=r"renamed\.npz: not a NumPy archive: looks like a PyTorch zip checkpoint"):
        vitlab.load_model(tmp_path / "renamed.npz")
    npz = _npz(tmp_path)
    npz.rename(tmp_path / "renamed.pth")
    with pytest.raises(WeightsError, match=r"renamed\.pth: not a PyTorch checkpoint: looks like a NumPy \.npz"):
        vitlab.load_model(tmp_path / "renamed.pth")
    with zipfile.ZipFile(tmp_path / "images.npz", "w") as z:
        z.writestr("a.png", b"\x89PNG")
    with pytest.raises(WeightsError, match=r"images\.npz: not a NumPy archive: looks like a zip archive of 1 file"):
        vitlab.load_model(tmp_path / "images.npz")
    np.save(tmp_path / "one.npy", np.zeros(3))
    (tmp_path / "one.npy").rename(tmp_path / "one.npz")
    with pytest.raises(WeightsError, match=r"one\.npz: not a NumPy archive: looks like a single NumPy \.npy array"):
        vitlab.load_model(tmp_path / "one.npz")


def test_sniff_recognises_the_real_formats(tmp_path):
    assert sniff(_npz(tmp_path)).name == "npz"
    assert sniff(_timm_zip(tmp_path)).name == "torch_zip"
    torch.save({"a": torch.zeros(1)}, tmp_path / "legacy.pth", _use_new_zipfile_serialization=False)
    assert sniff(tmp_path / "legacy.pth").description.startswith("a legacy PyTorch checkpoint")
    assert sniff(tiny_model_file(tmp_path)).name == "safetensors"
    (tmp_path / "p.pkl").write_bytes(pickle.dumps({"a": 1}))
    assert sniff(tmp_path / "p.pkl").name == "pickle"


def tiny_model_file(tmp_path):
    return vitlab.save_weights(tiny_model(), tmp_path / "m.safetensors")


def test_a_damaged_pickle_is_damaged_not_unsafe(tmp_path):
    """A pickle stream with a bad opcode is a damaged checkpoint; only a pickle naming a global to import or call
    is an UnsafeCheckpointError (tests/test_weights_safety.py)."""
    path = tmp_path / "bad.pth"
    path.write_bytes(b"\x80\x02}q\x00\xff\xff\xff")
    with pytest.raises(WeightsError, match=r"bad\.pth: damaged PyTorch checkpoint \(a pickle \(protocol 2\)\)") as e:
        vitlab.load_model(path)
    assert not isinstance(e.value, UnsafeCheckpointError)
    path.write_bytes(pickle.dumps({"x": print}, protocol=2))  # names builtins.print: would import it
    with pytest.raises(UnsafeCheckpointError, match=r"GLOBAL (builtins\.)?print"):
        vitlab.load_model(path)


@pytest.mark.parametrize("cut", [0.3, 0.6, 0.95])
def test_truncated_files_of_each_format_give_weights_error(tmp_path, cut):
    """Before: BadZipFile (.npz), EOFError / RuntimeError (.pth), KeyError / UnicodeDecodeError (legacy pickles)."""
    files = [_npz(tmp_path), _timm_zip(tmp_path), tiny_model_file(tmp_path)]
    torch.save(tiny_model().state_dict(), tmp_path / "legacy.pth", _use_new_zipfile_serialization=False)
    files.append(tmp_path / "legacy.pth")
    for f in files:
        data = f.read_bytes()
        f.write_bytes(data[: int(len(data) * cut)])
        with pytest.raises(WeightsError, match=f.name):
            vitlab.load_model(f)


def test_bad_json_in_our_header_is_a_weights_error(tmp_path):
    """Before: json.JSONDecodeError / ValueError("unknown ViTConfig field") escaped read_config and load_model."""
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in tiny_model().state_dict().items()}
    for bad in ('{"embed_dim": 64,', '{"embed_dimm": 64}', '[1, 2]', '{"embed_dim": "wide"}'):
        save_file(state, str(tmp_path / "h.safetensors"), metadata={"vitlab.config": bad})
        with pytest.raises(WeightsError, match=r"h\.safetensors: bad vitlab\.config in the header"):
            vitlab.load_model(tmp_path / "h.safetensors")
        with pytest.raises(WeightsError, match=r"vitlab\.config"):
            vitlab.weights.read_config(tmp_path / "h.safetensors")
    save_file(state, str(tmp_path / "m.safetensors"), metadata={"vitlab.config": json.dumps(tiny_model().cfg.to_dict()),
                                                                "vitlab.meta": "{oops"})
    with pytest.raises(WeightsError, match=r"bad vitlab\.meta"):
        vitlab.weights.read_metadata(tmp_path / "m.safetensors")


@pytest.mark.parametrize("side", ["config.json", "preprocessor_config.json"])
def test_a_binary_or_broken_json_beside_the_weights(tmp_path, side):
    """Before: UnicodeDecodeError from read_text for a config.json that is not text."""
    d = _hf_dir(tmp_path)
    if side == "preprocessor_config.json" and not (d / side).exists():
        (d / side).write_text("{}")
    (d / side).write_bytes(b"\x80\x81\x82 not utf-8")
    with pytest.raises(WeightsError, match=side.replace(".", r"\.")):
        vitlab.load_model(d)
    (d / side).write_text('{"model_type": "vit", "id2label": {"x": "cat"}}' if side == "config.json" else
                          '{"image_mean": 3, "image_std": "a"}')
    with pytest.raises(WeightsError, match=side.replace(".", r"\.")):
        vitlab.load_model(d)


def _no_big_allocation(monkeypatch, limit=10**7):
    """Fail the test if anything allocates a real (non-meta) tensor of more than `limit` elements."""
    real = torch.empty

    def empty(*size, **kw):
        shape = size[0] if len(size) == 1 and isinstance(size[0], tuple | list | torch.Size) else size
        n = int(np.prod([int(s) for s in shape])) if shape else 1
        kw["device"] = kw.get("device") or torch.get_default_device()  # what torch.device("meta") would fill in
        assert torch.device(kw["device"]).type == "meta" or n <= limit, f"allocated {n} elements: {shape}"
        return real(*size, **kw)

    monkeypatch.setattr(torch, "empty", empty)


@pytest.mark.parametrize("layout", ["hf", "beside"])
def test_a_config_claiming_width_131072_fails_before_allocating(tmp_path, monkeypatch, layout):
    """Before: the model was built from the config (width 131072: ~206 GB for a B/16-shaped depth) and only
    load_state_dict noticed the mismatch. Now the shapes are compared with the model on the meta device."""
    if layout == "hf":
        path = _hf_dir(tmp_path)
        cfg_file, field = path / "config.json", "hidden_size"
    else:
        path = _timm_with_config(tmp_path)
        cfg_file, field = path.parent / "config.json", "embed_dim"
    cfg = json.loads(cfg_file.read_text())
    cfg[field] = 131072
    cfg["num_heads" if layout == "beside" else "num_attention_heads"] = 2048
    cfg_file.write_text(json.dumps(cfg))
    _no_big_allocation(monkeypatch)
    with pytest.raises(ShapeMismatchError, match=rf"config\.json gives {field}=131072 .*patch_embed\.proj\.weight|"
                                                 rf"config\.json gives {field}=131072 .*blocks\.0"):
        vitlab.load_model(path)


def test_a_config_with_the_wrong_depth_or_mlp_names_the_field(tmp_path):
    path = _timm_with_config(tmp_path)
    cfg_file = path.parent / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg_file.write_text(json.dumps({**cfg, "depth": 12}))
    with pytest.raises(ShapeMismatchError, match=r"gives depth=12, but the checkpoint has 1 blocks"):
        vitlab.load_model(path)
    cfg_file.write_text(json.dumps({**cfg, "mlp_dim": 4096}))
    with pytest.raises(ShapeMismatchError, match=r"gives mlp_dim=4096 .*blocks\.0\.mlp\.fc1\.weight"):
        vitlab.load_model(path)


def test_an_absurd_model_is_refused_before_it_is_built(tmp_path, monkeypatch):
    """Overrides can ask for any size; a model larger than the machine's memory is a WeightsError naming the
    fields, not an allocation that takes the machine down."""
    path = tiny_model_file(tmp_path)
    _no_big_allocation(monkeypatch)
    monkeypatch.setattr("vitlab.weights.api._memory_bytes", lambda: 2**20)  # a 1 MiB machine
    with pytest.raises(WeightsError, match=r"gives a model of .*GiB of parameters \(embed_dim=64, depth=1, mlp_dim=64, "
                       r"num_classes=100000\), more than this machine's"):
        vitlab.load_model(path, num_classes=100_000)


def test_struct_header_of_safetensors_lying_about_its_length(tmp_path):
    path = tmp_path / "lie.safetensors"
    path.write_bytes(struct.pack("<Q", 2**40) + b"{}")
    with pytest.raises(WeightsError, match=r"lie\.safetensors"):
        vitlab.load_model(path)
