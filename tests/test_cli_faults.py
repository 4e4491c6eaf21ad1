"""Faults of the machine and of the command line, through `vitlab.cli.main` and the `vitlab` program: a full disk,
a read-only or unwritable output folder, `-o` naming a file, broken YAML in `--set`, Ctrl-C twice, and every
loading error of every command. Each gives exit code 1 (130 for Ctrl-C) and one line on stderr, never a
traceback, and leaves what the user had as it was (docs/reliability.md, "Faults")."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vitlab
from vitlab.cli import COMMANDS, main
from vitlab.utils import io as vio

from .conftest import perturb_

ROOT = Path(__file__).resolve().parents[1]
RECIPE = str(ROOT / "configs" / "fmnist_scratch.yaml")
TINY = ["model.embed_dim=32", "model.depth=1", "model.num_heads=2", "model.mlp_dim=64", "train.epochs=null",
        "train.time_budget_min=null", "train.evaluators.eval.max_samples=50", "train.evaluators.eval.every=0",
        "train.log_every=1",
        "data.dataset=synthetic"]
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    """A tiny checkpoint that reads the synthetic data (28 px, 1 channel, 10 classes) with its preprocessing."""
    model = perturb_(vitlab.create_model("ViT-Ti/16", depth=1, img_size=28, patch_size=4, in_chans=1, num_classes=10,
                                         embed_dim=32, num_heads=2, mlp_dim=64), scale=0.3)
    path = tmp_path_factory.mktemp("ckpt") / "tiny.safetensors"
    vitlab.save_weights(model, path)
    return str(path)


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("img") / "img.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (28, 28), dtype=np.uint8)).save(path)
    return str(path)


def _one_line_error(err: str, command: str, *needles: str) -> None:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("vitlab ")]
    assert len(lines) == 1 and lines[0].startswith(f"vitlab {command}: error: "), err
    for needle in needles:
        assert needle in lines[0], err


def _temps(root: Path) -> list[Path]:
    return [p for p in root.rglob(".tmp-*")]


# -- the commands that write, and where ----------------------------------------------------------------------------

# command -> (argv for output OUT, OUT is a folder); {ckpt}, {image} and {out} are filled in
WRITERS: dict[str, tuple[list[str], bool]] = {
    "train": ([RECIPE, "-o", "{out}", "--no-progress", "--set", *TINY, "train.steps=6", "train.checkpoint_every=2"],
              True),
    "analyze": (["{ckpt}", "--images", "{image}", "-o", "{out}", "--no-progress", "--force"], True),
    "fewshot": (["{ckpt}", "--data", "synthetic", "--shots", "1", "--seeds", "1", "--train-limit", "100",
                 "--test-limit", "20", "--no-progress", "-o", "{out}", "--force"], False),
    "export": (["{ckpt}", "{out}", "--no-verify", "--force"], False),
    "convert": (["{ckpt}", "{out}", "--force"], False),
    "weights get": (["{ckpt}", "-o", "{out}", "--no-progress"], True),
    "bench": (["--model", "ViT-Ti/16", "--img-size", "32", "--depth", "1", "--rounds", "1", "--warmup", "0",
               "--peak-size", "64", "--peers", "--modes", "--train-batch", "0", "--batch-sizes", "1", "--dtypes",
               "fp32", "--no-png", "-o", "{out}"], True),
    "demo": (["-o", "{out}", "--no-progress", "--set", *TINY, "train.steps=2", "train.checkpoint_every=0"], True),
}
SUFFIX = {"fewshot": ".json", "export": ".onnx", "convert": ".safetensors"}


def _argv(command: str, out: Path, ckpt: str, image: str) -> list[str]:
    template, _ = WRITERS[command]
    return [*command.split(), *(a.format(out=out, ckpt=ckpt, image=image) for a in template)]


def _out(command: str, folder: Path) -> Path:
    return folder / ("out" + SUFFIX.get(command, ""))


@contextlib.contextmanager
def _mounted_tmpfs(where: Path, options: str) -> Iterator[Path]:
    """A tmpfs at `where` (root only; skipped where mounting is not permitted), unmounted afterwards."""
    if not IS_ROOT:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode(errors='replace').strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def unwritable(tmp_path) -> Iterator[tuple[Path, str]]:
    """(folder, reason): a read-only tmpfs under root (which ignores permission bits), else a folder of mode 0555."""
    folder = tmp_path / "locked"
    if IS_ROOT:
        with _mounted_tmpfs(folder, "ro,size=64k") as f:
            yield f, "read-only file system"
        return
    folder.mkdir()
    folder.chmod(0o555)
    try:
        yield folder, "permission denied"
    finally:
        folder.chmod(0o755)


@pytest.mark.parametrize("command", list(WRITERS))
def test_an_unwritable_output_folder_is_refused_before_any_work(command, unwritable, ckpt, image, capsys):
    folder, reason = unwritable
    out = _out(command, folder / "sub")
    capsys.readouterr()
    assert main(_argv(command, out, ckpt, image)) == 1
    _one_line_error(capsys.readouterr().err, command, "cannot write ", reason)
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("command", list(WRITERS))
def test_an_output_path_through_a_file_is_one_line(command, tmp_path, ckpt, image, capsys):
    """`-o FILE` where a folder is written (train, analyze, ...), or `-o FILE/x` for any output."""
    afile = tmp_path / "afile"
    afile.write_text("mine")
    capsys.readouterr()
    _, is_folder = WRITERS[command]
    cases = [(afile, "it is a file, not a folder")] if is_folder else []
    cases.append((_out(command, afile), f"{afile} is a file, not a folder"))
    for out, reason in cases:
        assert main(_argv(command, out, ckpt, image)) == 1
        _one_line_error(capsys.readouterr().err, command, f"cannot write {out}: {reason}")
    assert afile.read_text() == "mine"


def _fail_fsync(monkeypatch, when: Callable[[Path], bool] = lambda p: True) -> None:
    """Make the disk "fill up" as a finished temporary file is flushed (every atomic write fsyncs it)."""
    real = vio.fsync_path

    def full(path, *, directory=False):
        if not directory and when(Path(path)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, directory=directory)

    monkeypatch.setattr(vio, "fsync_path", full)


@pytest.mark.parametrize("command", list(WRITERS))
def test_a_full_disk_is_one_line_and_keeps_what_was_there(command, tmp_path, ckpt, image, capsys, monkeypatch):
    from vitlab.train import checkpoint

    out = _out(command, tmp_path / "o")
    _, is_folder = WRITERS[command]
    before: dict[Path, bytes] = {}
    if command in ("analyze", "bench"):  # an earlier report, replaced with --force (analyze) / always (bench)
        out.mkdir(parents=True)
        for name in ("report.html", "filters.png", "bench.json", "bench.txt"):
            (out / name).write_bytes(b"earlier " + name.encode())
    elif not is_folder:
        out.parent.mkdir(parents=True)
        out.write_bytes(b"the user's file")
    if out.is_dir():
        before = {p: p.read_bytes() for p in out.iterdir()}
    elif out.exists():
        before = {out: out.read_bytes()}
    # training: the checkpoint of step 4 finds the disk full; the one of step 2 must stay whole
    _fail_fsync(monkeypatch, (lambda p: "step_00000004" in p.name) if command == "train" else (lambda p: True))
    capsys.readouterr()
    assert main(_argv(command, out, ckpt, image)) == 1
    _one_line_error(capsys.readouterr().err, command, "cannot write ", ": no space left on device")
    assert {p: p.read_bytes() for p in before} == before
    assert _temps(tmp_path) == []
    if command == "train":
        ckpts = out / "checkpoints"
        assert checkpoint.list_checkpoints(ckpts) == [2]
        assert checkpoint.load_latest_checkpoint(ckpts).step == 2  # loads, no fallback warning (they are errors)


@pytest.mark.parametrize("fails", ["model.safetensors", "config.json"])
def test_a_full_disk_never_leaves_a_hub_folder_half_replaced(fails, tmp_path, ckpt, capsys, monkeypatch):
    """`convert --to hf --force` over an earlier folder: the weights and config.json are replaced together or not
    at all, wherever the disk fills up."""
    hub = tmp_path / "hf"
    assert main(["convert", ckpt, str(hub), "--to", "hf"]) == 0
    before = {p.name: p.read_bytes() for p in hub.iterdir()}
    other = perturb_(vitlab.create_model("ViT-Ti/16", depth=1, img_size=28, patch_size=4, in_chans=1,
                                         num_classes=10, embed_dim=32, num_heads=2, mlp_dim=64), seed=1)
    src = vitlab.save_weights(other, tmp_path / "other.safetensors")
    _fail_fsync(monkeypatch, lambda p: p.name.endswith(fails))
    capsys.readouterr()
    assert main(["convert", str(src), str(hub), "--to", "hf", "--force"]) == 1
    _one_line_error(capsys.readouterr().err, "convert", f"cannot write {hub / fails}: no space left on device")
    assert {p.name: p.read_bytes() for p in hub.iterdir()} == before and _temps(tmp_path) == []


@pytest.mark.parametrize("size", ["8k", "16k", "64k", "200k"])
def test_training_on_a_really_full_disk(size, tmp_path, capsys):
    """A real small file system (root: a tmpfs): whichever file meets the full disk (recipe, TensorBoard, metrics,
    either checkpoint file, which torch and safetensors report in their own words), one line names it."""
    with _mounted_tmpfs(tmp_path / "disk", f"size={size}") as disk:
        capsys.readouterr()
        rc = main(["train", RECIPE, "-o", str(disk / "run"), "--no-progress", "--set", *TINY, "train.steps=6",
                   "train.checkpoint_every=2"])
        err = capsys.readouterr().err
        assert rc == 1, err
        _one_line_error(err, "train", f"cannot write {disk / 'run'}", ": no space left on device")
        assert _temps(disk) == []


@pytest.mark.parametrize("dst", ["w.safetensors", "w.pth", "w.npz"])
def test_converting_onto_a_really_full_disk(dst, tmp_path, ckpt, capsys):
    """safetensors (Rust), torch.save (C++) and NumPy's zip writer each fail their own way on a full disk."""
    with _mounted_tmpfs(tmp_path / "disk", "size=16k") as disk:
        (disk / dst).write_bytes(b"earlier")
        capsys.readouterr()
        argv = ["convert", ckpt, str(disk / dst), "--force", *(["--to", "timm"] if dst.endswith(".pth") else [])]
        assert main(argv) == 1
        _one_line_error(capsys.readouterr().err, "convert", f"cannot write {disk / dst}: no space left on device")
        assert (disk / dst).read_bytes() == b"earlier" and _temps(disk) == []


