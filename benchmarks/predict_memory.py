"""Peak resident memory of `vitlab predict` and `vitlab eval` against the number of images (issue 35).

    .venv/bin/python benchmarks/predict_memory.py                       # ViT-S/16, 400 and 4000 JPEGs
    .venv/bin/python benchmarks/predict_memory.py --counts 400 4000 --commands predict eval --rounds 2

Writes N JPEGs of 320x240 (random smooth colour fields, so the decoder does real work) into a temporary folder laid
out as an imagefolder tree (two classes), saves a randomly initialised checkpoint of --model with 2 classes, then
runs each command as a new process (`python -m vitlab.cli ...`, each with its own empty autotune cache, as a new
user's), the counts interleaved per round. Each process's peak resident set is its `ru_maxrss` from `os.wait4` (the
kernel's high-water mark of that process alone, every library included), printed beside its wall time and images/s
over the process's whole life (import, load, decode, forward), and at the end the marginal images/s between the
smallest and largest count (the steady rate, start-up cancelled). The load average is printed before and after every
run. JSON under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def make_images(root: Path, n: int, size: tuple[int, int] = (320, 240)) -> list[str]:
    """`n` JPEGs of `size` (w, h) under root/{a,b}/; returns their paths."""
    rng = np.random.default_rng(0)
    w, h = size
    paths = []
    base = rng.integers(0, 256, (n % 97 + 16, h // 8, w // 8, 3), dtype=np.uint8)  # a few tiles, reused
    for i in range(n):
        d = root / ("a" if i % 2 == 0 else "b")
        d.mkdir(parents=True, exist_ok=True)
        img = Image.fromarray(base[i % len(base)]).resize((w, h), Image.Resampling.BILINEAR)
        p = d / f"img{i:05d}.jpg"
        img.save(p, quality=90)
        paths.append(str(p))
    return paths


def run_peak(cmd: list[str], env: dict[str, str], out: Path) -> dict[str, Any]:
    """Run `cmd` with its stdout to `out`; its peak RSS (MiB, from the kernel's ru_maxrss of that child alone), wall
    seconds, exit code."""
    t = time.perf_counter()
    with open(out, "wb") as stdout:
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.PIPE, env=env)
        assert proc.stderr is not None
        with proc.stderr:
            err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t
    return {"peak_rss_mb": usage.ru_maxrss / 1024, "wall_s": wall, "rc": proc.returncode,
            "stderr_tail": err.decode(errors="replace")[-2000:] if proc.returncode else ""}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="ViT-S/16")
    p.add_argument("--counts", type=int, nargs="+", default=[400, 4000])
    p.add_argument("--commands", nargs="+", default=["predict", "eval"], choices=["predict", "eval"])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more arguments for every command")
    p.add_argument("--out", default="benchmarks/results/predict-memory")
    args = p.parse_args(argv)

    import torch

    import vitlab
    from vitlab.perf.cpu import machine_summary
    from vitlab.utils.io import write_atomic

    results: list[dict[str, Any]] = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every row: a run stopped part-way keeps what it measured
        write_atomic(out / "predict-memory.json", json.dumps(
            {"model": args.model, "threads": args.threads, "torch": torch.__version__, "machine": machine_summary(),
             "runs": results}, indent=1), overwrite=True)

    with tempfile.TemporaryDirectory(prefix="vitlab-predict-mem-") as tmp:
        tmpd = Path(tmp)
        torch.manual_seed(0)
        ckpt = tmpd / "model.safetensors"
        model = vitlab.create_model(args.model, num_classes=2)
        torch.nn.init.normal_(model.head.weight, std=0.02)  # a zero head (the default init) is refused as untrained
        vitlab.save_weights(model, ckpt, {"classes": ["a", "b"]})
        del model
        trees = {n: (tmpd / f"imgs{n}", make_images(tmpd / f"imgs{n}", n)) for n in args.counts}
        print(f"{args.model}, {args.threads} threads, images 320x240 JPEG; load {loadavg()}", flush=True)
        for r in range(args.rounds):
            for cmd_name in args.commands:
                for n in args.counts:
                    root, paths = trees[n]
                    if cmd_name == "predict":
                        cmd = [sys.executable, "-m", "vitlab.cli", "predict", str(ckpt), *paths, "--json", *args.extra]
                    else:
                        cmd = [sys.executable, "-m", "vitlab.cli", "eval", str(ckpt), "--data", f"imagefolder:{root}",
                               "--json", *args.extra]
                    before = loadavg()
                    cache = tmpd / f"cache-{r}-{cmd_name}-{n}"  # an empty autotune cache: what a new user has
                    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "VITLAB_CACHE": str(cache)}
                    res = run_peak(cmd, env, tmpd / "stdout.json")
                    row = {"round": r, "command": cmd_name, "images": n, **res, "img_per_s": n / res["wall_s"],
                           "load_before": before, "load_after": loadavg()}
                    if cmd_name == "eval" and res["rc"] == 0:  # what `--precision auto` chose: it sets the footprint
                        row["precision"] = json.loads((tmpd / "stdout.json").read_text())["precision"]
                    results.append(row)
                    save()
                    print(f"round {r} {cmd_name:<7} {n:>6} images: peak RSS {res['peak_rss_mb']:7.0f} MiB  "
                          f"{res['wall_s']:6.1f} s  {row['img_per_s']:6.1f} img/s (whole process)  "
                          f"{row.get('precision', '')}  rc {res['rc']}  load {before} -> {row['load_after']}",
                          flush=True)
                    if res["rc"]:
                        print(res["stderr_tail"], file=sys.stderr)
    for cmd_name in args.commands:
        peaks = {n: max(x["peak_rss_mb"] for x in results if x["command"] == cmd_name and x["images"] == n)
                 for n in args.counts}
        lo, hi = min(args.counts), max(args.counts)
        wall = {n: min(x["wall_s"] for x in results if x["command"] == cmd_name and x["images"] == n)
                for n in args.counts}
        rate = f", marginal {(hi - lo) / (wall[hi] - wall[lo]):.1f} img/s" if hi > lo and wall[hi] > wall[lo] else ""
        print(f"{cmd_name}: peak RSS {peaks[lo]:.0f} MiB at {lo} images, {peaks[hi]:.0f} MiB at {hi} "
              f"({peaks[hi] / peaks[lo]:.3f}x){rate}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
