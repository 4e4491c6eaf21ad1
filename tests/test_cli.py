"""The `vitlab` command line as a whole: fast help without torch, --version, help text for every option, and one
exit-code scheme across commands."""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys

import pytest

import vitlab
from vitlab.cli import COMMANDS, build_parser, main
from vitlab.cli._common import EXIT_CODES, error_message, parse_img_size

from .conftest import perturb_


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_building_the_parser_imports_no_torch():
    """`vitlab --help` builds every command's parser without importing torch (or numpy, PIL, yaml)."""
    proc = _run("import sys; from vitlab.cli import build_parser; build_parser(); "
                "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'numpy', 'PIL', 'yaml', "
                "'matplotlib', 'safetensors'}); assert not heavy, heavy")
    assert proc.returncode == 0, proc.stderr


def test_help_lists_commands_and_exit_codes_without_torch():
    proc = _run("import sys\nfrom vitlab.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit as e:\n"
                "    assert e.code == 0\nassert 'torch' not in sys.modules")
    assert proc.returncode == 0, proc.stderr
    for name in COMMANDS:
        assert f"    {name} " in proc.stdout
    assert "exit codes" in proc.stdout
    for code, _ in EXIT_CODES:
        assert f"  {code} " in proc.stdout


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"vitlab {vitlab.__version__}"


def _subparsers(parser: argparse.ArgumentParser, prefix: str = "vitlab"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix} {name}", sub
                yield from _subparsers(sub, f"{prefix} {name}")


def test_every_command_has_help_examples_and_option_help(capsys):
    parser = build_parser()
    subs = dict(_subparsers(parser))
    assert set(COMMANDS) <= {name.split()[1] for name in subs}
    for name, sub in subs.items():
        if name.count(" ") == 1:  # a command (not `weights list`): a description and examples
            assert sub.description and len(sub.description) > 80, name
            assert sub.epilog and sub.epilog.startswith("examples:") and "vitlab" in sub.epilog, name
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
                continue
            assert action.help, f"{name} {action.option_strings or action.dest} has no help text"
        with pytest.raises(SystemExit) as e:
            main([*name.split()[1:], "--help"])
        assert e.value.code == 0
        text = capsys.readouterr().out
        assert text.startswith(f"usage: {name}")
    # defaults are shown, once
    eval_help = subs["vitlab eval"].format_help()
    assert "(default: test)" in eval_help and "(default: auto)" in eval_help and "(default: (default" not in eval_help


def test_one_spelling_of_the_shared_options():
    parser = build_parser()
    subs = dict(_subparsers(parser))
    for name, sub in subs.items():
        opts = {o for a in sub._actions for o in a.option_strings if a.help != argparse.SUPPRESS}
        assert not opts & {"--out", "--run-dir", "--outdir", "--overwrite", "--image-size", "--img_size"}, name
        for a in sub._actions:
            if "--output" in a.option_strings:
                assert "-o" in a.option_strings, name
            if "--img-size" in a.option_strings:
                assert a.type is parse_img_size, name
    # fewshot wrote its JSON with --json FILE before -o/--output: still accepted, not shown
    assert subs["vitlab fewshot"].parse_args(["m", "--data", "d", "--json", "r.json"]).output == "r.json"
    assert "--json" not in subs["vitlab fewshot"].format_help()