def test_a_download_onto_a_really_full_disk(tmp_path, monkeypatch):
    """A download that fills the disk names its destination; the partial `.part` stays for a resume."""
    import functools
    import http.server
    import threading

    from vitlab.weights import download

    for var in ("VITLAB_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "served").mkdir()
    (tmp_path / "served" / "big.bin").write_bytes(b"w" * 200_000)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "served"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with _mounted_tmpfs(tmp_path / "disk", "size=64k") as disk:
            with pytest.raises(vio.OutputError, match=r"cannot write .*big\.bin: no space left on device"):
                download.download_url(f"http://127.0.0.1:{server.server_address[1]}/big.bin", disk / "big.bin",
                                      progress=False, retries=0)
            assert not (disk / "big.bin").exists()
    finally:
        server.shutdown()
        server.server_close()


def test_stdout_onto_a_really_full_disk(tmp_path):
    """`vitlab weights list --json > file` on a full disk: one line, exit 1 (not Python's exit-time complaint)."""
    with _mounted_tmpfs(tmp_path / "disk", "size=8k") as disk, open(disk / "list.json", "w") as out:
        proc = subprocess.run([sys.executable, "-m", "vitlab.cli", "weights", "list", "--json"], stdout=out,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    _one_line_error(proc.stderr, "weights list", "cannot write ", "no space left on device")
    assert "Exception ignored" not in proc.stderr


def test_atomic_write_removes_a_partial_file_and_names_the_disk(tmp_path):
    target = tmp_path / "model.bin"
    target.write_bytes(b"old")

    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with pytest.raises(vio.OutputError, match=r"cannot write .*model\.bin: no space left on device") as e:
        vio.write_atomic(target, _writes_then_raises(full), overwrite=True)
    assert e.value.errno == errno.ENOSPC and isinstance(e.value, OSError)
    # libraries that wrap the OS error in their own type, with the errno or its text in the message
    for wrapped in (RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"),
                    RuntimeError("[Errno 122] Disk quota exceeded")):
        with pytest.raises(vio.OutputError, match="cannot write") as e:
            vio.write_atomic(target, _writes_then_raises(wrapped), overwrite=True)
        assert e.value.__cause__ is wrapped  # the library's own words stay in the chain (-v shows them)
    with pytest.raises(ValueError, match="not about the disk"):  # other errors pass through unchanged
        vio.write_atomic(target, _writes_then_raises(ValueError("not about the disk")), overwrite=True)
    assert target.read_bytes() == b"old" and _temps(tmp_path) == []


def _writes_then_raises(error: Exception) -> Callable[[Path], None]:
    def write(tmp: Path) -> None:
        tmp.write_bytes(b"x" * 100)
        raise error

    return write


# -- broken YAML in --set ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["train", "demo"])
@pytest.mark.parametrize("item", ["optim.lr=[1,", "optim.lr=a: b: c", 'model.name="ViT', "train.steps={", "a: b: c"])
def test_broken_yaml_in_set_names_the_override(command, item, tmp_path, capsys):
    argv = [RECIPE] if command == "train" else []
    capsys.readouterr()
    assert main([command, *argv, "-o", str(tmp_path / "run"), "--set", item]) == 1
    _one_line_error(capsys.readouterr().err, command, repr(item) if "=" in item else "section.key=value")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("text,where", [
    ("model: {name: ViT-Ti/16}\nlist: &x [1, *x]\n", "list[1] is an alias of list,"),
    ("model: &m {name: ViT-Ti/16, inner: {self: *m}}\n", "model.inner.self is an alias of model,"),
    ("&top {model: {name: ViT-Ti/16}, again: *top}\n", "again is an alias of the document,"),
])
def test_a_recursive_yaml_anchor_is_named_not_a_recursion_error(text, where, tmp_path, capsys):
    """An alias inside its own anchor makes PyYAML build a list / dict that contains itself: that used to end in
    "maximum recursion depth exceeded"; now the file and the place are named."""
    recipe = tmp_path / "loop.yaml"
    recipe.write_text(text)
    capsys.readouterr()
    assert main(["train", str(recipe), "-o", str(tmp_path / "run")]) == 1
    _one_line_error(capsys.readouterr().err, "train", f"recipe {recipe}: recursive YAML anchor: {where}")
    assert not (tmp_path / "run").exists()


def test_a_recursive_yaml_anchor_in_set_and_a_reused_one(tmp_path, capsys):
    capsys.readouterr()
    assert main(["train", RECIPE, "-o", str(tmp_path / "run"), "--set", "optim.betas=&x [*x]"]) == 1
    _one_line_error(capsys.readouterr().err, "train", "--set 'optim.betas=&x [*x]': recursive YAML anchor: "
                    "optim.betas[0] is an alias of optim.betas")
    from vitlab.train.recipe import read_recipe_dict

    reused = tmp_path / "reused.yaml"  # the same anchor used twice, not inside itself: fine
    reused.write_text("model: {name: ViT-Ti/16}\nx: &s {lr: 1e-3}\noptim: *s\nschedule: *s\n")
    assert read_recipe_dict(reused) == {"model": {"name": "ViT-Ti/16"}, "x": {"lr": 1e-3}, "optim": {"lr": 1e-3},
                                        "schedule": {"lr": 1e-3}}


# -- Ctrl-C ---------------------------------------------------------------------------------------------------------


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _as_torch_does(tmp: Path, ctrl_c: int) -> None:
    """A writer like torch.save on a file: a KeyboardInterrupt inside its write comes out as a RuntimeError."""
    tmp.write_bytes(b"partial")
    try:
        for _ in range(ctrl_c):
            signal.raise_signal(signal.SIGINT)  # the Python handler runs before this returns
        tmp.write_bytes(b"new")
    except KeyboardInterrupt:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0") from None


def test_a_ctrl_c_during_a_write_waits_for_the_file(tmp_path, sigint_raises):
    target = tmp_path / "ckpt.pt"
    target.write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt):
        vio.write_atomic(target, lambda tmp: _as_torch_does(tmp, 1), overwrite=True)
    assert target.read_bytes() == b"new" and _temps(tmp_path) == []  # finished, then interrupted


def test_a_second_ctrl_c_during_a_write_stops_it_as_keyboard_interrupt(tmp_path, sigint_raises):
    target = tmp_path / "ckpt.pt"
    target.write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt):  # not the writer's RuntimeError
        vio.write_atomic(target, lambda tmp: _as_torch_does(tmp, 2), overwrite=True)
    assert target.read_bytes() == b"old" and _temps(tmp_path) == []


