"""Property-based fuzzing of every checkpoint reader: a damaged file either loads (and the model then runs) or
raises `WeightsError` (or a subclass); never a parser's own exception (BadZipFile, EOFError, KeyError,
UnicodeDecodeError, zlib.error, ...) and never a traceback from inside vitlab.

Each format starts from a real small checkpoint (tests/weights_corpus.py); hypothesis truncates it, flips bits,
overwrites or inserts bytes (often in the header, where the parsers branch), or damages the config.json /
preprocessor_config.json beside it. Budgets are small (the whole file runs in seconds); the properties are the
same at any budget.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vitlab
from vitlab.weights import WeightsError, WeightsWarning

from .weights_corpus import BUILDERS, main_file

FUZZ = settings(max_examples=30, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("corpus")
    out = {}
    for name, build in BUILDERS.items():
        (root / name).mkdir()
        out[name] = build(root / name)
    return out


def loads_or_weights_error(path: Path) -> None:
    """The property: a model that runs, or a WeightsError naming the file."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WeightsWarning)  # dropped pre-logits etc.: legitimate outcomes
        try:
            model = vitlab.load_model(path)
        except WeightsError as e:
            names = {path.name, path.parent.name} | ({p.name for p in path.iterdir()} if path.is_dir() else set())
            assert any(n in str(e) for n in names), f"the message does not name the file: {e}"
            return
    with torch.no_grad():
        out = model(torch.zeros(1, model.cfg.in_chans, *model.cfg.img_hw))
    assert out.shape[0] == 1


# A mutation: (kind, position as a fraction of the file, bytes)
MUTATION = st.tuples(
    st.sampled_from(["truncate", "flip", "overwrite", "insert", "header_flip"]),
    st.floats(0, 1, allow_nan=False),
    st.binary(min_size=1, max_size=16),
)


def mutate(data: bytes, mutation: tuple[str, float, bytes]) -> bytes:
    kind, where, junk = mutation
    n = len(data)
    i = min(int(where * n), n - 1)
    if kind == "truncate":
        return data[:i]
    if kind == "flip":
        return data[:i] + bytes([data[i] ^ (1 << (junk[0] % 8))]) + data[i + 1:]
    if kind == "header_flip":  # where every parser branches: magic, lengths, zip local headers, pickle opcodes
        i = min(int(where * 600), n - 1)
        return data[:i] + bytes([data[i] ^ junk[0] or 1]) + data[i + 1:]
    if kind == "overwrite":
        return data[:i] + junk + data[i + len(junk):]
    return data[:i] + junk + data[i:]


@pytest.mark.parametrize("fmt", sorted(BUILDERS))
def test_the_undamaged_checkpoint_loads(corpus, fmt):
    """The control: each starting file is a real checkpoint that loads. A bare state dict does not store the heads
    of its width-64 ViT (no variant of the table has that width): they are refused unless passed."""
    bare = fmt in ("timm_pth_zip", "legacy_pickle_pth", "torchvision_pth")
    if bare:
        with pytest.raises(vitlab.weights.WeightsError, match="pass num_heads="):
            vitlab.load_model(corpus[fmt])
    model = vitlab.load_model(corpus[fmt], **({"num_heads": 1} if bare else {}))
    with torch.no_grad():
        assert model(torch.zeros(1, 3, *model.cfg.img_hw)).shape == (1, model.cfg.num_classes)


def fuzz_file(path, file):
    """Damage `file` (part of the checkpoint at `path`) in many ways; each must load or raise WeightsError."""
    original = file.read_bytes()

    @FUZZ
    @given(mutation=MUTATION)
    def check(mutation):
        file.write_bytes(mutate(original, mutation))
        try:
            loads_or_weights_error(path)
        finally:
            file.write_bytes(original)

    check()


def fuzz_tensors(tensors, file, write):
    """Edit the tensors (shapes, ranks, names) in many ways, `write` each edit to `file`; each must load or raise
    WeightsError."""

    @FUZZ
    @given(edits=TENSOR_EDIT)
    def check(edits):
        edited = edit(tensors, edits)
        if not edited:
            return
        write(edited)
        loads_or_weights_error(file)

    check()


@pytest.mark.parametrize("fmt", sorted(BUILDERS))
def test_damaged_weights_file(corpus, fmt):
    path = corpus[fmt]
    fuzz_file(path, main_file(path))


@pytest.mark.parametrize(("fmt", "side"), [
    ("hf_dir", "config.json"), ("hf_dir", "preprocessor_config.json"), ("hf_bin_dir", "config.json"),
    ("hf_bin_dir", "preprocessor_config.json"), ("safetensors_config_beside", "config.json")])
