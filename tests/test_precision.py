"""`precision: auto` decided by measuring: the choice follows the timings (a fake clock here), is cached per machine
and shape, falls back to the CPU-flag rule with VITLAB_AUTOTUNE=off, and the measurement leaves the run alone."""

from __future__ import annotations

import logging
import types

import pytest
import torch

from vitlab.inference.evaluate import evaluate
from vitlab.models.config import ViTConfig
from vitlab.models.vit import VisionTransformer
from vitlab.perf import autotune, cpu, precision
from vitlab.train import train
from vitlab.train.recipe import Recipe
from vitlab.train.tune import train_precision

TINY = {"embed_dim": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64, "img_size": 28, "patch_size": 7, "in_chans": 1}


@pytest.fixture
def tuned(tmp_path, monkeypatch):
    """Autotune on, its cache in tmp_path, and the clock replaced: fp32 calls take 2 s, bf16 calls 1 s (or as the
    test sets `tuned["seconds"]`); `tuned["calls"]` lists the precisions run."""
    monkeypatch.setenv("VITLAB_AUTOTUNE", "on")
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(autotune, "_load", lambda: 0.5)  # a quiet machine: nothing measured again for load
    for var in cpu.EMULATION_VARS:  # a plain host (the suite may run under kernel emulation; tested below)
        monkeypatch.delenv(var, raising=False)
    zen4 = frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni"})  # native bf16: "auto" measures
    monkeypatch.setattr(cpu, "cpu_flags", lambda *a: zen4)
    state = {"now": 0.0, "seconds": {"fp32": 2.0, "bf16": 1.0}, "calls": []}
    monkeypatch.setattr(precision, "_clock", lambda: state["now"])

    def runner(run):
        def timed(p):
            state["calls"].append(p)
            run(p)
            state["now"] += state["seconds"][p]
        return timed

    real = precision.time_interleaved
    monkeypatch.setattr(precision, "time_interleaved", lambda run, cands, **kw: real(runner(run), cands, **kw))
    return state


def test_time_interleaved_alternates_and_keeps_the_fastest(monkeypatch):
    clock = {"now": 0.0}
    monkeypatch.setattr(precision, "_clock", lambda: clock["now"])
    order, costs = [], {"a": iter([9, 5, 7, 3, 4]), "b": iter([9, 2, 6, 8, 1])}

    def run(c):
        order.append(c)
        clock["now"] += next(costs[c])

    assert precision.time_interleaved(run, ["a", "b"], rounds=2) == {"a": 5, "b": 2}
    assert order == ["a", "b", "a", "b", "b", "a"]  # warm-up a, b; then a, b; b, a (each round one later)


def test_one_timer_behind_bench_and_auto(monkeypatch):
    """`time_rounds` is the one timer: per-round seconds with `iters` calls averaged, rounds from a budget, and
    `time_interleaved`, bench's `time_calls` and its suite all read its clock."""
    from vitlab.bench import suite
    from vitlab.bench.timing import time_calls

    clock = {"now": 0.0}
    monkeypatch.setattr(precision, "_clock", lambda: clock["now"])
    order = []

    def run(c):
        order.append(c)
        clock["now"] += {"a": 1.0, "b": 3.0}[c]

    assert precision.time_rounds(run, ["a", "b"], warmup=2, rounds=3, iters=2) == {"a": [1.0] * 3, "b": [3.0] * 3}
    # warm-up a a b b, then rounds a a b b / b b a a / a a b b: each round starts one candidate later
    assert order == ["a", "a", "b", "b", "a", "a", "b", "b", "b", "b", "a", "a", "a", "a", "b", "b"]
    assert len(precision.time_rounds(run, ["a", "b"], warmup=0, budget_s=40.0)["a"]) == 5  # 40 s / 4 s: capped at 5
    assert len(precision.time_rounds(run, ["a", "b"], warmup=0, budget_s=1.0)["b"]) == 2  # at least 2
    assert time_calls(lambda: run("b"), warmup=1, rounds=2) == [3.0, 3.0]
    calls = {"a": lambda: run("a"), "b": lambda: run("b")}
    bc = types.SimpleNamespace(warmup=0, rounds=2, iters=1, device="cpu")
    assert suite._time_interleaved(calls, bc) == {"a": [1.0, 1.0], "b": [3.0, 3.0]}
    assert precision.time_rounds(run, ["a"], rounds=1, clock=lambda: 7.0) == {"a": [0.0]}  # a caller's own clock
    # settle_s: idle before each timed stretch, not timed; the bench settles when a runtime peer or a mode is there
    slept = []

    def sleep(s):  # the idle passes on the clock too: it must not land in a timed stretch
        slept.append(s)
        clock["now"] += s

    monkeypatch.setattr(precision.time, "sleep", sleep)
    assert precision.time_rounds(run, ["a", "b"], warmup=1, rounds=2, settle_s=0.5) == {"a": [1.0] * 2, "b": [3.0] * 2}
    assert slept == [0.5] * 4  # 2 rounds x 2 candidates, none during the warm-up
    slept.clear()
    suite._time_interleaved(calls, bc)
    assert slept == []  # torch modules only: nothing of theirs spins on
    suite._time_interleaved({"onnxruntime-int8": calls["a"], "ours[int8-static]": calls["b"]}, bc)
    assert slept == [suite.SETTLE_S] * 4
    for bad in (dict(rounds=0), dict(iters=0), dict(warmup=-1), dict(settle_s=-1.0), dict(settle_s=float("nan"))):
        with pytest.raises(ValueError):
            precision.time_rounds(run, ["a"], **bad)