def test_the_training_stop_flag_gets_a_ctrl_c_held_by_a_write(tmp_path):
    from vitlab.train.loop import StopFlag

    with StopFlag() as stop:
        vio.write_atomic(tmp_path / "a", lambda tmp: _as_torch_does(tmp, 1))  # first Ctrl-C: stop after the step
        assert stop.reason == "SIGINT" and (tmp_path / "a").read_bytes() == b"new"
        with pytest.raises(KeyboardInterrupt):  # second: give up, once the file is whole
            vio.write_atomic(tmp_path / "b", lambda tmp: _as_torch_does(tmp, 1))
        assert (tmp_path / "b").read_bytes() == b"new"


def test_a_ctrl_c_a_library_wrapped_is_still_130(monkeypatch, capsys):
    def wrapped(args):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("unexpected pos 64 vs 0") from None

    monkeypatch.setattr("vitlab.cli.models.run", wrapped)
    assert main(["models"]) == 130
    assert capsys.readouterr().err == "vitlab models: interrupted\n"


def test_ctrl_c_twice_during_training_is_130_one_line_and_a_whole_checkpoint(tmp_path):
    """The real thing: `vitlab train` in processes of their own (three at once, to keep it short), Ctrl-C once
    (stop at the end of the step, save), then again after 0, 0.15 and 0.6 s, which land in the step, in the
    checkpoint save or in the shutdown. Always exit code 130, no traceback, and the newest checkpoint loads."""
    from vitlab.train import checkpoint

    sets = ["model.embed_dim=192", "model.depth=6", "model.num_heads=3", "model.mlp_dim=768", "train.steps=1000",
            "train.epochs=null", "train.time_budget_min=null", "train.evaluators.eval.every=0",
            "train.checkpoint_every=2", "train.log_every=1", "train.batch_size=16", "data.dataset=synthetic"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    delays = (0.0, 0.15, 0.6)
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(subprocess.Popen(
            [sys.executable, "-m", "vitlab.cli", "train", RECIPE, "-o", str(tmp_path / f"run{i}"), "--no-progress",
             "--set", *sets], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env))
            for i in range(len(delays))]
        for proc, delay in zip(procs, delays):
            assert proc.stderr is not None
            seen = []
            for line in proc.stderr:  # the checkpoint of step 2 is on disk once step 3 is logged
                seen.append(line)
                if line.startswith("step 3/"):
                    break
            else:
                pytest.fail("training never reached step 3:\n" + "".join(seen))
            proc.send_signal(signal.SIGINT)
            time.sleep(delay)
            proc.send_signal(signal.SIGINT)
        for i, (proc, delay) in enumerate(zip(procs, delays)):
            assert proc.stderr is not None
            err = proc.stderr.read()
            assert proc.wait(timeout=120) == 130, (delay, err)
            assert "Traceback" not in err and "Exception ignored" not in err, (delay, err)
            assert [line for line in err.splitlines() if not line.startswith("step ")] != []  # it says so
            ckpts = tmp_path / f"run{i}" / "checkpoints"
            steps = checkpoint.list_checkpoints(ckpts)
            assert steps and steps[0] >= 2, (delay, steps)
            assert checkpoint.load_latest_checkpoint(ckpts).step == steps[-1]  # the newest is whole
            assert _temps(tmp_path / f"run{i}") == []


