"""`vitlab models`: the paper's Table 1 for every built-in variant, with exact parameters and compute."""

from __future__ import annotations

import argparse
import dataclasses
import json

HELP = "the paper's Table 1 for every built-in variant, and the BiT ResNet baselines"
DESCRIPTION = """\
The paper's Table 1 (layers, hidden size D, MLP size, heads) for every built-in variant, with the parameters and
the FLOPs of one forward pass counted exactly at each variant's resolution (attention included); then the BiT
ResNets (the paper's CNN baseline, `create_model("BiT-R50x1")`) with their units per stage, width, parameters and
FLOPs at 224 and 384 px."""
EXAMPLES = """\
  vitlab models
  vitlab models --num-classes 10 --json | python -m json.tool"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-classes", type=int, default=1000, help="classes of the head counted in Params")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    from ..models.flops import format_table1, table1

    rows = table1(args.num_classes)
    bit = _bit_rows(args.num_classes)
    if args.json:
        print(json.dumps([{"family": "vit", **dataclasses.asdict(r)} for r in rows] + bit, indent=2))
    else:
        print(format_table1(rows))
        print()
        print(_format_bit(bit))
    return 0


def _bit_rows(num_classes: int) -> list[dict]:
    from ..models.resnet import VARIANTS, ResNetConfig, count_flops, count_params

    rows = []
    for name in VARIANTS:
        cfg = ResNetConfig.from_name(name, num_classes=num_classes)
        rows.append({"family": "bit", "name": name, "units": list(cfg.layers), "width": cfg.width,
                     "params": count_params(cfg), "gflops_224": count_flops(cfg, 224) / 1e9,
                     "gflops_384": count_flops(cfg, 384) / 1e9})
    return rows


def _format_bit(rows: list[dict]) -> str:
    head = f"{'Model':<13} {'Units':>13} {'Width':>6} {'Params':>13} {'GFLOPs@224':>11} {'GFLOPs@384':>11}"
    lines = [head, "-" * len(head)]
    for r in rows:
        units = "/".join(map(str, r["units"]))
        lines.append(f"{r['name']:<13} {units:>13} {r['width']:>6} {r['params']:>13,} {r['gflops_224']:>11.2f} "
                     f"{r['gflops_384']:>11.2f}")
    lines.append("BiT ResNet-v2 (GroupNorm + weight-standardised convolutions): the paper's CNN baseline; units per "
                 "stage, stem width. Same counting as above.")
    return "\n".join(lines)