def test_damaged_config_beside(corpus, fmt, side):
    path = corpus[fmt]
    file = (path if path.is_dir() else path.parent) / side
    assert file.exists()
    fuzz_file(path, file)


MAGICS = [b"", b"PK\x03\x04", b"\x80\x02", b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19.", b"\x93NUMPY\x01\x00",
          b"\x10\x00\x00\x00\x00\x00\x00\x00{", b"\x89PNG\r\n\x1a\n", b"{", b"model:\n"]


@pytest.mark.parametrize("suffix", [".npz", ".pth", ".bin", ".pt", ".safetensors", ".ckpt"])
def test_random_bytes_with_each_suffix(tmp_path, suffix):
    file = tmp_path / f"weights{suffix}"

    @settings(max_examples=30, deadline=None, database=None, derandomize=True)
    @given(prefix=st.sampled_from(MAGICS), body=st.binary(max_size=300))
    def check(prefix, body):
        file.write_bytes(prefix + body)
        loads_or_weights_error(file)

    check()


# -- well-formed files holding the wrong tensors: what a parser accepts, our converters must still refuse ---------

TENSOR_EDIT = st.lists(st.tuples(
    st.sampled_from(["drop", "flatten", "add_dim", "dtype", "empty", "rename"]),
    st.integers(0, 10**6),
    st.sampled_from(["int64", "bool", "float16", "bfloat16", "float64", "uint8"]),
), min_size=1, max_size=3)


def edit(state: dict, edits: list) -> dict:
    state = dict(state)
    for op, pick, dtype in edits:
        if not state:
            break
        k = sorted(state)[pick % len(state)]
        if op == "drop":
            del state[k]
        elif op == "flatten":
            state[k] = state[k].reshape(-1)
        elif op == "add_dim":
            state[k] = state[k][None]
        elif op == "dtype":
            state[k] = state[k].astype(dtype) if hasattr(state[k], "astype") and dtype != "bfloat16" else \
                torch.as_tensor(state[k]).to(getattr(torch, dtype))
        elif op == "empty":
            state[k] = state[k].reshape(-1)[:0]
        else:
            state[k.replace("0", "7", 1) if "0" in k else k + "x"] = state.pop(k)
    return state


@pytest.mark.parametrize("layout", ["timm", "hf", "torchvision"])
def test_wrong_tensors_in_a_valid_safetensors(tmp_path, layout):
    """Before: KeyError / IndexError / ValueError from infer_config, RuntimeError from torch.cat in hf.to_ours."""
    from safetensors.torch import save_file

    from vitlab.weights import hf, torchvision

    from .weights_corpus import tiny_model

    model = tiny_model()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if layout == "hf":
        state = hf.from_ours(state, model.cfg)[0]
    elif layout == "torchvision":
        state = torchvision.from_ours(state, model.cfg)[0]
    file = tmp_path / "w.safetensors"
    fuzz_tensors(state, file, lambda edited: save_file({k: v.contiguous() for k, v in edited.items()}, str(file)))


@pytest.mark.parametrize("fixture", ["vit_jax/vit_released.npz", "vit_jax/hybrid_released.npz",
                                     "big_vision/tok_sincos_scan.npz", "big_vision/gap_learn.npz"])
def test_wrong_arrays_in_a_valid_npz(tmp_path, fixture):
    """Before: IndexError / ValueError from the layout reshapes and np.concatenate in npz.to_ours."""
    import numpy as np

    from .weights_corpus import FIXTURES

    with np.load(FIXTURES / fixture) as f:
        arrays = {k: f[k] for k in f.files}
    file = tmp_path / "w.npz"
    fuzz_tensors(arrays, file, lambda edited: np.savez(
        file, **{k: np.asarray(v.float() if isinstance(v, torch.Tensor) else v) for k, v in edited.items()}))



def test_damaged_save_pretrained_folder(tmp_path):
    """`from_pretrained` on a vitlab Hub folder whose config.json is damaged: a model or a WeightsError.
    Before: UnicodeDecodeError for a config.json that is not text."""
    from .weights_corpus import tiny_model

    folder = tmp_path / "repo"
    vitlab.weights.save_pretrained(tiny_model(), folder)
    file = folder / "config.json"
    original = file.read_bytes()

    @FUZZ
    @given(mutation=MUTATION)
    def check(mutation):
        file.write_bytes(mutate(original, mutation))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", WeightsWarning)
            try:
                model = vitlab.weights.from_pretrained(folder)
            except WeightsError as e:
                assert "repo" in str(e)
                return
        with torch.no_grad():
            model(torch.zeros(1, model.cfg.in_chans, *model.cfg.img_hw))

    try:
        check()
    finally:
        file.write_bytes(original)
