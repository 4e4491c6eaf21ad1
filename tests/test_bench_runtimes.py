"""`vitlab bench` with the deployment runtimes: OpenVINO and ONNX Runtime peers are built from our weights, checked
against our logits before timing, and reported with their accuracy cost beside their speed."""

import pytest

from vitlab.bench import RUNTIME_PEERS, BenchConfig, format_table, run_bench

pytest.importorskip("openvino")
pytest.importorskip("nncf")
pytest.importorskip("onnxruntime")


@pytest.mark.slow
def test_runtime_peers_are_checked_timed_and_costed():
    bc = BenchConfig(
        model="ViT-Ti/16", img_size=28, batch_sizes=(2,), dtypes=("fp32",), peers=tuple(RUNTIME_PEERS),
        modes=("int8",), train_batch=None, warmup=1, rounds=2, peak_size=128, accuracy_data="synthetic",
        accuracy_images=24, calib_images=16,
        overrides={"depth": 1, "patch_size": 7, "in_chans": 1, "num_classes": 10},
    )
    out = run_bench(bc)
    rows = {r["name"]: r for r in out["results"]}
    assert set(RUNTIME_PEERS) <= set(rows), out["skipped"]
    assert rows["openvino"]["dtype"] == rows["onnxruntime"]["dtype"] == "fp32"
    assert rows["openvino-int8"]["dtype"] == rows["onnxruntime-int8"]["dtype"] == "int8"
    for name in ("ours", "openvino", "onnxruntime"):  # fp32 runtimes compute our function
        assert rows[name]["agreement"] == 1.0 and rows[name]["max_logit_diff"] < 1e-3, name
    for name in ("openvino-int8", "onnxruntime-int8", "ours[int8]"):  # int8: a real cost, measured
        assert 0.5 <= rows[name]["agreement"] <= 1.0 and rows[name]["max_logit_diff"] > 1e-4, name
        assert len(rows[name]["seconds"]) == 2
    assert {"openvino/fp32", "onnxruntime/fp32"} <= set(rows["ours"]["ratio_vs"])
    assert {"openvino-int8/int8", "onnxruntime-int8/int8", "openvino/fp32"} <= set(rows["ours[int8]"]["ratio_vs"])
    assert "24 synthetic/test images" in rows["openvino"]["note"]
    table = format_table(out)
    assert "openvino-int8" in table and "agree" in table
