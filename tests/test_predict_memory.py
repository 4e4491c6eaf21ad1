"""`vitlab predict` and `vitlab eval` hold a bounded number of images, whatever the number of files (issue 35).

Two kinds of check, both chosen to hold on a loaded CI machine and to fail for the pipelines they replace:

* Structural (exact, no timing, no memory readings): every image decoded is counted, and at each result handed out
  no more than one batch of decoded images is ahead of the results (the old `predict` decoded all N files, and ran
  one forward over all N, before its first result); the model only ever sees batches of at most `batch_size`; and
  `evaluate_checkpoint`'s forward runs without autograd (it used to keep every batch's graph: 17 GB for ViT-S/16 at
  batch 256).
* One measured check in subprocesses: the peak resident set (the kernel's `ru_maxrss` of each child, read by
  `os.wait4`) of `predict` over 600 images exceeds that over 60 by less than 64 MB, where a pipeline that holds
  all images (0.6 MB each at 224 px as float32, twice while stacking) or all their activations would add over
  300 MB. Memory use does not depend on the load, so the bound has a wide margin on both sides.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.data import images as images_mod
from vitlab.inference import evaluate as evaluate_mod
from vitlab.inference import predict as predict_mod

from .conftest import perturb_


def _tiny(tmp_path, img_size=32, classes=("a", "b")):
    model = perturb_(vitlab.create_model("ViT-Ti/16", embed_dim=32, depth=1, num_heads=2, mlp_dim=64,
                                         img_size=img_size, patch_size=16, num_classes=len(classes)))
    return vitlab.save_weights(model, tmp_path / "m.safetensors", {"classes": list(classes)})


def _images(root, n, size=(40, 30)):
    paths = []
    rng = np.random.default_rng(0)
    for i in range(n):
        d = root / ("a" if i % 2 == 0 else "b")
        d.mkdir(parents=True, exist_ok=True)
        p = d / f"{i:04d}.png"
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(p)
        paths.append(str(p))
    return paths


def test_predict_decodes_one_batch_ahead_of_its_results_and_forwards_bounded_batches(tmp_path, monkeypatch):
    ckpt = _tiny(tmp_path)
    paths = _images(tmp_path / "img", 23)
    decoded: list[str] = []
    real_decode = images_mod.decode_image
    monkeypatch.setattr(images_mod, "decode_image", lambda p, *a, **kw: decoded.append(p) or real_decode(p, *a, **kw))
    seen: list[int] = []
    real_load = predict_mod.load_model

    def load(checkpoint):
        model = real_load(checkpoint)
        model.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[0]))
        return model

    monkeypatch.setattr(predict_mod, "load_model", load)
    results = predict_mod.iter_predict(ckpt, paths, top_k=1, batch_size=5)
    assert decoded == []  # nothing decoded before the first result is asked for
    for n, r in enumerate(results, 1):
        assert r["image"] == paths[n - 1]
        assert len(decoded) - n < 5, (n, len(decoded))  # at most one batch decoded ahead of the results
    assert decoded == paths and seen == [5, 5, 5, 5, 3]
    # and the whole list is what it was when every image went through one forward pass
    one = vitlab.predict(ckpt, paths, top_k=2, batch_size=len(paths))
    many = vitlab.predict(ckpt, paths, top_k=2, batch_size=4)
    assert [r["image"] for r in one] == [r["image"] for r in many] == paths
    for a, b in zip(one, many, strict=True):
        assert [t["index"] for t in a["top"]] == [t["index"] for t in b["top"]]
        assert [t["prob"] for t in a["top"]] == pytest.approx([t["prob"] for t in b["top"]], abs=1e-5)


def test_predict_checks_every_path_before_classifying_any(tmp_path):
    ckpt = _tiny(tmp_path)
    paths = _images(tmp_path / "img", 3)
    with pytest.raises(vitlab.data.BadImageError, match=r"missing\.png: no such file"):
        vitlab.predict(ckpt, [*paths, str(tmp_path / "missing.png")], batch_size=1)
    with pytest.raises(ValueError, match="batch_size"):
        vitlab.predict(ckpt, paths, batch_size=0)


def test_cli_predict_batch_size_default_is_the_library_one(tmp_path, capsys):
    from vitlab.cli import build_parser, main

    args = build_parser().parse_args(["predict", "m.safetensors", "x.png"])
    assert args.batch_size == predict_mod.BATCH_SIZE  # spelled out in the CLI so that --help imports no torch
    args = build_parser().parse_args(["eval", "m.safetensors", "--data", "synthetic"])
    assert args.batch_size is None  # evaluate_checkpoint's per-device default
    ckpt = _tiny(tmp_path)
    paths = _images(tmp_path / "img", 3)
    assert main(["predict", str(ckpt), *paths, "--batch-size", "2", "--top-k", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(": ")[0] for ln in lines] == paths


def test_eval_runs_without_autograd_in_bounded_batches(tmp_path, monkeypatch):
    ckpt = _tiny(tmp_path)
    _images(tmp_path / "tree", 40)
    calls: list[tuple[int, bool]] = []
    real_load = evaluate_mod.load_model

    def load(checkpoint):
        model = real_load(checkpoint)
        model.register_forward_pre_hook(lambda m, args: calls.append((args[0].shape[0], torch.is_grad_enabled())))
        return model

    monkeypatch.setattr(evaluate_mod, "load_model", load)
    r = evaluate_mod.evaluate_checkpoint(str(ckpt), f"imagefolder:{tmp_path / 'tree'}", precision="fp32",
                                         device="cpu")
    assert r.num_samples == 40
    cpu = evaluate_mod.BATCH_SIZE["cpu"]
    assert [b for b, _ in calls] == [cpu] * (40 // cpu) + ([40 % cpu] if 40 % cpu else [])
    assert not any(grad for _, grad in calls)  # the forward kept no graph
    calls.clear()
    evaluate_mod.evaluate_checkpoint(str(ckpt), f"imagefolder:{tmp_path / 'tree'}", precision="fp32", device="cpu",
                                     batch_size=7)
    assert max(b for b, _ in calls) == 7 and not any(grad for _, grad in calls)


_CHILD = textwrap.dedent("""
    import sys, torch
    torch.set_num_threads(1)
    from vitlab.inference.predict import predict
    ckpt, folder, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    paths = [f"{folder}/{i:04d}.png" for i in range(n)]
    out = predict(ckpt, paths, top_k=1)
    assert len(out) == n
