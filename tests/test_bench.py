"""`vitlab bench`: the peers it builds compute our function, and a tiny run produces the promised outputs.

No timing is asserted here (speed lives in benchmarks/); only what the numbers are made of.
"""

import json
import logging
import time

import pytest
import torch

import vitlab
from vitlab.bench import (
    BUILDERS,
    BenchConfig,
    Result,
    format_table,
    mode_accuracy,
    peak_memory,
    run_bench,
    write_outputs,
)
from vitlab.bench.suite import _paired_ratios
from vitlab.bench.timing import EMULATION_VARS, machine_info
from vitlab.perf import cpu

from .conftest import perturb_


def _tiny(**kw):
    cfg = dict(depth=2, img_size=32, patch_size=8, num_classes=10)
    cfg.update(kw)
    return perturb_(vitlab.create_model("ViT-Ti/16", **cfg)).eval()


@pytest.mark.parametrize("peer", ["timm", "transformers", "torchvision"])
def test_peer_copies_compute_our_logits(peer):
    model = _tiny()
    other = BUILDERS[peer](model).eval()
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        ours, theirs = model(x), other(x)
    assert ours.abs().max() > 1e-3
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)


def test_paired_ratios_are_peer_time_over_ours():
    rs = [
        Result("infer", "ours", "fp32", 8, [1.0, 2.0, 1.0], 1e9, 1e11),
        Result("infer", "timm", "fp32", 8, [2.0, 2.0, 3.0], 1e9, 1e11),
        Result("infer", "timm", "bf16", 8, [9.0, 9.0, 9.0], 1e9, 1e11),
        Result("infer", "ours[int8]", "int8", 8, [0.5, 0.5, 0.5], 1e9, None),
        Result("infer", "ours[auto]", "bf16", 8, [0.5, 1.0, 0.5], 1e9, None),
        Result("infer", "openvino-int8", "int8", 8, [1.0, 1.0, 2.0], 1e9, None),
    ]
    _paired_ratios(rs)
    assert rs[0].ratio_vs == {"timm/fp32": 2.0}  # median of 2/1, 2/2, 3/1; the bf16 peer is not comparable
    # a speed mode is compared with the fp32 eager peers and those of its own dtype
    assert rs[3].ratio_vs == {"timm/fp32": 4.0, "openvino-int8/int8": 2.0}
    # auto, whatever dtype it picked, with every peer
    assert rs[4].ratio_vs == {"timm/fp32": 4.0, "timm/bf16": 18.0, "openvino-int8/int8": 2.0}
    s = rs[0].summary()
    assert s["images_per_s"] == 8 / 1.0 and s["mfu"] == pytest.approx(1e9 / 1.0 / 1e11)


def test_a_speed_mode_is_costed_at_the_dtype_of_the_mode_that_ran(monkeypatch):
    """`auto` returns an fp32-in / fp32-out model whichever mode it chose; an int8 choice is costed as int8 (MFU
    against the int8 peak: against the fp32 one it read 305% on a Zen 4)."""
    from vitlab.bench import suite

    class Chosen:
        mode, dtype = "int8-static", torch.float32

    monkeypatch.setattr(suite, "optimize", lambda model, mode, calib=None: Chosen())
    bc = BenchConfig(model="ViT-Ti/16", peers=(), modes=("auto", "int8-static"))
    cands = suite._inference_candidates(_tiny(), bc, "fp32", {}, torch.randn(4, 3, 32, 32))
    assert cands["ours[auto]"][1] == cands["ours[int8-static]"][1] == "int8"