@pytest.mark.parametrize(("seconds", "expected"), [({"fp32": 2.0, "bf16": 1.0}, "bf16"),
                                                   ({"fp32": 1.0, "bf16": 2.0}, "fp32")])
def test_choose_follows_the_measurement_and_caches_it(tuned, seconds, expected, caplog):
    tuned["seconds"] = seconds
    caplog.set_level(logging.INFO, logger="vitlab.precision")
    got = precision.choose_precision("auto", "cpu", kind="t", shape_key="s", run=lambda p: None)
    assert got == expected and set(tuned["calls"]) == {"fp32", "bf16"}
    assert f"precision auto -> {expected}: " in caplog.text and "measured now" in caplog.text
    assert "fp32 2000 ms" in caplog.text or "fp32 1000 ms" in caplog.text
    tuned["calls"].clear()
    tuned["seconds"] = {"fp32": seconds["bf16"], "bf16": seconds["fp32"]}  # would flip if it measured again
    assert precision.choose_precision("auto", "cpu", kind="t", shape_key="s", run=lambda p: None) == expected
    assert tuned["calls"] == [] and "measured earlier" in caplog.text
    assert precision.choose_precision("fp32", "cpu", kind="t", shape_key="s2", run=lambda p: None) == "fp32"
    assert tuned["calls"] == []


@pytest.mark.parametrize("amx", [True, False])
def test_off_keeps_the_cpu_flag_rule(monkeypatch, amx):
    monkeypatch.setenv("VITLAB_AUTOTUNE", "off")
    monkeypatch.setattr(cpu, "cpu_has_amx", lambda: amx)
    for var in cpu.EMULATION_VARS:
        monkeypatch.delenv(var, raising=False)
    ran = []
    assert precision.choose_precision("auto", "cpu", kind="t", shape_key="s", run=ran.append) == \
        ("bf16" if amx else "fp32")
    assert ran == [] and precision.resolve_precision("auto", "cpu") == ("bf16" if amx else "fp32")


@pytest.mark.parametrize("flags", [{"avx2", "fma"}, {"avx2", "avx512f", "avx512_vnni"}])  # AVX2; Cascade Lake
def test_no_native_bf16_takes_fp32_without_measuring(tuned, monkeypatch, caplog, flags):
    monkeypatch.setattr(cpu, "cpu_flags", lambda *a: frozenset(flags))

    def never(*a, **kw):
        raise AssertionError("bf16 must not be measured on a CPU without native bf16")

    monkeypatch.setattr(precision, "time_interleaved", never)
    caplog.set_level(logging.INFO, logger="vitlab.precision")
    assert precision.choose_precision("auto", "cpu", kind="t", shape_key="s", run=never) == "fp32"
    assert "precision auto -> fp32 (not measured" in caplog.text and "no native bf16" in caplog.text
    model = VisionTransformer(ViTConfig(**TINY, num_classes=3))
    assert precision.inference_precision(model, torch.randn(2, 1, 28, 28)) == "fp32"
    opt = lambda m: torch.optim.AdamW(m.parameters())  # noqa: E731
    assert train_precision(model, opt, (2, 1, 28, 28), 3, "cpu") == "fp32"
    assert tuned["calls"] == []  # no step, no forward pass timed
    assert autotune.timings("t", "s") == {}  # nothing stored: a decision, not a measurement


