"""Library manners: analysis uses only the model's public API; no library module touches matplotlib's global
state (backend, pyplot) or prints; the bench's timer is public and measures what it says."""

import ast
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import vitlab
import vitlab.models.vit
from vitlab.analysis import extract_features, iter_attention
from vitlab.analysis.report import analyze
from vitlab.bench.timing import time_calls
from vitlab.models.vit import VisionTransformer

from .conftest import perturb_

SRC = Path(vitlab.__file__).parent
TINY = dict(depth=2, img_size=32, patch_size=8, num_classes=10)


# -- analysis reads the model through its public API ------------------------------------------------------------
def _public_only(cls: type[VisionTransformer]) -> type[VisionTransformer]:
    """A subclass whose private methods raise when called from anywhere but model.py itself, and whose
    `_pos_embed` (the private method analysis used to call) always raises."""
    model_file = vitlab.models.vit.__file__

    def guard(name, fn):
        def wrapper(self, *args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if caller != model_file:
                raise AssertionError(f"private VisionTransformer.{name} called from {caller}")
            return fn(self, *args, **kwargs)

        return wrapper

    def _pos_embed(self, *args, **kwargs):
        raise AssertionError("private VisionTransformer._pos_embed called")

    private = {n: guard(n, v) for n, v in vars(cls).items() if n.startswith("_") and not n.startswith("__")
               and callable(v)}
    return type("PublicOnly", (cls,), {**private, "_pos_embed": _pos_embed})


def test_analysis_uses_only_the_public_model_api():
    PublicOnly = _public_only(VisionTransformer)
    model = perturb_(PublicOnly(vitlab.ViTConfig.from_name("ViT-Ti/16", **TINY))).eval()
    x = torch.randn(3, 3, 32, 32)
    with pytest.raises(AssertionError, match="private"):  # the guard is live
        model._run_block(model.blocks[0], torch.zeros(1, 17, 192), False)
    with pytest.raises(AssertionError, match="_pos_embed"):
        model._pos_embed(torch.zeros(1, 16, 192), (4, 4))

    result = analyze(model, x, batch_size=2, layer_maps=[-1])  # filters, pos-emb grid, attention walk
    assert result.attention.layer_maps[1].shape == (3, 3, 4, 4) and result.filters is not None
    assert extract_features(model, [(x, torch.zeros(3))])[0].shape == (3, 192)
    plain = VisionTransformer(model.cfg).eval()
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        _, maps = plain.forward_attention(x)
    for i, attn in iter_attention(model, x):
        torch.testing.assert_close(attn, maps[i])


def test_embed_is_eq1_and_the_layer_walk_gives_the_logits():
    model = perturb_(vitlab.create_model("ViT-Ti/16", **TINY)).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        z, grid = model.embed(x)
        assert grid == (4, 4) and z.shape == (2, 17, 192)
        patches = model.patch_embed.proj(x).flatten(2).transpose(1, 2)  # (B, N, D): x_p E
        expected = torch.cat([model.cls_token.expand(2, -1, -1), patches], 1) + model.pos_embed  # Eq. 1
        torch.testing.assert_close(z, expected)
        for block in model.blocks:
            z, _ = block(z)
        torch.testing.assert_close(model.forward_head(model.norm(z)), model(x))
    assert model.layer_indices([0, -1]) == {0, 1}
    with pytest.raises(ValueError, match="out of range"):
        model.layer_indices([2])


# -- matplotlib: Figures only, the caller's backend untouched -----------------------------------------------------
def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            yield node, f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None), f


def test_no_library_module_sets_the_backend_or_imports_pyplot():
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [f"{node.module}.{a.name}" for a in node.names]
            if any("pyplot" in n for n in names):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno} imports pyplot")
        for node, name, f in _calls(tree):
            if name == "use" and isinstance(f, ast.Attribute) and getattr(f.value, "id", "") == "matplotlib":
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno} calls matplotlib.use")
    assert not offenders, offenders


@pytest.mark.slow
def test_drawing_keeps_the_callers_matplotlib_backend(tmp_path):
    """Import and draw with every plotting module (analysis report, bench chart, training curves) in a process
    whose backend is SVG: the backend stays SVG and pyplot is never imported."""
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        import matplotlib
        import torch
        import vitlab, vitlab.analysis
        from vitlab.analysis.report import analyze, write_report
        from vitlab.bench import Result, plot_results
        from vitlab.train.report import plot_curves
        assert matplotlib.get_backend() == "svg", matplotlib.get_backend()
        out = Path({str(tmp_path)!r})
        model = vitlab.create_model("ViT-Ti/16", depth=2, img_size=32, patch_size=8, num_classes=10).eval()
        write_report(analyze(model, torch.randn(2, 3, 32, 32)), out / "analysis")
        r = Result("infer", "ours", "fp32", 2, [0.1, 0.2], 1e9, 1e11).summary()
        plot_results({{"results": [r], "config": {{"model": "ViT-Ti/16", "img_size": 32}},
                      "machine": {{"cpu": "cpu"}}}}).savefig(out / "bench.png")
        rows = [{{"split": "train", "step": i, "loss": 1.0 / (i + 1), "lr": 0.1}} for i in range(3)]
        plot_curves(rows + [{{"split": "eval", "step": 2, "loss": 0.5, "top1": 0.5}}], out / "curves.png")
        assert matplotlib.get_backend() == "svg", matplotlib.get_backend()
        assert "matplotlib.pyplot" not in sys.modules
        print("ok")
    """)
    env = {**os.environ, "MPLBACKEND": "svg", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    assert {p.name for p in tmp_path.iterdir()} == {"analysis", "bench.png", "curves.png"}


# -- no print() in library code -----------------------------------------------------------------------------------
def test_library_code_logs_instead_of_printing():
    """print() only in the command line (vitlab/cli/) and in scripts' `main()`; the library logs to `vitlab.*`."""
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if rel.parts[0] == "cli":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        mains = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "main"]
        allowed = {id(c) for m in mains for c in ast.walk(m)}
        offenders += [f"{rel}:{node.lineno}" for node, name, f in _calls(tree)
                      if name == "print" and isinstance(f, ast.Name) and id(node) not in allowed]
    assert not offenders, offenders


# -- the public timer --------------------------------------------------------------------------------------------
def test_time_calls_times_each_round_after_the_warmup():
    calls = []

    def fn():
        calls.append(time.perf_counter())
        time.sleep(0.004)

    seconds = time_calls(fn, warmup=2, rounds=3, iters=2)
    assert len(calls) == 2 + 3 * 2 and len(seconds) == 3
    assert all(0.004 <= s < 1.0 for s in seconds)  # seconds per call, not per round
    for bad in (dict(rounds=0), dict(iters=0), dict(warmup=-1)):
        with pytest.raises(ValueError):
            time_calls(fn, **bad)