""")


def _peak_mb(*argv: str) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VITLAB_AUTOTUNE": "off"}
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, *argv], stderr=subprocess.PIPE, env=env)
    assert proc.stderr is not None
    with proc.stderr:
        err = proc.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, err[-3000:]
    return usage.ru_maxrss / 1024  # KiB on Linux


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss in KiB and os.wait4: Linux")
def test_predict_peak_memory_does_not_grow_with_the_number_of_images(tmp_path):
    """60 vs 600 images at 224 px through a one-block model: the peak resident set grows by < 64 MB (a pipeline
    holding all images would add > 300 MB: 540 more images x 0.6 MB, held twice while stacking)."""
    model = perturb_(vitlab.create_model("ViT-Ti/16", depth=1, num_classes=2))  # 224 px: 0.6 MB per image
    ckpt = vitlab.save_weights(model, tmp_path / "m.safetensors", {"classes": ["a", "b"]})
    folder = tmp_path / "img"
    folder.mkdir()
    tile = Image.fromarray(np.random.default_rng(0).integers(0, 256, (24, 32, 3), dtype=np.uint8))
    for i in range(600):
        tile.save(folder / f"{i:04d}.png")  # small files, resized to 224 px: cheap to decode
    small, large = _peak_mb(str(ckpt), str(folder), "60"), _peak_mb(str(ckpt), str(folder), "600")
    assert large - small < 64, f"peak RSS {small:.0f} MB for 60 images, {large:.0f} MB for 600"
