"""Nothing that can run code is loaded: real malicious pickles (each would create a marker file when
unpickled) are refused with a message naming the file, and the marker is never created."""

import pickle

import numpy as np
import pytest
import torch

import vitlab
from vitlab.weights import UnsafeCheckpointError


class CreatesFile:
    """Unpickling this calls open(marker, "w"): a harmless stand-in for arbitrary code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def tiny():
    return vitlab.create_model("ViT-Ti/16", embed_dim=64, depth=1, num_heads=4, mlp_dim=128, img_size=16,
                               patch_size=8, num_classes=3)


def test_the_payload_really_runs_code_when_unpickled(tmp_path):
    """The control: an ordinary unpickler does run it, so the refusals below are meaningful."""
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"x": CreatesFile(marker)})
    pickle.loads(payload)["x"].close()  # the point of the test; it returns the file it opened
    assert marker.exists()


@pytest.mark.parametrize("how", ["torch.save", "raw pickle"])
def test_malicious_state_dict_is_refused(tmp_path, how):
    marker = tmp_path / "pwned"
    model = tiny()
    evil = {**model.state_dict(), "extra": CreatesFile(marker)}
    path = tmp_path / "model.pth"
    if how == "torch.save":
        torch.save(evil, path)
    else:
        path.write_bytes(pickle.dumps(evil))
    with pytest.raises(UnsafeCheckpointError, match=r"refusing to load .*model\.pth.*run code"):
        vitlab.load_weights(model, path)
    with pytest.raises(UnsafeCheckpointError):
        vitlab.load_model(path)
    assert not marker.exists()


def test_malicious_transformers_directory_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "vit"}')
    torch.save({"vit.embeddings.cls_token": torch.zeros(1, 1, 8), "x": CreatesFile(marker)}, d / "pytorch_model.bin")
    with pytest.raises(UnsafeCheckpointError, match=r"pytorch_model\.bin"):
        vitlab.load_model(d)
    assert not marker.exists()


def test_npz_with_pickled_objects_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "model.npz"
    obj = np.empty(1, dtype=object)
    obj[0] = CreatesFile(marker)
    np.savez(path, **{"embedding/kernel": np.zeros((8, 8, 3, 64), np.float32), "cls": obj})
    with pytest.raises(UnsafeCheckpointError, match=r"model\.npz.*pickled"):
        vitlab.load_model(path)
    assert not marker.exists()


def test_plain_state_dicts_still_load(tmp_path):
    model = tiny()
    torch.save({"model": model.state_dict(), "epoch": 1, "args": {"lr": 0.1}}, tmp_path / "ok.pth")
    assert vitlab.load_weights(tiny(), tmp_path / "ok.pth").ok
