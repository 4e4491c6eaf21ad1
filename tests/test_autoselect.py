"""`optimize(model, "auto")` on each class of CPU: the candidates are pruned by the CPU's flags before anything is
built (faked /proc/cpuinfo flag sets here), cheap ones come first, a time budget bounds the first call, and what
was skipped is said (returned and logged)."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

import vitlab
from vitlab.deploy import autoselect
from vitlab.deploy.optimize import OptimizedModel, optimize
from vitlab.perf import autotune, cpu

from .conftest import perturb_

FLAGS = {  # what /proc/cpuinfo lists on each class (abridged to the flags that matter)
    "AVX2": {"fpu", "sse4_2", "avx", "avx2", "fma"},  # the AVX2-only EPYC of issue 26
    "AVX-512": {"avx2", "fma", "avx512f", "avx512bw", "avx512vl"},  # Skylake-SP
    "AVX-512+VNNI": {"avx2", "avx512f", "avx512_vnni", "avx512_bf16"},  # Zen 4, Cooper Lake
    "AMX": {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile"},  # Sapphire Rapids
}
BF16_MODES = {"bf16", "compile-bf16"}
RUNTIME_INT8 = {"ort-int8", "openvino-int8"}


def _fake_cpu(monkeypatch, cls: str) -> None:
    flags = frozenset(FLAGS[cls])
    monkeypatch.setattr(cpu, "cpu_flags", lambda *a: flags)


def _tiny():
    model = vitlab.create_model("ViT-Ti/16", depth=1, img_size=32, patch_size=8, num_classes=10)
    return perturb_(model, scale=0.05).eval()


@pytest.mark.parametrize("cls", list(FLAGS))
def test_host_class_from_flags(cls):
    assert cpu.host_class(FLAGS[cls]) == cls
    assert cpu.host_class(set()) == "other"
    assert cpu.native_bf16(FLAGS[cls]) is (cls in ("AVX-512+VNNI", "AMX"))
    assert cpu.native_int8(FLAGS[cls]) is (cls in ("AVX-512+VNNI", "AMX"))
    assert cpu.native_bf16(set()) is None and cpu.native_int8(set()) is None  # unknown, not "no"


def test_candidates_follow_the_cpu_flags():
    plans = {cls: autoselect.plan_candidates("cpu", FLAGS[cls]) for cls in FLAGS}
    for cands, skipped in plans.values():
        assert cands[0] == "fp32" and not set(cands) & set(skipped)
        order = list(autoselect._BUILD_COST)
        assert cands == sorted(cands, key=order.index)  # cheap first, then the likely winners, then the rest
        assert "fp16" in skipped and "compile" in skipped
        assert "int8" in cands  # FBGEMM dynamic int8: cheap, and beats fp32 without VNNI too
    avx2, skipped = plans["AVX2"]
    assert not (BF16_MODES | RUNTIME_INT8) & set(avx2)
    assert all("no native bf16" in skipped[m] and "avx512_bf16" in skipped[m] for m in BF16_MODES)
    assert all("no int8 dot products" in skipped[m] and "avx512_vnni" in skipped[m] for m in RUNTIME_INT8)
    if autoselect._installed("int8-static") is None:
        assert "int8-static" in avx2  # ours, with AVX2 int8 kernels: measured 1.66x timm fp32 (emulated)
    assert not BF16_MODES & set(plans["AVX-512"][0])  # AVX-512 without bf16 (Skylake): emulated bf16 too
    amx, skipped = plans["AMX"]
    assert set(amx) >= BF16_MODES and "ort-int8-dynamic" in skipped  # static int8 is the better int8 there
    for cls in ("AVX-512+VNNI", "AMX"):
        assert set(plans[cls][0]) >= BF16_MODES
        if autoselect._installed("int8-static") is None:  # the winner on both is tried before the bf16 compile,
            cands = plans[cls][0]  # which could otherwise use up a first call's budget on 2 cores (Zen 4)
            assert cands.index("int8-static") < cands.index("compile-bf16")
    if autoselect._installed("ort-int8-dynamic") is None:
        assert "ort-int8-dynamic" in avx2  # the int8 measured to beat fp32 on the AVX2 EPYC
    for mode in RUNTIME_INT8:
        if autoselect._installed(mode) is None:
            assert mode in amx
    unknown, _ = autoselect.plan_candidates("cpu", set())  # flags unknown (not Linux x86): nothing pruned by them
    assert set(unknown) >= BF16_MODES and "int8-static" not in autoselect.plan_candidates("cpu", set())[1]


def _fake_builds(monkeypatch, seconds: dict[str, float], refuse: set[str] | None = None) -> list[str]:
    """optimize() replaced: each mode "builds" as an fp32 copy whose calls advance a fake clock by `seconds[mode]`;
    a mode in `refuse` raises if it is ever built. Returns the list of modes built."""
    clock = {"now": 0.0}
    monkeypatch.setattr(autoselect, "_now", lambda: clock["now"])
    built: list[str] = []

    class Timed(torch.nn.Module):
        def __init__(self, model, mode):
            super().__init__()
            self.model, self.mode = model, mode

        def forward(self, x):
            clock["now"] += seconds.get(self.mode, 1.5)
            return self.model(x)

    def build(model, mode, **kw):
        if refuse and mode in refuse:
            raise AssertionError(f"{mode} was pruned and must not be built")
        built.append(mode)
        clock["now"] += 1.0  # building costs a second
        return OptimizedModel(Timed(copy.deepcopy(model), mode), mode, torch.float32)

    monkeypatch.setattr(autoselect, "build_mode", build)
    return built


@pytest.fixture
def tuned(tmp_path, monkeypatch):
    monkeypatch.setenv("VITLAB_AUTOTUNE", "on")
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(autotune, "_load", lambda: 0.5)


@pytest.mark.parametrize("cls", ["AVX2", "AMX"])
def test_pruned_candidates_are_never_built(tuned, monkeypatch, caplog, cls):
    _fake_cpu(monkeypatch, cls)
    cands, skipped = autoselect.plan_candidates("cpu")
    built = _fake_builds(monkeypatch, {"fp32": 2.0, "int8": 1.0, "bf16": 0.5}, refuse=set(skipped))
    caplog.set_level(logging.INFO, logger="vitlab.optimize")
    fast = optimize(_tiny(), "auto", calib=torch.randn(8, 3, 32, 32), budget_s=1e6)
    assert built == cands  # every planned candidate built, in the planned order; no pruned one
    # static int8, the usual winner and the one that needs most of the budget, right after the reference
    assert cands[:2] == ["fp32", "int8-static"] or "int8-static" in skipped, cands
    report = fast.auto_report
    assert report.host_class == cls and report.candidates == cands
    assert {m: report.skipped[m] for m in skipped} == skipped
    assert fast.mode == ("bf16" if cls == "AMX" else "int8")  # fastest on the fake clock, and it agrees
    assert f"auto ({cls} CPU): skipped without building" in caplog.text
    assert f"auto ({cls} CPU) -> {fast.mode}" in caplog.text
    if cls == "AVX2":
        assert "bf16: no native bf16" in caplog.text


def test_time_budget_skips_expensive_candidates_and_leaves_them_unmeasured(tuned, monkeypatch):
    _fake_cpu(monkeypatch, "AMX")
    cands = ["fp32", "int8", "compile", "ort-int8"]
    built = _fake_builds(monkeypatch, {"fp32": 2.0, "int8": 1.0, "compile": 0.8, "ort-int8": 0.1})
    model, calib = _tiny(), torch.randn(8, 3, 32, 32)
    # the reference forward runs the real model (0 s on the fake clock), so the estimates are the fixed parts:
    # fp32 and int8 take 10-15 s, then compile's estimate fits in what is left, and ort-int8's no longer does
    budget = autoselect._BUILD_COST["compile"][1] + 25
    assert autoselect._BUILD_COST["ort-int8"][1] > 70
    fast = optimize(model, "auto", calib=calib, candidates=cands, budget_s=budget)
    assert built == ["fp32", "int8", "compile"] and fast.mode == "compile"
    assert fast.auto_report.skipped["ort-int8"].startswith("time budget: ~")
    stored = autotune.timings(autoselect.KIND, autoselect.shape_key(model, calib))
    assert set(stored) == {"fp32", "int8", "compile"}  # the skipped one is not stored as "cannot run"
    built.clear()
    again = optimize(model, "auto", calib=calib, candidates=cands, budget_s=1e6)
    assert built == ["ort-int8"] and again.mode == "ort-int8"  # measured later, alone


def test_slow_candidates_are_not_checked_and_hopeless_ones_not_timed(tuned, monkeypatch):
    _fake_cpu(monkeypatch, "AVX2")
    calls: list[str] = []
    built = _fake_builds(monkeypatch, {"fp32": 1.0, "int8": 0.5, "compile": 5.0})
    real = autoselect.agreement
    monkeypatch.setattr(autoselect, "agreement", lambda fast, *a: calls.append(fast.mode) or real(fast, *a))
    fast = optimize(_tiny(), "auto", calib=torch.randn(8, 3, 32, 32), candidates=["fp32", "int8", "compile"],
                    budget_s=1e6)
    assert built == ["fp32", "int8", "compile"] and fast.mode == "int8"
    assert calls == ["int8"]  # fp32 is the reference, compile is slower than int8: neither is checked
    assert fast.auto_report.timings["compile"] == 5.0  # its two warm-up calls only: hopeless after them


def test_not_now_is_neither_eligible_nor_stored(tmp_path, monkeypatch):
    monkeypatch.setenv("VITLAB_AUTOTUNE", "on")
    cache = tmp_path / "c.json"
    got = autotune.cached_choice("k", "s", ["a", "b", "c"],
                                 {"a": 2.0, "b": autotune.NOT_NOW, "c": None}.get, cache=cache)
    assert got == "a" and autotune.timings("k", "s", cache=cache) == {"a": 2.0, "c": None}
    assert autotune.cached_choice("k", "s", ["a", "b", "c"], {"b": 1.0}.get, cache=cache) == "b"


def test_a_later_call_keeps_time_to_rebuild_the_stored_winner(tuned, monkeypatch):
    _fake_cpu(monkeypatch, "AVX2")
    model, calib = _tiny(), torch.randn(8, 3, 32, 32)
    key = autoselect.shape_key(model, calib)
    autotune.cached_choice(autoselect.KIND, key, ["fp32", "int8"], {"fp32": 3.0, "int8": 1.0}.get)
    built = _fake_builds(monkeypatch, {"int8-static": 0.1})
    cands = ["fp32", "int8", "int8-static"]
    fits_alone = autoselect._BUILD_COST["int8-static"][1] + 0.5  # the estimates' fixed parts (t1 is 0 here)
    fast = optimize(model, "auto", calib=calib, candidates=cands, budget_s=fits_alone)
    assert "int8-static" in fast.auto_report.skipped  # int8's rebuild (~1 s) is kept out of the budget
    assert built == ["int8"] and fast.mode == "int8"


class _Fixed(torch.nn.Module):
    """A 'mode' answering image i (an image holding the number i) with the given logits' row i."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = logits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits[x[:, 0].long()]