# -- SIGTERM: every command stops as on Ctrl-C ------------------------------------------------------------------


def test_sigterm_is_an_interrupt_held_by_a_write(tmp_path):
    """Under the `vitlab` program's handler SIGTERM raises `Terminated` (a KeyboardInterrupt), once a file being
    written is whole: the file is in place, no temporary is left, and the handler before is back afterwards."""
    from vitlab.cli._common import Terminated, terminate_as_interrupt

    before = signal.getsignal(signal.SIGTERM)

    def writer(tmp: Path) -> None:
        tmp.write_bytes(b"new")
        os.kill(os.getpid(), signal.SIGTERM)  # its Python handler runs here: held until the file is in place

    with pytest.raises(Terminated), terminate_as_interrupt():
        vio.write_atomic(tmp_path / "a", writer)
    assert (tmp_path / "a").read_bytes() == b"new" and _temps(tmp_path) == []
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_in_a_command_is_130_and_one_line(monkeypatch, capsys):
    from vitlab.cli._common import run_command

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert run_command("models", lambda: os.kill(os.getpid(), signal.SIGTERM), program=True) == 130
    finally:  # run_command(program=True) leaves the handlers of a process about to exit
        for s, handler in saved.items():
            signal.signal(s, handler)
    assert capsys.readouterr().err == "vitlab models: interrupted (SIGTERM)\n"