@pytest.mark.parametrize("autotune_mode", ["on", "off"])
def test_kernel_emulation_takes_fp32_without_measuring(tuned, monkeypatch, caplog, autotune_mode):
    """An AMX host whose kernels are held to AVX2's (how the AVX2 class is measured here) runs bf16 emulated, as
    an AVX2 host would: neither the rule nor a measurement may pick it."""
    monkeypatch.setenv("VITLAB_AUTOTUNE", autotune_mode)
    monkeypatch.setattr(cpu, "cpu_flags", lambda *a: frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}))
    monkeypatch.setattr(cpu, "cpu_has_amx", lambda: True)
    assert precision.rule_precision("cpu") == "bf16"  # the real host's rule
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setattr(precision, "time_interleaved", lambda *a, **kw: pytest.fail("bf16 measured under emulation"))
    caplog.set_level(logging.INFO, logger="vitlab.precision")
    assert precision.rule_precision("cpu") == "fp32"
    assert precision.choose_precision("auto", "cpu", kind="t", shape_key="s", run=lambda p: None) == "fp32"
    assert tuned["calls"] == [] and "precision auto -> fp32" in caplog.text
    if autotune_mode == "on":
        assert "ONEDNN_MAX_CPU_ISA=AVX2" in caplog.text


def test_bad_precision_is_named():
    with pytest.raises(ValueError, match="unknown precision 'fp16'"):
        precision.choose_precision("fp16", "cpu", kind="t", shape_key="s", run=lambda p: None)
    with pytest.raises(ValueError, match="unknown precision 'half'"):
        evaluate(torch.nn.Identity(), [(torch.zeros(1, 3), torch.zeros(1, dtype=torch.long))], 3, precision="half")


def test_model_signature_tells_shapes_apart():
    a, b = VisionTransformer(ViTConfig(**TINY)), VisionTransformer(ViTConfig(**TINY))
    assert precision.model_signature(a) == precision.model_signature(b)  # weights do not matter, shapes do
    c = VisionTransformer(ViTConfig(**{**TINY, "mlp_dim": 128}))
    assert precision.model_signature(a) != precision.model_signature(c)


def test_train_precision_leaves_model_and_random_numbers_alone(tuned):
    model = VisionTransformer(ViTConfig(**TINY, num_classes=10, dropout=0.1))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    got = train_precision(model, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3), (4, 1, 28, 28), 10, "cpu")
    assert got == "bf16"  # the fake clock makes bf16 steps twice as fast
    torch.testing.assert_close(torch.rand(3), expected_next)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.grad is None for p in model.parameters())
    shape = _only_shape("train-precision", "(4, 1, 28, 28)")
    assert autotune.timings("train-precision", shape) == {"fp32": 2.0, "bf16": 1.0}


def _only_shape(kind: str, batch: str) -> str:
    """The one shape key stored for `kind` on this machine, checked to name the model, batch and optimizer."""
    import json

    data = json.loads(autotune.default_cache().read_text())
    (shape,) = data[autotune.machine_key()][kind]
    assert "VisionTransformer" in shape and f"x{batch}" in shape and "AdamW" in shape
    return shape


def test_training_run_records_the_measured_choice(tuned, tmp_path, synthetic_data, caplog):
    r = Recipe.from_dict({"model": TINY, "data": synthetic_data,
                          "train": {"batch_size": 8, "steps": 1, "precision": "auto",
                                    "evaluators": {"eval": {"type": "classification", "max_samples": 16}}}})
    with caplog.at_level(logging.INFO, logger="vitlab.precision"):
        result = train(r, tmp_path / "run", progress=False)
    assert result.precision == "bf16" and "precision auto -> bf16" in caplog.text
    _only_shape("train-precision", "(8, 1, 28, 28)")  # the run's micro-batch shape
    tuned["calls"].clear()
    model = VisionTransformer(ViTConfig(**TINY, num_classes=10))
    assert train_precision(model, lambda m: torch.optim.AdamW(m.parameters()), (8, 1, 28, 28), 10, "cpu",
                           "fp32") == "fp32" and tuned["calls"] == []  # an explicit precision is not measured


def test_evaluate_auto_measures_on_the_first_batch(tuned):
    model = VisionTransformer(ViTConfig(**TINY, num_classes=3)).train()
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(4, 1, 28, 28, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(2)]
    tuned["seconds"] = {"fp32": 1.0, "bf16": 3.0}
    auto = evaluate(model, data, 3, precision="auto")
    assert set(tuned["calls"]) == {"fp32", "bf16"} and model.training  # mode restored
    assert auto.to_dict() == evaluate(model, data, 3, precision="fp32").to_dict()
    data_cache = autotune.timings("infer-precision", f"{precision.model_signature(model)} x(4, 1, 28, 28)")
    assert data_cache == {"fp32": 1.0, "bf16": 3.0}
