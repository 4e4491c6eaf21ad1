"""Every speed mode of `vitlab.optimize` against timm fp32 on this host, interleaved: what `auto` should pick here.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/host_modes.py --threads 1 -o benchmarks/results/host-modes-amx
    # an AVX2-only CPU's kernels on a bigger one (torch/Inductor, oneDNN, FBGEMM and MKL honour these; ONNX Runtime
    # and OpenVINO dispatch on the real CPU, so their rows are NOT emulated):
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
        OMP_NUM_THREADS=1 .venv/bin/python benchmarks/host_modes.py --threads 1 -o benchmarks/results/host-modes-avx2emu

Each mode is built once (its build time and first call, which compiles for the compile modes, are recorded), then
`--rounds` rounds call every candidate once each, the order reversed every other round; reported: median seconds
per batch, images/s, and the median over rounds of (timm time / mode time) in the same round (>1: faster than timm
fp32). Weights: a random ViT (perturbed so logits differ), the same in every mode; agreement is top-1 with our fp32
model on `--check` random images (a random model's logits are close: a weak check; `benchmarks/int8.py accuracy`
measures a trained one). The machine (host class, flags, emulation variables, load) is in the JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import vitlab
from vitlab.bench.timing import machine_info, perturb_


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="ViT-B/16")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--check", type=int, default=16, help="random images for the agreement column")
    p.add_argument("--modes", nargs="+", default=["fp32", "int8", "compile", "ort-int8-dynamic", "ort"])
    p.add_argument("-o", "--out", type=Path, required=True)
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = perturb_(vitlab.create_model(a.model, num_classes=1000).eval())
    import timm

    cfg = model.cfg
    peer = timm.models.vision_transformer.VisionTransformer(
        img_size=cfg.img_size, patch_size=cfg.patch_size, embed_dim=cfg.embed_dim, depth=cfg.depth,
        num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_dim / cfg.embed_dim, num_classes=cfg.num_classes).eval()
    peer.load_state_dict(model.state_dict())
    x = torch.randn(a.batch, 3, cfg.img_size, cfg.img_size)
    check = torch.randn(a.check, 3, cfg.img_size, cfg.img_size)
    with torch.no_grad():
        ref = torch.cat([model(c) for c in check.split(a.batch)])
    out: dict = {"machine": machine_info(), "args": {k: str(v) for k, v in vars(a).items()}, "modes": {}}
    calls = {"timm fp32": lambda: peer(x)}
    for mode in a.modes:
        t0 = time.perf_counter()
        try:
            fast = vitlab.optimize(model, mode, calib=check, example=x)
        except Exception as e:
            out["modes"][mode] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            logging.info("%s: %s", mode, out["modes"][mode]["error"])
            continue
        build = time.perf_counter() - t0
        t0 = time.perf_counter()
        with torch.no_grad():
            fast(x)
        first = time.perf_counter() - t0
        with torch.no_grad():
            got = torch.cat([fast(c) for c in check.split(a.batch)])
        out["modes"][mode] = {"build_s": build, "first_call_s": first,
                              "agreement": float((got.argmax(1) == ref.argmax(1)).float().mean()),
                              "max_logit_diff": float((got - ref).abs().max())}
        logging.info("%s built in %.1f s, first call %.1f s", mode, build, first)
        calls[mode] = (lambda f: lambda: f(x))(fast)
    names = list(calls)
    times: dict[str, list[float]] = {n: [] for n in names}
    with torch.no_grad():
        for n in names:  # warm-up
            calls[n]()
        for r in range(a.rounds):
            for n in names if r % 2 == 0 else names[::-1]:
                t0 = time.perf_counter()
                calls[n]()
                times[n].append(time.perf_counter() - t0)
            logging.info("round %d: %s (load %.2f)", r, ", ".join(f"{n} {times[n][-1]:.2f}s" for n in names),
                         os.getloadavg()[0])
    out["machine"]["loadavg_end"] = list(os.getloadavg())
    rows = []
    for n in names:
        med = statistics.median(times[n])
        ratio = statistics.median(t / s for t, s in zip(times["timm fp32"], times[n], strict=True))
        info = out["modes"].setdefault(n, {})
        info.update(seconds=times[n], median_s=med, images_per_s=a.batch / med, vs_timm_fp32=ratio)
        cost = f"{info['build_s'] + info['first_call_s']:.0f} s" if "build_s" in info else "-"
        agree = f"{100 * info['agreement']:.0f}%" if "agreement" in info else "-"
        rows.append(f"| {n} | {a.batch / med:.2f} | {ratio:.2f}x | {cost} | {agree} |")
    m = out["machine"]
    head = (f"{a.model} batch {a.batch}, {a.threads} thread(s), {a.rounds} interleaved rounds; host class "
            f"{m['host_class']} ({m['cpu']}); emulation: {m.get('emulation', 'none')}; load {m['loadavg_start']} -> "
            f"{m['loadavg_end']}")
    table = "\n".join([head, "", "| mode | img/s | vs timm fp32 (paired) | build + first call | top-1 agreement |",
                       "|---|---:|---:|---:|---:|", *rows])
    for n, info in out["modes"].items():
        if "error" in info:
            table += f"\n{n}: {info['error']}"
    print(table)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "host-modes.json").write_text(json.dumps(out, indent=1, default=str) + "\n")
    (a.out / "host-modes.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