@pytest.mark.slow
def test_sigterm_while_exporting_int8_is_130_one_line_and_leaves_nothing(tmp_path):
    """The fault of issue 36: `vitlab export ... --int8` killed by SIGTERM while it exports (its staging folder
    `.m.onnx.XXXXXXXX` is there) exits 130 with one line, and removes that folder; no m.onnx, whole or half."""
    from vitlab.models.preprocess import Preprocess

    model = perturb_(vitlab.create_model("ViT-Ti/16", depth=1, img_size=32, patch_size=8, num_classes=10), scale=0.3)
    model.preprocess = Preprocess(img_size=32, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), source="test")
    ckpt = vitlab.save_weights(model, tmp_path / "m.safetensors")
    images, out = tmp_path / "images", tmp_path / "out"
    images.mkdir()
    out.mkdir()
    rng = np.random.default_rng(0)
    for i in range(8):
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(images / f"{i}.png")
    argv = [sys.executable, "-m", "vitlab.cli", "-q", "export", ckpt, out / "m.onnx", "--int8", "--calib", images,
            "--verify-data", images]
    with subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:
        deadline = time.monotonic() + 120
        while not any(p.name.startswith(".m.onnx.") for p in out.iterdir()):  # the export has begun
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the export never started"
            time.sleep(0.01)
        time.sleep(0.5)  # into torch.onnx's export (it takes seconds)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.splitlines() == ["vitlab export: interrupted (SIGTERM)"], err
    assert list(out.iterdir()) == []