def test_agreement_counts_a_near_tie_of_the_reference_but_not_a_changed_answer():
    # reference logits per image: range 10 (max 5, min -5), so TIE = 1% allows picks within 0.1 of the top
    ref = torch.tensor([[5.0, 4.95, 0.0, -5.0],    # classes 0 and 1 tie to 0.05: either answer is fp32's
                        [5.0, 4.8, 0.0, -5.0],     # 0.2 apart: class 1 is another answer
                        [5.0, -5.0, 4.92, 0.0]])   # class 2 is 0.08 below the top: a tie
    images = torch.arange(3.0)[:, None]  # (3, 1): image i holds i
    same = torch.tensor([[1.0, 0, 0, 0]] * 3)  # picks class 0 everywhere: the reference's own answers
    assert autoselect.agreement(_Fixed(same), ref, images, 2) == 1.0
    other = torch.tensor([[0, 1.0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0]])
    assert autoselect.agreement(_Fixed(other), ref, images, 2) == pytest.approx(2 / 3)  # image 1 changed answer
    worst = torch.tensor([[0, 0, 0, 1.0]] * 3)  # the reference's lowest class: never agrees
    assert autoselect.agreement(_Fixed(worst), ref, images, 3) == 0.0
    flat = torch.zeros(3, 4)  # a reference with no preference (zero head): any pick is its answer
    assert autoselect.agreement(_Fixed(worst), flat, images, 3) == 1.0


