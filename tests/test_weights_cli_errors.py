"""Every command that reads a checkpoint reports a damaged or foreign one as one line and exit 1 (issue 18: "51 of
59 malformed weight files crash analyze"). The files are the fuzz corpus's representative failures, one per
family (tests/weights_corpus.py `bad_files`)."""

from __future__ import annotations

import pytest
from PIL import Image

from vitlab.cli import main

from .weights_corpus import bad_files

COMMANDS = {
    "analyze": lambda ck, d: ["analyze", ck, "--images", str(d / "img.png"), "-o", str(d / "out_analyze")],
    "export": lambda ck, d: ["export", ck, str(d / "out.onnx")],
    "fewshot": lambda ck, d: ["fewshot", ck, "--data", "synthetic"],
    "eval": lambda ck, d: ["eval", ck, "--data", "synthetic"],
    "predict": lambda ck, d: ["predict", ck, str(d / "img.png")],
    "convert": lambda ck, d: ["convert", ck, str(d / "out.safetensors"), "--to", "vitlab"],
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    Image.new("RGB", (8, 8), (10, 200, 30)).save(d / "img.png")
    return d, bad_files(d / "files")


NAMES = ["text.npz", "truncated.npz", "bitflip.npz", "truncated.safetensors", "badheader.safetensors", "image.pth",
         "recipe.pth", "truncated.pth", "truncated_legacy.pth", "empty.safetensors", "hf_bad_config"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_bad_checkpoint_is_one_line_and_exit_1(corpus, capsys, command, name):
    d, files = corpus
    path = files[name]
    code = main(COMMANDS[command](str(path), d))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1, err
    assert len(lines) == 1 and lines[0].startswith(f"vitlab {command}: error: "), err
    assert path.name in lines[0] or name in lines[0], lines[0]
    assert "Traceback" not in err