# -- every command maps every error the one way ----------------------------------------------------------------

# a command line each command parses (its `run` is replaced, so nothing runs)
PARSES = {
    "models": [], "weights": ["show", "x"], "convert": ["a", "b"], "train": ["r.yaml"], "eval": ["c", "--data", "d"],
    "predict": ["c", "i.png"], "demo": [], "analyze": ["c", "--images", "i.png", "-o", "o"],
    "fewshot": ["c", "--data", "d"], "bench": [], "export": ["c", "o.onnx"], "reproduce": ["inside"], "serve": ["c"],
}


def _errors() -> list[tuple[str, BaseException]]:
    from vitlab.data import DataError
    from vitlab.utils.extras import MissingExtraError
    from vitlab.weights import WeightsError

    return [
        ("weights", WeightsError("x.npz: not a NumPy archive")),
        ("data", DataError("t10k-images-idx3-ubyte", "cut short: 100 of 7840000 bytes")),
        ("missing", FileNotFoundError(errno.ENOENT, "No such file or directory", "x.png")),
        ("directory", IsADirectoryError(errno.EISDIR, "Is a directory", "photos")),
        ("permission", PermissionError(errno.EACCES, "Permission denied", "ckpt.pth")),
        ("os", OSError(errno.EIO, "Input/output error")),
        ("value", ValueError("model.depth must be >= 1, got 0")),
        ("extra", MissingExtraError("onnx", "export", "ONNX export")),
        ("disk", vio.OutputError("run/model.safetensors", "no space left on device", errno.ENOSPC)),
        ("ctrl-c", KeyboardInterrupt()),
    ]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_reports_every_loading_error_in_one_line(command, monkeypatch, capsys):
    for kind, error in _errors():
        def fail(args, error=error):
            raise error

        monkeypatch.setattr(f"vitlab.cli.{command}.run", fail)
        capsys.readouterr()
        name = "weights show" if command == "weights" else command
        rc = main([command, *PARSES[command]])
        err = capsys.readouterr().err
        if kind == "ctrl-c":
            assert (rc, err) == (130, f"vitlab {name}: interrupted\n")
            continue
        assert rc == 1, (kind, err)
        assert err.startswith(f"vitlab {name}: error: ") and err.count("\n") == 1 and "Traceback" not in err, (
            kind, err)


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory, ckpt) -> dict[str, str]:
    """Malformed checkpoints and data of every kind a user hands over by mistake."""
    import zipfile

    d = tmp_path_factory.mktemp("bad")
    (d / "text.npz").write_text("hello\n")
    (d / "cut.safetensors").write_bytes(Path(ckpt).read_bytes()[:300])
    (d / "empty.pth").write_bytes(b"")
    (d / "noise.pth").write_bytes(np.random.default_rng(0).integers(0, 255, 4096, dtype=np.uint8).tobytes())
    (d / "recipe.yaml").write_text("model: {depth: 1}\n")
    with zipfile.ZipFile(d / "empty.npz", "w"):
        pass
    (d / "folder").mkdir()
    (d / "not.png").write_bytes(b"not a png")
    idx = d / "idx"
    idx.mkdir()
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (idx / name).write_bytes(b"\x00\x00\x08\x03" + b"\x00" * 9)  # an IDX header cut short
    return {"dir": str(d), "idx": str(idx)}


