"""`vitlab` command line: thin. Each sub-command lives beside the code it drives, as a module with
`add_arguments(parser)` and `run(args) -> int`; this file only wires them together."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# name -> (module, one-line help). Modules are imported only when their command runs.
COMMANDS: dict[str, tuple[str, str]] = {
    "models": ("vitlab.commands.models", "the paper's Table 1 for every built-in variant"),
    "weights": ("vitlab.commands.weights", "pretrained checkpoints: list the registry, show one, get (download) one"),
    "convert": ("vitlab.weights.cli", "convert a checkpoint between vitlab, npz, hf, torchvision and timm formats"),
    "train": ("vitlab.train.cli", "pre-train or fine-tune from a YAML recipe"),
    "eval": ("vitlab.train.eval_cli", "evaluate a checkpoint: top-1/top-5, per-class accuracy, confusion matrix"),
    "predict": ("vitlab.train.predict_cli", "classify image files with a checkpoint"),
    "demo": ("vitlab.train.demo", "the main job: pre-train on Fashion-MNIST, fine-tune at higher resolution, report"),
    "analyze": ("vitlab.analysis.cli", "the paper's figures for a checkpoint: filters, pos-emb similarity, attention"),
    "fewshot": ("vitlab.analysis.fewshot_cli", "few-shot linear evaluation on frozen features"),
    "bench": ("vitlab.bench", "throughput, latency, memory and MFU against timm, transformers, torchvision"),
    "export": ("vitlab.export", "export a checkpoint to ONNX with a dynamic batch"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vitlab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(_module=module)
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:  # a command whose module is not installed stays listed but says why
            if not e.name or not module.startswith(e.name):
                raise
            p.set_defaults(_missing=str(e))
            continue
        mod.add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_missing", None):
        parser.error(f"command {args.command!r} is not available: {args._missing}")
    mod = importlib.import_module(args._module)
    try:
        return int(mod.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the reader left: stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 141


if __name__ == "__main__":
    sys.exit(main())
