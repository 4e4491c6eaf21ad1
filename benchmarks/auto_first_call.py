"""How long the first `vitlab.optimize(model, "auto")` takes for ViT-B/16 at 224 px, and what it measured and chose.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/auto_first_call.py --threads 1 -o /tmp/auto-amx.json
    # as on an AVX2-only host: kernels forced to AVX2 (see docs/speed.md "AVX2"), flags faked so vitlab plans for AVX2
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
        OMP_NUM_THREADS=1 .venv/bin/python benchmarks/auto_first_call.py --threads 1 --as-avx2 -o /tmp/auto-avx2.json

A fresh autotune cache (a temporary folder) unless --cache is given; the same call is made twice (the second reads
the first's timings, measures what the budget left out and rebuilds the winner). Weights: random, perturbed, and a
head with std 0.5 so that top-1 margins are wide as in a trained model (a random model's logits nearly tie, and
every lossy mode would fail the agreement rule); calibration: random images.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import vitlab
from vitlab.bench.timing import machine_info, perturb_
from vitlab.perf import cpu

AVX2_FLAGS = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c"})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="ViT-B/16")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--calib", type=int, default=32, help="random calibration images")
    p.add_argument("--budget", type=float, default=None, help="budget_s (default: vitlab's, 120 s)")
    p.add_argument("--as-avx2", action="store_true", help="fake an AVX2-only CPU's flags for vitlab's planning")
    p.add_argument("--cache", type=Path, default=None)
    p.add_argument("-o", "--out", type=Path, required=True)
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for name in ("torch", "onnxscript", "onnx_ir", "nncf"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if a.as_avx2:
        cpu.cpu_flags = lambda *args: AVX2_FLAGS  # type: ignore[assignment,misc]
    os.environ["VITLAB_CACHE"] = str(a.cache or tempfile.mkdtemp(prefix="vitlab-auto-"))
    os.environ.setdefault("VITLAB_AUTOTUNE", "on")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = perturb_(vitlab.create_model(a.model, num_classes=1000).eval())
    with torch.no_grad():
        model.head.weight.normal_(0, 0.5)
    calib = torch.randn(a.calib, 3, model.cfg.img_size, model.cfg.img_size)
    out: dict = {"machine": machine_info(), "as_avx2": a.as_avx2, "calls": []}
    for _ in range(2):
        t0 = time.perf_counter()
        fast = vitlab.optimize(model, "auto", calib=calib, budget_s=a.budget)
        r = fast.auto_report
        out["calls"].append({"wall_s": time.perf_counter() - t0, "chosen": r.chosen, "host_class": r.host_class,
                             "candidates": r.candidates, "timings": r.timings, "build_s": r.build_s,
                             "skipped": r.skipped, "load": os.getloadavg()[0]})
        logging.info("auto call %d: %.0f s -> %s", len(out["calls"]), out["calls"][-1]["wall_s"], r.chosen)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