BAD_CHECKPOINTS = ["text.npz", "cut.safetensors", "empty.pth", "noise.pth", "recipe.yaml", "empty.npz", "folder",
                   "not.png", "missing.safetensors"]


def _with_checkpoint(command: str, bad: str, image: str, out: Path) -> list[str]:
    return {
        "eval": ["eval", bad, "--data", "synthetic", "--no-progress"],
        "predict": ["predict", bad, image],
        "analyze": ["analyze", bad, "--images", image, "-o", str(out), "--no-progress"],
        "fewshot": ["fewshot", bad, "--data", "synthetic", "--no-progress"],
        "export": ["export", bad, str(out) + ".onnx"],
        "convert": ["convert", bad, str(out) + ".safetensors"],
        "train": ["train", RECIPE, "-o", str(out), "--no-progress", "--set", *TINY, "train.steps=1",
                  f"init.checkpoint={bad}"],
    }[command]


@pytest.mark.parametrize("command", ["eval", "predict", "analyze", "fewshot", "export", "convert", "train"])
def test_every_bad_checkpoint_is_one_line_for_every_command(command, bad_inputs, image, tmp_path, capsys):
    for name in BAD_CHECKPOINTS:
        bad = str(Path(bad_inputs["dir"]) / name)
        capsys.readouterr()
        assert main(_with_checkpoint(command, bad, image, tmp_path / "out")) == 1, name
        _one_line_error(capsys.readouterr().err, command)
        assert list(tmp_path.iterdir()) == [], name  # nothing written