def test_peak_memory_sees_a_large_allocation():
    def alloc():
        x = torch.ones(64 * 2**20 // 4)  # 64 MiB, written so its pages are resident
        time.sleep(0.05)  # held long enough for the 1 ms sampler to see it however loaded the machine is
        return float(x[::4096].sum())

    assert peak_memory(alloc) >= 48 * 2**20


def test_mode_accuracy_reports_agreement_and_accuracy():
    model = _tiny()
    x = torch.randn(40, 3, 32, 32)
    with torch.no_grad():
        labels = model(x).argmax(1)  # the fp32 model is right on every image by construction
    report = mode_accuracy(model, x, labels, ("fp16",), batch_size=16)
    assert report["fp32"] == {"agreement_with_fp32": 1.0, "accuracy": 1.0}
    assert report["fp16"]["agreement_with_fp32"] == report["fp16"]["accuracy"] >= 0.9


@pytest.mark.slow
def test_tiny_bench_end_to_end(tmp_path, caplog):
    bc = BenchConfig(
        model="ViT-Ti/16", img_size=32, batch_sizes=(2,), dtypes=("fp32", "bf16"),
        peers=("timm", "torchvision"), modes=("int8",), train_batch=2, train_peers=("timm",),
        warmup=1, rounds=2, peak_size=128, overrides={"depth": 1, "patch_size": 8, "num_classes": 10},
    )
    with caplog.at_level(logging.INFO, logger="vitlab"):
        out = run_bench(bc)
    assert "measuring matmul peaks" in caplog.text  # progress is logged (vitlab.bench.*), not printed
    assert all(r.name.startswith("vitlab.bench") for r in caplog.records)
    paths = write_outputs(out, tmp_path)
    assert [p.name for p in paths] == ["bench.json", "bench.txt", "bench.png"]
    data = json.loads((tmp_path / "bench.json").read_text())
    assert {"machine", "config", "matmul_peak_gflops", "results"} <= set(data)
    assert {"fp32", "bf16", "int8"} <= set(data["matmul_peak_gflops"])
    # measured at the start and at the end; the larger is the peak every MFU is against
    start, end = data["matmul_peak_gflops_start"], data["matmul_peak_gflops_end"]
    assert data["matmul_peak_gflops"] == {k: max(start[k], end[k]) for k in start}
    for r in data["results"]:
        assert r["peak_flops"] == pytest.approx(data["matmul_peak_gflops"][r["dtype"]] * 1e9)
    assert data["machine"]["loadavg_start"] is not None
    names = {(r["task"], r["name"], r["dtype"]) for r in data["results"]}
    assert {("infer", "ours", "fp32"), ("infer", "timm", "fp32"), ("infer", "torchvision", "bf16"),
            ("infer", "ours[int8]", "int8"), ("train", "ours", "bf16"), ("train", "ours[grad-ckpt]", "fp32"),
            ("train", "timm", "fp32")} <= names
    for r in data["results"]:
        assert len(r["seconds"]) == 2 and r["min_s"] <= r["median_s"] <= r["max_s"]
        for key in ("images_per_s", "images_per_s_min", "images_per_s_max", "latency_ms", "gflops_per_s",
                    "peak_memory_bytes"):
            assert key in r
        flops = vitlab.count_flops(vitlab.ViTConfig.from_name("ViT-Ti/16", **bc.overrides, img_size=32),
                                   backward=r["task"] == "train")
        assert r["flops_per_call"] == flops * r["batch"]
        if r["name"] == "ours":
            assert f"timm/{r['dtype']}" in r["ratio_vs"]
    assert "ours[int8]" in format_table(out)
    host = cpu.host_class()  # every number says the class of CPU it was measured on
    assert data["machine"]["host_class"] == host and all(r["host_class"] == host for r in data["results"])
    table = format_table(out).splitlines()
    rows = [line.split() for line in table if line.split()[1:2] in (["infer"], ["train"])]
    assert f"host class {host}" in table[0] and len(rows) == len(data["results"]) and all(r[0] == host for r in rows)


def test_machine_info_names_the_host_class_and_emulation(monkeypatch):
    from vitlab.bench.output import _emulation

    monkeypatch.setattr(cpu, "cpu_flags", lambda *a: frozenset({"avx2", "avx512f", "avx512_vnni"}))
    for var in EMULATION_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    info = machine_info()
    assert info["host_class"] == "AVX-512+VNNI" and info["cpu_flags"] == ["avx512_vnni", "avx512f", "avx2"]
    assert info["emulation"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert _emulation(info) == " (kernels emulated: ONEDNN_MAX_CPU_ISA=AVX2)"
