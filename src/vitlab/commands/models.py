"""`vitlab models`: the paper's Table 1 for every variant, with exact parameters and compute."""

from __future__ import annotations

import argparse
import dataclasses
import json

from ..flops import format_table1, table1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-classes", type=int, default=1000, help="classes of the head counted in Params")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    rows = table1(args.num_classes)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
    else:
        print(format_table1(rows))
    return 0
