"""The `vitlab` command line.

One module per command (`vitlab.cli.eval`, ...), each with `HELP` (one line), `DESCRIPTION`, `EXAMPLES`,
`add_arguments(parser)` and `run(args) -> int`. `add_arguments` imports nothing heavy, so building the whole
parser (`vitlab --help`) never imports torch; `run` imports the library it drives and calls it. Library functions
raise; `main` alone turns their exceptions into a message and an exit code (`_common.error_message`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ..utils.version import __version__
from ._common import (
    INTERRUPTED,
    HelpFormatter,
    add_parser,
    add_verbosity,
    exit_code_table,
    ignore_interrupts_at_exit,
    logging_to_stderr,
    run_command,
)

__all__ = ["COMMANDS", "build_parser", "main", "version"]

# the commands, in the order `vitlab --help` lists them (module vitlab.cli.<name>)
COMMANDS = ("models", "weights", "convert", "train", "eval", "predict", "serve", "demo", "analyze", "fewshot",
            "bench", "export", "reproduce")

DESCRIPTION = """\
vitlab: the Vision Transformer of "An Image is Worth 16x16 Words" (Dosovitskiy et al., ICLR 2021) as a tool:
the model zoo and its compute, pretrained weights in and out of every library's format, paper recipes for
training and fine-tuning, evaluation and prediction, the paper's analysis figures, and speed against peers.
`vitlab COMMAND --help` describes a command, its options and their defaults, with examples."""

EPILOG = f"""\
exit codes (every command):
{exit_code_table()}

logging: vitlab's messages go to stderr; -v adds debug messages and tracebacks, -q keeps warnings, -qq errors.
Progress bars are drawn on stderr only when it is a terminal.

examples:
  vitlab models                                       # the paper's Table 1
  vitlab predict vit_b_16.IMAGENET1K_V1 cat.jpg       # classify with a registry checkpoint
  vitlab demo                                         # pre-train and fine-tune on Fashion-MNIST (~10 min, CPU)
  torchrun --nproc-per-node 4 -m vitlab.cli train configs/vit_b16_imagenet_pretrain.yaml -o runs/b16"""


def version() -> str:
    """`vitlab.__version__`: the package's one version string (`import vitlab` does not import torch)."""
    return __version__


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command; imports only the command modules (no torch)."""
    parser = argparse.ArgumentParser(prog="vitlab", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"vitlab {version()}")
    add_verbosity(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    sub.required = True
    for name in COMMANDS:
        mod = importlib.import_module(f"{__name__}.{name}")
        p = add_parser(sub, name, mod.HELP, mod.DESCRIPTION, mod.EXAMPLES)
        mod.add_arguments(p)
        add_verbosity(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]), run the command, return its exit code (see `vitlab --help`).

    Without `argv` main runs as the `vitlab` program: a Ctrl-C that comes after the command's work, while the
    process exits, ends it at once with code 130 (`_common.run_command`). With `argv` (a call from Python, a
    test) the process's signal handling is left as it was.
    """
    if argv is None:
        ignore_interrupts_at_exit()
    try:
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt:  # Ctrl-C before the command started
        print("vitlab: interrupted", file=sys.stderr)
        return INTERRUPTED
    verbose, quiet = getattr(args, "verbose", 0) or 0, getattr(args, "quiet", 0) or 0
    name = " ".join(str(n) for n in (args.command, getattr(args, "action", None)) if n)  # "weights get"
    with logging_to_stderr(verbose, quiet):
        return run_command(name, lambda: args._run(args), verbose=verbose, program=argv is None)


if __name__ == "__main__":
    sys.exit(main())