def test_agreement_allows_a_flip_within_the_modes_own_small_noise_and_no_more():
    """Past TIE, a changed answer still counts as a near-tie where the reference's margin is within NOISE x the mode's
    own rms logit error on that image, but only when that error is within TIE of the range (a noisy mode gets no
    more), and never for a wide margin."""
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(3, 1000, generator=g)
    ref[:, 0] = ref.max(-1).values + 0.5  # class 0 on top...
    rng = ref.max(-1).values - ref.min(-1).values  # (3,)
    ref[:, 1] = ref[:, 0] - torch.tensor([0.015, 0.015, 0.08]) * rng  # ...class 1 1.5%, 1.5% and 8% of the range below
    images = torch.arange(3.0)[:, None]
    noise = torch.randn(3, 1000, generator=g)
    noise /= noise.pow(2).mean(-1, keepdim=True).sqrt()  # rms 1 per image

    def flipped(err: list[float]) -> torch.Tensor:  # ref + noise of rms err * range, and class 1 picked
        out = ref + noise * (torch.tensor(err) * rng)[:, None]
        out[:, 1] = out.max(-1).values + 1e-3 * rng
        return out

    quiet = flipped([0.006, 0.006, 0.006])  # error 0.6% of the range: 3x = 1.8% covers the 1.5% margins, not 8%
    assert autoselect.agreement(_Fixed(quiet), ref, images, 3) == pytest.approx(2 / 3)
    loud = flipped([0.03, 0.03, 0.03])  # error 3% of the range: past TIE, so TIE alone applies: no flip is a tie
    assert autoselect.agreement(_Fixed(loud), ref, images, 3) == 0.0
    assert autoselect.agreement(_Fixed(ref.clone()), ref, images, 2) == 1.0  # no change, no noise