@pytest.mark.parametrize("saved,found", [({0: "zeros"}, "1 non-string key: 0 (int)"),
                                         ({"model": {"cls_token": "zeros", 1: "zeros", (2, 3): "zeros"}},
                                          "2 non-string keys: 1 (int), (2, 3) (tuple)")])
def test_a_pth_with_non_string_keys_is_one_line_naming_them(saved, found, image, tmp_path, capsys):
    """torch.save({0: tensor}) (a dict of tensors by number, not a state dict) was an AttributeError traceback."""
    import torch

    def tensors(d):
        return {k: tensors(v) if isinstance(v, dict) else torch.zeros(1) for k, v in d.items()}

    bad = tmp_path / "numbered.pth"
    torch.save(tensors(saved), bad)
    out = tmp_path / "out"
    for command in ("convert", "eval", "predict", "analyze", "export", "fewshot", "train"):
        capsys.readouterr()
        assert main(_with_checkpoint(command, str(bad), image, out)) == 1, command
        _one_line_error(capsys.readouterr().err, command, f"{bad}: not a state dict", "keys must be tensor names "
                        "(strings)", found)
        assert sorted(tmp_path.iterdir()) == [bad], command  # nothing written


@pytest.mark.parametrize("argv", [
    ["predict", "{ckpt}", "{bad}/not.png"],
    ["predict", "{ckpt}", "{bad}/missing.png"],
    ["predict", "{ckpt}", "{bad}/folder"],
    ["analyze", "{ckpt}", "--images", "{bad}/not.png", "-o", "{out}"],
    ["analyze", "{ckpt}", "--images", "{bad}/missing.png", "-o", "{out}"],
    ["analyze", "{ckpt}", "--data", "fashion_mnist:{idx}", "-o", "{out}"],
    ["eval", "{ckpt}", "--data", "fashion_mnist:{idx}"],
    ["eval", "{ckpt}", "--data", "imagefolder:{bad}/missing"],
    ["fewshot", "{ckpt}", "--data", "fashion_mnist:{idx}"],
    ["train", RECIPE, "-o", "{out}", "--set", "data.dataset=fashion_mnist", "data.root={idx}"],
    ["train", "{bad}/missing.yaml"],
    ["train", "{bad}/folder"],
    ["demo", "-o", "{out}", "--configs", "{bad}/folder"],
    ["weights", "get", "{bad}/missing.safetensors"],
    ["bench", "--model", "ViT-Nope/16", "-o", "{out}"],
], ids=lambda a: " ".join(a[:2]).replace("{", "").replace("}", "") + "-" + a[-1].rsplit("/", 1)[-1])
def test_bad_images_data_and_files_are_one_line(argv, bad_inputs, ckpt, tmp_path, capsys):
    fill = {"ckpt": ckpt, "bad": bad_inputs["dir"], "idx": bad_inputs["idx"], "out": str(tmp_path / "out")}
    argv = [a.format(**fill) for a in argv]
    command = " ".join(argv[:2]) if argv[0] == "weights" else argv[0]
    capsys.readouterr()
    assert main([*argv, *(["--no-progress"] if argv[0] not in ("predict", "bench") else [])]) == 1
    _one_line_error(capsys.readouterr().err, command)
    assert not (tmp_path / "out").exists() or argv[0] == "train"


@pytest.mark.skipif(IS_ROOT, reason="root reads files whatever their mode")
def test_an_unreadable_checkpoint_is_one_line(ckpt, tmp_path, capsys):
    locked = tmp_path / "locked.safetensors"
    locked.write_bytes(Path(ckpt).read_bytes())
    locked.chmod(0)
    try:
        for command in ("eval", "predict", "analyze", "fewshot", "export", "convert"):
            capsys.readouterr()
            assert main(_with_checkpoint(command, str(locked), str(tmp_path / "i.png"), tmp_path / "o")) == 1
            _one_line_error(capsys.readouterr().err, command, "ermission denied")
    finally:
        locked.chmod(0o644)
