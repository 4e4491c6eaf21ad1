"""int8 on the CPU: our static int8 (PT2E + Inductor) against OpenVINO int8 (NNCF) and ONNX Runtime int8.

    .venv/bin/python benchmarks/int8.py speed --model ViT-B/16 --batches 8 1 --rounds 5 --threads 1
    .venv/bin/python benchmarks/int8.py accuracy [--checkpoint CKPT]    # 10,000 Fashion-MNIST test images

`--modes ... int8-static-fp32attn` adds int8-static with attention kept in fp32 (what int8-static ran before
attention went bf16 on hosts with native bf16), `int8-static-bf16flash` / `int8-static-bf16math` with attention in
bf16 through the flash kernel / written out, `int8-static-int8attn` with vitlab's fused int8 attention
(`quant.attention_plan` picks one per host class), to see what each buys in the same rounds; `int8-static-fp32out` /
`int8-static-bf16out` with the linear layers writing fp32 / bf16 (`quant.linear_outputs_dtype` picks per host
class); `int8-static-inductorln` with Inductor's loop for LayerNorm + quantise (what int8-static ran before
`vitlab::layer_norm_quantized`, 2026-12-07); `int8-static-pywrapper` with Inductor's Python wrapper (what
int8-static ran before its C++ wrapper, 2026-12-07); `openvino-int8` quantises with NNCF's
`model_type=TRANSFORMER` (vitlab's OpenVINO int8 since 2026-12-06), `openvino-int8-nncf-default` with NNCF's defaults,
`ort-int8-dynamic` ONNX Runtime's dynamic int8 (the peers at their best settings on some hosts), and
`ort-int8-torchscript` / `ort-int8-dynamic-torchscript` ONNX Runtime's on the graph of torch's TorchScript exporter
(dynamo=False) instead of `vitlab export`'s.

speed: every mode built on the same weights (ViT-B/16 at 224 px, random-init weights perturbed: timing does not
depend on the values), calibrated on the same images; then interleaved rounds (each round calls every mode once,
in turn, the order rotated each round, a --pause before each call), per batch size. Reported: median seconds,
images/s, ratio of each runtime's time to ours in the same round (median over rounds; > 1 = ours faster), and the
fraction of the int8 matmul peak measured at the start (`vitlab.bench.matmul_peak`: torch._int_mm on 2048^3, u8/s8
VNNI GEMMs through oneDNN) that the model's FLOPs (`vitlab.models.flops.count_flops`) reach. Then a torch.profiler
table of one static-int8 call. Load average before and
after. JSON + text under --out.

accuracy: a trained Fashion-MNIST model (--checkpoint, else one trained here for --train-s seconds by
benchmarks/mode_accuracy.py's recipe), calibrated on the first --calib training images; top-1 agreement with the
fp32 model and accuracy on the 10,000 test images, for each int8 mode.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import profile

import vitlab
from vitlab.bench import machine_info
from vitlab.bench.timing import loadavg, matmul_peak, perturb_
from vitlab.deploy import quant
from vitlab.models.flops import count_flops
from vitlab.train.recipe import data_config_from_dict, load_recipe
from vitlab.utils.io import write_atomic

OURS = "int8-static"
FP32_ATTENTION = "int8-static-fp32attn"  # int8-static with attention kept in fp32 (quantize_static(attention="fp32"))
# int8-static with attention as other hosts run it (the flash kernel in bf16: AMX's choice; written out in bf16),
# with its linear layers' outputs forced one way (quantize_static(outputs=...); "auto" picks per host class), or with
# Inductor's Python wrapper (cpp_wrapper=False): quantize_static's keywords for each variant
PYWRAPPER = "int8-static-pywrapper"
VARIANTS: dict[str, dict[str, Any]] = {
    FP32_ATTENTION: {"attention": "fp32"}, "int8-static-bf16flash": {"attention": "bf16"},
    "int8-static-bf16math": {"attention": "bf16-math"}, "int8-static-fp32out": {"outputs": "fp32"},
    "int8-static-bf16out": {"outputs": "bf16"}, PYWRAPPER: {"cpp_wrapper": False},
    "int8-static-int8attn": {"attention": "int8"}, "int8-static-inductorln": {"layernorm": "inductor"},
    "int8-static-onednn": {"gemm": "onednn"}}
OV_NNCF_DEFAULT = "openvino-int8-nncf-default"  # NNCF with its default model type (what openvino-int8 was)
# ONNX Runtime int8 of the TorchScript exporter's graph (`ort_torchscript`)
ORT_TORCHSCRIPT = {"ort-int8-torchscript": "static", "ort-int8-dynamic-torchscript": "dynamic"}


def openvino_nncf_default(model: torch.nn.Module, calib: torch.Tensor, example: torch.Tensor) -> torch.nn.Module:
    """OpenVINO int8 quantised by NNCF with its default model type, f32 inference-precision hint (the comparison for
    `openvino-int8`, which uses `model_type=TRANSFORMER`)."""
    import nncf

    from vitlab.deploy import runtimes

    ov_model = runtimes.openvino_model(copy.deepcopy(model).eval(), example, calib=None)
    with runtimes._quiet():
        data = [c.numpy() for c in calib.split(1)]
        ov_model = nncf.quantize(ov_model, nncf.Dataset(data), subset_size=len(data))
    compiled = runtimes.compile_openvino(ov_model)
    chw = (int(example.shape[1]), int(example.shape[2]), int(example.shape[3]))
    return runtimes.RuntimeModule(runtimes._ov_runner(compiled), "openvino", "int8", chw, keep=compiled)


def ort_torchscript(model: torch.nn.Module, method: str, calib: torch.Tensor, example: torch.Tensor
                    ) -> torch.nn.Module:
    """ONNX Runtime int8 (`method` "static" or "dynamic", vitlab's quantisation settings) of the graph torch's
    TorchScript exporter writes (`torch.onnx.export(..., dynamo=False)`, opset 17): the comparison for `ort-int8*`,
    which run the graph of `vitlab export` (the dynamo exporter), to show ONNX Runtime's speed does not hinge on
    which exporter wrote its graph."""
    import io
    import tempfile
    from contextlib import redirect_stderr, redirect_stdout

    from vitlab.deploy import runtimes

    chw = (int(example.shape[1]), int(example.shape[2]), int(example.shape[3]))
    with tempfile.TemporaryDirectory(prefix="vitlab-ts-") as tmp:
        src, dest = Path(tmp) / "model.onnx", Path(tmp) / "model.int8.onnx"
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            torch.onnx.export(copy.deepcopy(model).eval(), (example[:1],), str(src), input_names=["images"],
                              output_names=["logits"], dynamic_axes={"images": {0: "batch"}}, opset_version=17,
                              dynamo=False)
        data = [c.numpy() for c in calib.split(1)] if method == "static" else None
        runtimes.quantize_onnx(src, dest, data, method)
        session = runtimes.ort_session(dest)
    return runtimes.RuntimeModule(lambda x: session.run(["logits"], {"images": x})[0], "onnxruntime", "int8", chw,
                                  keep=session)


def build_modes(model: torch.nn.Module, modes: list[str], calib: torch.Tensor, example: torch.Tensor
                ) -> dict[str, torch.nn.Module]:
    out: dict[str, torch.nn.Module] = {}
    for mode in modes:
        t = time.perf_counter()
        try:
            if mode in VARIANTS:  # int8-static with one of its choices forced one way (the comparison)
                out[mode] = quant.quantize_static(copy.deepcopy(model).eval(), calib, **VARIANTS[mode])[1]
            elif mode == OV_NNCF_DEFAULT:
                out[mode] = openvino_nncf_default(model, calib, example)
            elif mode in ORT_TORCHSCRIPT:
                out[mode] = ort_torchscript(model, ORT_TORCHSCRIPT[mode], calib, example)
            else:
                out[mode] = model.eval() if mode == "fp32" else vitlab.optimize(model, mode, calib=calib,
                                                                                 example=example)
        except Exception as e:  # a missing runtime is reported and skipped, not fatal
            print(f"  {mode}: cannot build: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
            continue
        print(f"  built {mode} in {time.perf_counter() - t:.0f} s", flush=True)
    return out


def speed(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    model = perturb_(vitlab.create_model(args.model, num_classes=1000).eval())
    cfg = model.cfg
    chw = (cfg.in_chans, cfg.img_size, cfg.img_size)
    calib = torch.randn(args.calib, *chw)
    result: dict[str, Any] = {"machine": machine_info(), "threads": args.threads, "model": args.model,
                              "load_start": loadavg(), "modes": args.modes, "batches": {}}
    peaks = {"int8": matmul_peak(torch.int8, "cpu", 2048), "fp32": matmul_peak(torch.float32, "cpu", 2048)}
    result["matmul_peak_flops"] = peaks  # FLOP/s
    print(f"matmul peaks GFLOP/s: int8 {peaks['int8'] / 1e9:.0f}, fp32 {peaks['fp32'] / 1e9:.0f}; load {loadavg()}",
          flush=True)
    lines = []
    fns = build_modes(model, args.modes, calib, torch.randn(max(args.batches), *chw))  # runtimes: batch dynamic
    for b in args.batches:
        x = torch.randn(b, *chw)
        with torch.no_grad():
            for f in fns.values():  # warm-up: compile for this batch size, caches
                for _ in range(2):
                    f(x)
            secs: dict[str, list[float]] = {m: [] for m in fns}
            faults: dict[str, list[int]] = {m: [] for m in fns}  # minor page faults of the process during each call
            names = list(fns)
            for r in range(args.rounds):
                # each round in another order, with a pause before each call: the runtimes' worker threads spin on
                # after a call (ONNX Runtime's intra-op pool, OpenVINO's TBB arena) and would slow whatever ran next
                for m in names[r % len(names):] + names[: r % len(names)]:
                    time.sleep(args.pause)
                    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                    t = time.perf_counter()
                    fns[m](x)
                    secs[m].append(time.perf_counter() - t)
                    faults[m].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        flops = count_flops(cfg) * b
        rows = {}
        for m in fns:
            med = statistics.median(secs[m])
            ratio = statistics.median(o / s for o, s in zip(secs[m], secs[OURS], strict=True)) if OURS in secs else None
            rows[m] = {"seconds": secs[m], "median_s": med, "img_per_s": b / med, "ours_speedup": ratio,
                       "pct_int8_peak": 100 * flops / med / peaks["int8"], "minor_faults": faults[m]}
            lines.append(f"batch {b:>2} {m:<14} {med * 1e3:9.1f} ms {b / med:7.2f} img/s  "
                         f"{'' if ratio is None else f'ours x{ratio:.2f}':>10}  "
                         f"{rows[m]['pct_int8_peak']:5.1f}% of int8 peak  "
                         f"{statistics.median(faults[m]):8.0f} page faults/call")
            print(lines[-1], flush=True)
        result["batches"][b] = rows
        if OURS in fns and b == max(args.batches):
            # the profiler sees no op under int8-static's C++ wrapper: profile the same graph with the Python one
            pywrapped = fns.get(PYWRAPPER) or quant.quantize_static(copy.deepcopy(model).eval(), calib,
                                                                     cpp_wrapper=False)[1]
            with torch.no_grad():
                pywrapped(x)
                with profile() as prof:
                    pywrapped(x)
            table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70)
            result["profile_batch"], result["profile"] = b, table
            print(table, flush=True)
    result["load_end"] = loadavg()
    lines.append(f"load average start {result['load_start']} end {result['load_end']}; threads {args.threads}")
    out = Path(args.out)
    write_atomic(out / "int8-speed.json", json.dumps(result, indent=1, default=str))
    write_atomic(out / "int8-speed.txt", "\n".join(lines) + "\n\n" + result.get("profile", "") + "\n")
    return result


def accuracy(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).parent))
    from mode_accuracy import train_briefly  # the recipe of the other accuracy benchmark

    from vitlab.data.build import build_eval_data
    from vitlab.data.config import DataConfig

    data = data_config_from_dict(load_recipe(args.recipe).data) if args.recipe else DataConfig(dataset="fashion_mnist")

    def batches(split: str, img_size: int, in_chans: int, batch_size: int) -> Any:
        return build_eval_data(data, split, img_size=img_size, in_chans=in_chans, batch_size=batch_size)

    if args.checkpoint:
        model = vitlab.load_model(args.checkpoint).eval()
        trained = {"checkpoint": args.checkpoint, "recipe": args.recipe}
    else:
        model, trained = train_briefly(args.train_s)
        model.eval()
    cfg = model.cfg
    calib = []
    for x, _ in batches("train", cfg.img_size, cfg.in_chans, 64):
        calib.append(x)
        if sum(len(c) for c in calib) >= args.calib:
            break
    calib_t = torch.cat(calib)[: args.calib]
    test = list(batches("test", cfg.img_size, cfg.in_chans, 250))
    fns = build_modes(model, ["fp32", *args.modes], calib_t, test[0][0][:8])
    res: dict[str, Any] = {"machine": machine_info(), "trained": trained, "calib_images": len(calib_t),
                           "load_start": loadavg(), "modes": {}}
    with torch.no_grad():
        ref = torch.cat([model(x).argmax(1) for x, _ in test])
        labels = torch.cat([y for _, y in test])
        for m, f in fns.items():
            pred = torch.cat([f(x).argmax(1) for x, _ in test])
            res["modes"][m] = {"agreement": float((pred == ref).float().mean()),
                               "accuracy": float((pred == labels).float().mean()), "images": len(labels)}
            print(f"{m:<14} agreement {100 * res['modes'][m]['agreement']:6.2f}%  "
                  f"accuracy {100 * res['modes'][m]['accuracy']:6.2f}%  ({len(labels)} test images)", flush=True)
    res["load_end"] = loadavg()
    write_atomic(Path(args.out) / "int8-accuracy.json", json.dumps(res, indent=1, default=str))
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("speed")
    s.add_argument("--model", default="ViT-B/16")
    s.add_argument("--batches", type=int, nargs="+", default=[8, 1])
    s.add_argument("--modes", nargs="+", default=["fp32", "int8", OURS, "openvino-int8", "ort-int8"])
    s.add_argument("--rounds", type=int, default=5)
    s.add_argument("--calib", type=int, default=32, help="calibration images (random here: speed only)")
    s.add_argument("--pause", type=float, default=0.3,
                   help="seconds of idle before each timed call (lets other runtimes' spinning threads sleep)")
    a = sub.add_parser("accuracy")
    a.add_argument("--checkpoint")
    a.add_argument("--recipe", help="the checkpoint's recipe: its data section preprocesses the images")
    a.add_argument("--train-s", type=float, default=240)
    a.add_argument("--modes", nargs="+", default=["bf16", "int8", OURS, "openvino-int8", "ort-int8"])
    a.add_argument("--calib", type=int, default=128, help="calibration images from the training split")
    for q in (s, a):
        q.add_argument("--threads", type=int, default=1)
        q.add_argument("--out", default="benchmarks/results/int8")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    (speed if args.cmd == "speed" else accuracy)(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
