"""Peak memory of `vitlab analyze`'s computation for ViT-B/16 at 384 px on 100 images (issue 4).

The attention maps of all layers at once would need layers x images x heads x T^2 floats
(12 x 100 x 12 x 577^2 x 4 B = 19.2 GB) before any reduction; the layer-at-a-time walk holds one layer of
one batch. Random weights: memory does not depend on their values.

    .venv/bin/python benchmarks/analysis_memory.py --images 100 --batch-size 8 --threads 2 -o /tmp/analysis_b16
"""

from __future__ import annotations

import argparse
import resource
import time

import torch

import vitlab
from vitlab.analysis.report import analyze, write_report


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="ViT-B/16")
    p.add_argument("--img-size", type=int, default=384)
    p.add_argument("--images", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("-o", "--output", default=None, help="also write the report here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = vitlab.create_model(args.model, img_size=args.img_size).eval()
    images = torch.randn(args.images, 3, args.img_size, args.img_size)
    base = peak_rss_gib()
    cfg = model.cfg
    T = cfg.seq_len
    all_at_once = cfg.depth * args.images * cfg.num_heads * T * T * 4 / 2**30
    t0 = time.perf_counter()
    result = analyze(model, images, batch_size=args.batch_size, layer_maps=[0, -1])
    seconds = time.perf_counter() - t0
    peak_analyze = peak_rss_gib()
    if args.output:
        write_report(result, args.output, overwrite=True)
    print("| model | img | images | batch | peak RSS: analysis (GiB) | + report (GiB) | before (GiB) "
          "| all maps at once (GiB) | time (s) |")
    print(f"| {args.model} | {args.img_size} | {args.images} | {args.batch_size} | {peak_analyze:.2f} | "
          f"{peak_rss_gib():.2f} | {base:.2f} | {all_at_once:.1f} | {seconds:.0f} |")


if __name__ == "__main__":
    main()
