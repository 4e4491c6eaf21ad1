"""`vitlab models`: the paper's Table 1 for every built-in variant, with exact parameters and compute."""

from __future__ import annotations

import argparse

HELP = "the paper's Table 1 for every built-in variant"
DESCRIPTION = """\
The paper's Table 1 (layers, hidden size D, MLP size, heads) for every built-in variant, with the parameters and
the FLOPs of one forward pass counted exactly at each variant's resolution (attention included)."""
EXAMPLES = """\
  vitlab models
  vitlab models --num-classes 10 --json | python -m json.tool"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-classes", type=int, default=1000, help="classes of the head counted in Params")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from ..flops import format_table1, table1

    rows = table1(args.num_classes)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
    else:
        print(format_table1(rows))
    return 0