def test_img_size_is_n_or_hxw():
    assert parse_img_size("384") == 384 and parse_img_size("32x24") == (32, 24) and parse_img_size("32,24") == (32, 24)
    for bad in ("0", "32x", "axb", "1x2x3", "-4"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_img_size(bad)


def test_choices_spelled_in_the_cli_agree_with_the_library():
    """The CLI spells a few choice lists out so that --help imports no torch; they must stay the library's."""
    from vitlab import bench
    from vitlab.analysis import fewshot
    from vitlab.cli import bench as bench_cli
    from vitlab.cli import convert as convert_cli
    from vitlab.cli import eval as eval_cli
    from vitlab.cli import export as export_cli
    from vitlab.cli import fewshot as fewshot_cli
    from vitlab.deploy import export
    from vitlab.deploy.optimize import CALIBRATED_MODES, MODES, RUNTIME_MODES
    from vitlab.inference import evaluate
    from vitlab.weights import publish

    # the CLI's --mode: the torch modes that need no calibration images
    assert tuple(m for m in MODES if m not in CALIBRATED_MODES + RUNTIME_MODES) == eval_cli.MODES
    assert eval_cli.TTA_MODES == evaluate.TTA_MODES
    # bench's --modes: every torch mode, calibrated ones included (bench has calibration images); runtimes are peers
    assert tuple(m for m in MODES if m not in RUNTIME_MODES) == bench_cli.BENCH_MODES
    assert convert_cli.FORMATS == publish.EXPORT_FORMATS
    assert bench_cli.PEERS == bench.PEERS and set(bench_cli.DTYPES) == set(bench.DTYPES)
    assert export_cli.DEFAULT_OPSET == export.DEFAULT_OPSET
    assert fewshot_cli.DEFAULT_SHOTS == fewshot.DEFAULT_SHOTS and fewshot_cli.DEFAULT_L2 == fewshot.DEFAULT_L2


def test_exception_table():
    from vitlab.weights import WeightsError

    assert error_message(WeightsError("bad file"))[0] == 1
    assert error_message(FileNotFoundError(2, "No such file or directory", "x.png")) == (1, "x.png: No such file "
                                                                                          "or directory")
    assert error_message(ModuleNotFoundError("No module named 'onnxruntime'", name="onnxruntime"))[1].endswith(
        "pip install 'vitlab[export]'")
    assert error_message(KeyError("bug")) is None  # a bug keeps its traceback


@pytest.fixture(scope="module")
def bad_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("bad") / "broken.safetensors"
    path.write_bytes(b"this is not a checkpoint")
    return path


@pytest.mark.parametrize("command", ["convert", "eval", "predict", "analyze", "fewshot", "export"])
def test_a_bad_checkpoint_is_exit_1_and_one_line(command, bad_checkpoint, tmp_path, capsys):
    ckpt = str(bad_checkpoint)
    argv = {
        "convert": [ckpt, str(tmp_path / "out.safetensors")],
        "eval": [ckpt, "--data", "synthetic"],
        "predict": [ckpt, str(tmp_path / "img.png")],
        "analyze": [ckpt, "--images", str(tmp_path / "img.png"), "-o", str(tmp_path / "report")],
        "fewshot": [ckpt, "--data", "synthetic"],
        "export": [ckpt, str(tmp_path / "out.onnx")],
    }[command]
    capsys.readouterr()
    assert main([command, *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"vitlab {command}: error: ") and "broken.safetensors" in err, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert not (tmp_path / "report").exists() and not (tmp_path / "out.safetensors").exists()
    # a missing checkpoint: the same scheme
    assert main([command, str(tmp_path / "missing.safetensors"), *argv[1:]]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"vitlab {command}: error: ") and "missing.safetensors" in err and "Traceback" not in err
    # a usage error stays argparse's: exit 2
    with pytest.raises(SystemExit) as e:
        main([command, *argv, "--no-such-option"])
    assert e.value.code == 2


def test_verbose_shows_the_traceback_and_quiet_hides_info(bad_checkpoint, tmp_path, capsys, monkeypatch):
    assert main(["convert", "-v", str(bad_checkpoint), str(tmp_path / "o.safetensors")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.rstrip().splitlines()[-1].startswith("vitlab convert: error: ")
    model = perturb_(vitlab.create_model("ViT-Ti/16", embed_dim=32, depth=1, num_heads=2, mlp_dim=64, img_size=16,
                                         patch_size=8, num_classes=3))
    src = vitlab.save_weights(model, tmp_path / "a.safetensors")
    logger = logging.getLogger("vitlab")
    seen = []

    def run_and_record(args):  # what the command sees: the level -v/-q set, one stderr handler
        seen.append((logger.level, len(logger.handlers)))
        logging.getLogger("vitlab.weights").info("an info message")
        logging.getLogger("vitlab.weights").warning("a warning")
        return 0

    monkeypatch.setattr("vitlab.cli.convert.run", run_and_record)
    before = (logger.level, list(logger.handlers))
    for flags, level in (([], logging.INFO), (["-q"], logging.WARNING), (["-qq"], logging.ERROR),
                         (["-v"], logging.DEBUG)):
        assert main([*flags[:1], "convert", *flags[1:], str(src), str(tmp_path / "b.npz")]) == 0
        assert seen[-1] == (level, len(before[1]) + 1)
        err = capsys.readouterr().err
        assert ("an info message" in err) == (level <= logging.INFO)
        assert ("a warning" in err) == (level <= logging.WARNING)
    assert (logger.level, logger.handlers) == before  # restored for the next caller


def test_python_m_vitlab_cli_runs_the_command():
    proc = subprocess.run([sys.executable, "-m", "vitlab.cli", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == f"vitlab {vitlab.__version__}"


def test_progress_bars_only_on_a_terminal(monkeypatch):
    import io

    from vitlab.utils.progress import progress_bar

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with progress_bar(range(3), enabled=True) as bar:
        assert bar.disable and list(bar) == [0, 1, 2]
    monkeypatch.setattr(sys, "stderr", Terminal())
    with progress_bar(range(3), enabled=True, desc="x") as bar:
        assert not bar.disable and list(bar) == [0, 1, 2]
    assert "x" in sys.stderr.getvalue()
    with progress_bar(range(3), enabled=False) as bar:
        assert bar.disable


def test_the_library_behind_the_commands_raises_and_returns(tmp_path):
    """predict, convert and the analysis loaders are public library functions: they return results and raise
    exceptions (never print an error or exit), and `import vitlab` stays light with them exported lazily."""
    import importlib

    import numpy as np
    from PIL import Image

    from vitlab.analysis import check_image_size, expand_image_paths, load_checkpoint
    from vitlab.weights import ConvertResult, convert

    importlib.import_module("vitlab.inference.predict")
    importlib.import_module("vitlab.deploy.optimize")
    assert callable(vitlab.predict) and vitlab.predict.__module__ == "vitlab.inference.predict"  # the function
    assert callable(vitlab.optimize) and vitlab.optimize.__module__ == "vitlab.deploy.optimize"
    model = perturb_(vitlab.create_model("ViT-Ti/16", embed_dim=32, depth=1, num_heads=2, mlp_dim=64, img_size=16,
                                         patch_size=8, num_classes=3))
    src = vitlab.save_weights(model, tmp_path / "a.safetensors", {"class_names": ["cat", "dog", "fish"]})
    result = convert(src, tmp_path / "b.npz")
    assert isinstance(result, ConvertResult) and result.format == "npz" and result.path == tmp_path / "b.npz"
    assert f"wrote {tmp_path / 'b.npz'} (npz)" in result.summary()
    with pytest.raises(FileExistsError, match="already exists"):
        convert(src, tmp_path / "b.npz")
    Image.fromarray(np.zeros((20, 24, 3), np.uint8)).save(tmp_path / "img.png")
    out = vitlab.predict(src, [tmp_path / "img.png"], top_k=2)
    assert {t["label"] for t in out[0]["top"]} <= {"cat", "dog", "fish"} and len(out[0]["top"]) == 2
    with pytest.raises(ValueError, match="top_k"):
        vitlab.predict(src, [tmp_path / "img.png"], top_k=0)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.safetensors")
    with pytest.raises(ValueError, match="multiples of the patch size 8"):
        check_image_size(load_checkpoint(src), (16, 12))
    assert check_image_size(load_checkpoint(src), 24) == (24, 24)
    with pytest.raises(FileNotFoundError, match=r"missing\.png"):
        expand_image_paths([tmp_path / "img.png", tmp_path / "missing.png"])
    assert expand_image_paths([tmp_path]) == [str(tmp_path / "img.png")]


def test_interrupted_is_exit_130(monkeypatch, capsys):
    """Ctrl-C anywhere is 130; so is a training run that stopped on a signal after saving its checkpoint."""
    from vitlab.train import recipes

    def interrupt(args):
        raise KeyboardInterrupt

    monkeypatch.setattr("vitlab.cli.models.run", interrupt)
    assert main(["models"]) == 130
    assert capsys.readouterr().err == "vitlab models: interrupted\n"

    def stopped(recipe, run_dir, **kwargs):
        return {"status": "interrupted (SIGTERM)", "step": 3, "total_steps": 10}

    monkeypatch.setattr("vitlab.train.loop.train", stopped)
    assert main(["train", str(recipes.path("fmnist_scratch")), "-o", "unused-run-dir"]) == 130
    err = capsys.readouterr().err
    assert "interrupted (SIGTERM) at step 3/10" in err and "--resume" in err
