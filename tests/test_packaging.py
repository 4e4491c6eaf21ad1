"""Packaging: the wheel holds what the package reads at run time, a fresh venv holding only the wheel (its
dependencies borrowed from this interpreter) runs `vitlab models` and `vitlab demo`, optional dependencies
fail with the extra that installs them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

import vitlab
from vitlab.train import recipes
from vitlab.utils import extras as _extras
from vitlab.utils.extras import MissingExtraError, needs, require

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _run(cmd: list, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=600, **kw)
    assert r.returncode == 0, f"{cmd} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """`pip wheel` of a copy of the checkout (so the build leaves nothing in it), offline, this env's setuptools."""
    tmp = tmp_path_factory.mktemp("wheel")
    tree = tmp / "tree"
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, tree / name)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
          "-w", tmp / "dist", tree])
    (whl,) = (tmp / "dist").glob("vitlab-*.whl")
    return whl


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A new venv with the wheel installed (no pip of its own: this pip installs into it with --python).

    Its dependencies come from this interpreter's site-packages, listed by a .pth file after the venv's own
    (a plain path line: that folder's own .pth files, an editable vitlab among them, are not run)."""
    env_dir = tmp_path_factory.mktemp("venv") / "env"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    purelib = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    Path(purelib, "zz_test_dependencies.pth").write_text("".join(f"{d}\n" for d in deps))
    _run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", "--no-index", wheel])
    return env_dir


def test_wheel_holds_the_package_data(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    wanted = {"vitlab/py.typed", "vitlab/weights/registry.json", "vitlab/weights/timm_arch_table.json",
              "vitlab/data/imagenet_classes.txt",
              *(f"vitlab/configs/{name}.yaml" for name in recipes.names())}
    assert wanted <= names, sorted(wanted - names)
    assert len(recipes.names()) >= 10
    assert not any(n.startswith(("tests/", "configs/", "benchmarks/")) for n in names)
    assert f"\nVersion: {vitlab.__version__}\n" in meta  # one version string: pyproject reads vitlab.__version__
    extras = {line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Provides-Extra:")}
    assert {"train", "analysis", "export", "data", "bench", "paper", "all", "test"} <= extras


def test_checkout_configs_is_the_shipped_recipes():
    """configs/ (where users copy from, and `vitlab train configs/x.yaml` reads) is the package's folder."""
    assert (ROOT / "configs").resolve() == (ROOT / "src" / "vitlab" / "configs").resolve()
    assert sorted(p.stem for p in (ROOT / "configs").glob("*.yaml")) == recipes.names()


def test_recipes_accessor():
    assert "fmnist_pretrain" in recipes.names() and "fmnist_finetune" in recipes.names()
    p = recipes.path("fmnist_pretrain")
    assert p == recipes.path("fmnist_pretrain.yaml") and p.is_file() and p.parent == recipes.directory()
    assert recipes.read("fmnist_pretrain") == p.read_text(encoding="utf-8")
    with pytest.raises(FileNotFoundError, match="fmnist_pretrain"):  # the message lists the recipes there are
        recipes.path("no_such_recipe")


def test_installed_wheel_is_what_runs(installed, tmp_path):
    out = _run([installed / "bin" / "python", "-c", "import vitlab, vitlab.train.recipes as r; "
                "print(vitlab.__file__); print(r.path('fmnist_pretrain')); print(vitlab.__version__)"],
               cwd=tmp_path).stdout.split()
    assert Path(out[0]).is_relative_to(installed), out  # not the checkout's src/
    assert Path(out[1]).is_relative_to(installed), out
    assert out[2] == vitlab.__version__


def test_installed_wheel_runs_models(installed, tmp_path):
    r = _run([installed / "bin" / "vitlab", "models"], cwd=tmp_path)
    assert "ViT-B/16" in r.stdout


@pytest.mark.slow
def test_installed_wheel_runs_the_demo(installed, tmp_path):
    """The shipped recipes from the installed package, 2 steps each, on the synthetic data set (~20 s)."""
    out = tmp_path / "demo"
    _run([installed / "bin" / "vitlab", "demo", "-o", out, "--no-progress", "--threads", "1", "--set",
          "train.steps=2", "train.time_budget_min=null", "train.batch_size=32", "data.dataset=synthetic",
          "data.num_samples=1200"], cwd=tmp_path)
    summary = json.loads((out / "demo.json").read_text())
    assert summary["pretrain"]["steps"] == 2 and summary["finetune"]["steps"] == 2
    assert (out / "report.html").is_file() and (out / "finetune" / "model.safetensors").is_file()


# -- extras ---------------------------------------------------------------------------------------------


def test_extras_table_matches_pyproject():
    declared = PYPROJECT["project"]["optional-dependencies"]

    def modules(extra: str) -> set[str]:
        out = set()
        for req in declared[extra]:
            name = req.split(">")[0].split("=")[0].split("[")[0].strip()
            module = name.lower().replace("-", "_")
            out |= modules_of_all(req) if name == "vitlab" else {_extras.IMPORT_NAMES.get(module, module)}
        return out

    def modules_of_all(req: str) -> set[str]:
        inner = req[req.index("[") + 1 : req.index("]")].split(",")
        return set().union(*(modules(e) for e in inner))

    for extra, mods in _extras.EXTRAS.items():
        assert modules(extra) == set(mods), extra
    assert modules("all") == set().union(*_extras.EXTRAS.values())
    core = {req.split(">")[0].strip().lower() for req in PYPROJECT["project"]["dependencies"]}
    assert not core & set().union(*_extras.EXTRAS.values()), "a module is both core and optional"


def test_core_runs_without_the_extras(tmp_path):
    """What the core install promises (model, weights, preprocessing, recipes), with every optional module
    unimportable, in a fresh interpreter."""
    optional = sorted(set().union(*_extras.EXTRAS.values()))
    code = f"""
import sys
for name in {optional!r}:
    sys.modules[name] = None
import torch, vitlab
from vitlab.data import transforms_for
from vitlab.train.recipe import load_recipe
model = vitlab.create_model("ViT-Ti/16", img_size=32, depth=1, num_classes=3)
vitlab.save_weights(model, "m.safetensors")
loaded = vitlab.load_model("m.safetensors")
x = transforms_for(loaded)(torch.zeros(3, 40, 40, dtype=torch.uint8))
assert loaded.eval()(x[None]).shape == (1, 3)
load_recipe(vitlab.train.recipes.path("fmnist_pretrain"))
assert not [m for m in {optional!r} if sys.modules.get(m) is not None]
"""
    _run([sys.executable, "-c", code], cwd=tmp_path)


def _pins(path: Path) -> dict[str, str]:
    lines = [ln.split("#")[0].strip() for ln in path.read_text().splitlines()]
    return {_norm(n): v for n, v in (ln.split("==") for ln in lines if ln)}


def _norm(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def test_every_floor_is_a_tested_version():
    """Each `>=` floor in pyproject is what `make floors` installs (requirements-floor.txt) or, for what that
    venv borrows from .venv (torch, torchvision, the ONNX packages, the linters), the lock's own version."""
    floor, lock = _pins(ROOT / "requirements-floor.txt"), _pins(ROOT / "requirements-lock.txt")
    reqs = list(PYPROJECT["project"]["dependencies"])
    reqs += [r for extra in PYPROJECT["project"]["optional-dependencies"].values() for r in extra]
    seen = set()
    for req in (r for r in reqs if not r.startswith("vitlab[")):  # vitlab[all]: the extras themselves
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(?:>=|==)\s*([0-9.]+)", req)
        assert m, f"{req}: every dependency states its floor"
        name, version = m.groups()
        tested = floor.get(_norm(name), lock.get(_norm(name)))
        assert tested == version, f"{req}: tested {tested}"
        seen.add(_norm(name))
    assert set(floor) <= seen, f"pinned in requirements-floor.txt but no floor: {sorted(set(floor) - seen)}"


def _hide(monkeypatch, top: str) -> None:
    """Make `top` (and its submodules) unimportable, as when it is not installed."""
    for name in [n for n in sys.modules if n == top or n.startswith(top + ".")] + [top]:
        monkeypatch.setitem(sys.modules, name, None)


def test_require_names_the_extra(monkeypatch):
    _hide(monkeypatch, "matplotlib")
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'vitlab\[analysis\]'") as e:
        require("matplotlib.figure", "analysis", "the analysis figures")
    assert isinstance(e.value, MissingExtraError) and e.value.name == "matplotlib" and e.value.extra == "analysis"
    assert "the analysis figures needs 'matplotlib'" in str(e.value)
    with pytest.raises(ModuleNotFoundError) as e, needs("analysis"):  # another missing module: not the extra's
        import vitlab_no_such_module  # noqa: F401
    assert not isinstance(e.value, MissingExtraError)
    with pytest.raises(ValueError, match="unknown extra"):
        require("matplotlib", "plots")


def test_training_curves_without_matplotlib(monkeypatch, tmp_path):
    from vitlab.train.report import plot_curves

    _hide(monkeypatch, "matplotlib")
    rows = [{"split": "train", "step": 1, "loss": 1.0, "lr": 0.1}]
    with pytest.raises(MissingExtraError, match=r"pip install 'vitlab\[train\]'"):
        plot_curves(rows, tmp_path / "curves.png")


def test_training_without_tensorboard(monkeypatch, tmp_path):
    from vitlab.train import load_recipe, train

    recipe = load_recipe(recipes.path("fmnist_pretrain"), ["train.steps=1", "train.batch_size=8",
                                                           "data.dataset=synthetic", "data.num_samples=120"])
    _hide(monkeypatch, "tensorboard")
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    with pytest.raises(MissingExtraError, match=r"pip install 'vitlab\[train\]'"):
        train(recipe, tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # it failed before opening its outputs


def test_webdataset_without_webdataset(monkeypatch, tmp_path):
    from vitlab.data import DataConfig, build_train_stream

    _hide(monkeypatch, "webdataset")
    monkeypatch.delitem(sys.modules, "vitlab.data.webds", raising=False)
    cfg = DataConfig(dataset="webdataset", root=str(tmp_path / "shard-{000..001}.tar"))
    with pytest.raises(MissingExtraError, match=r"pip install 'vitlab\[data\]'"):
        build_train_stream(cfg, img_size=32, in_chans=3, batch_size=4, seed=0)


def test_export_without_onnxscript_writes_nothing(monkeypatch, tmp_path):
    from vitlab.deploy.export import export_onnx

    model = vitlab.create_model("ViT-Ti/16", img_size=32, depth=1, num_classes=3)
    _hide(monkeypatch, "onnxscript")
    with pytest.raises(MissingExtraError, match=r"pip install 'vitlab\[export\]'"):
        export_onnx(model, tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []  # it failed before writing anything
