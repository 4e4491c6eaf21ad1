"""vitlab.perf.autotune: measured once, cached per machine/kind/shape, merged safely by concurrent writers."""

from __future__ import annotations

import json
import logging
import multiprocessing
from pathlib import Path

import pytest
import torch

from vitlab.perf import autotune, cpu


@pytest.fixture(autouse=True)
def _on(monkeypatch):
    monkeypatch.setenv("VITLAB_AUTOTUNE", "on")  # the suite runs with it off (conftest); these tests measure
    monkeypatch.setattr(autotune, "_load", lambda: 0.5)  # a quiet machine: nothing measured again for load


class Timer:
    """A stand-in for a measurement: fixed seconds per candidate, counting the calls."""

    def __init__(self, seconds: dict[str, float | None]):
        self.seconds, self.calls = seconds, []

    def __call__(self, c: str) -> float | None:
        self.calls.append(c)
        return self.seconds[c]


def test_measures_once_then_reads_the_cache(tmp_path):
    cache = tmp_path / "a.json"
    t = Timer({"fp32": 0.2, "bf16": 0.1})
    assert autotune.cached_choice("k", "s", ["fp32", "bf16"], t, cache=cache) == "bf16"
    assert t.calls == ["fp32", "bf16"]
    again = Timer({"fp32": 0.0, "bf16": 9.0})  # would pick fp32 if it measured
    assert autotune.cached_choice("k", "s", ["fp32", "bf16"], again, cache=cache) == "bf16"
    assert again.calls == []
    data = json.loads(cache.read_text())
    entry = data[autotune.machine_key()]["k"]["s"]
    assert entry["timings"] == {"fp32": 0.2, "bf16": 0.1} and entry["winner"] == "bf16"
    assert autotune.timings("k", "s", cache=cache) == {"fp32": 0.2, "bf16": 0.1}


def test_shape_and_kind_are_separate_entries(tmp_path):
    cache = tmp_path / "a.json"
    assert autotune.cached_choice("k", "s1", ["a", "b"], Timer({"a": 1, "b": 2}), cache=cache) == "a"
    assert autotune.cached_choice("k", "s2", ["a", "b"], Timer({"a": 2, "b": 1}), cache=cache) == "b"
    assert autotune.cached_choice("k2", "s1", ["a", "b"], Timer({"a": 3, "b": 1}), cache=cache) == "b"
    assert autotune.cached_choice("k", "s1", ["a", "b"], Timer({"a": 9, "b": 0}), cache=cache) == "a"


def test_new_candidate_measured_alone_and_ineligible_skipped(tmp_path):
    cache = tmp_path / "a.json"
    autotune.cached_choice("k", "s", ["a", "b"], Timer({"a": 0.3, "b": None}), cache=cache)
    t = Timer({"a": 0.0, "b": 0.0, "c": 0.2})
    assert autotune.cached_choice("k", "s", ["a", "b", "c"], t, cache=cache) == "c"
    assert t.calls == ["c"]
    assert autotune.timings("k", "s", cache=cache) == {"a": 0.3, "b": None, "c": 0.2}
    with pytest.raises(ValueError, match="none of a, b can run"):
        autotune.cached_choice("k", "t", ["a", "b"], Timer({"a": None, "b": None}), cache=cache)


def test_tie_goes_to_the_first_candidate(tmp_path):
    assert autotune.cached_choice("k", "s", ["x", "y"], Timer({"x": 0.5, "y": 0.5}), cache=tmp_path / "c") == "x"


def test_off_measures_nothing_and_refresh_measures_again(tmp_path, monkeypatch):
    cache = tmp_path / "a.json"
    monkeypatch.setenv("VITLAB_AUTOTUNE", "off")
    t = Timer({"a": 1.0, "b": 0.1})
    assert autotune.cached_choice("k", "s", ["a", "b"], t, cache=cache) == "a"
    assert t.calls == [] and not cache.exists()
    monkeypatch.setenv("VITLAB_AUTOTUNE", "on")
    assert autotune.cached_choice("k", "s", ["a", "b"], t, cache=cache) == "b"
    monkeypatch.setenv("VITLAB_AUTOTUNE", "refresh")
    t2 = Timer({"a": 0.01, "b": 0.1})
    assert autotune.cached_choice("k", "s", ["a", "b"], t2, cache=cache) == "a" and t2.calls == ["a", "b"]
    monkeypatch.setenv("VITLAB_AUTOTUNE", "sometimes")
    with pytest.raises(ValueError, match="VITLAB_AUTOTUNE='sometimes'"):
        autotune.cached_choice("k", "s", ["a"], t, cache=cache)


def test_forget(tmp_path):
    cache = tmp_path / "a.json"
    autotune.cached_choice("k1", "s", ["a", "b"], Timer({"a": 1, "b": 2}), cache=cache)
    autotune.cached_choice("k1", "s2", ["a", "b"], Timer({"a": 1, "b": 2}), cache=cache)
    autotune.cached_choice("k2", "s", ["a", "b"], Timer({"a": 1, "b": 2}), cache=cache)
    assert autotune.forget("k1", cache=cache) == 2
    assert autotune.timings("k1", "s", cache=cache) == {}
    assert autotune.timings("k2", "s", cache=cache) == {"a": 1, "b": 2}
    t = Timer({"a": 3, "b": 2})
    assert autotune.cached_choice("k1", "s", ["a", "b"], t, cache=cache) == "b" and t.calls == ["a", "b"]
    assert autotune.forget(cache=cache) == 2
    assert json.loads(cache.read_text()) == {}
    assert autotune.forget(cache=tmp_path / "missing.json") == 0


@pytest.mark.parametrize("bad", [{"kind": ""}, {"shape_key": " "}, {"candidates": []}, {"candidates": ["a", "a"]},
                                 {"candidates": ["a", 3]}])
def test_bad_arguments(tmp_path, bad):
    kw = dict(kind="k", shape_key="s", candidates=["a", "b"]) | bad
    with pytest.raises(ValueError, match="autotune"):
        autotune.cached_choice(kw["kind"], kw["shape_key"], kw["candidates"], Timer({"a": 1, "b": 2}),
                               cache=tmp_path / "a.json")


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), "fast", True])
def test_measure_must_return_seconds(tmp_path, value):
    with pytest.raises(ValueError, match=r"measure\('a'\) returned"):
        autotune.cached_choice("k", "s", ["a"], lambda c: value, cache=tmp_path / "a.json")


def test_measure_errors_propagate(tmp_path):
    def boom(c: str) -> float:
        raise RuntimeError("kernel missing")

    with pytest.raises(RuntimeError, match="kernel missing"):
        autotune.cached_choice("k", "s", ["a"], boom, cache=tmp_path / "a.json")


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"m": 3}'])
def test_corrupt_cache_is_measured_again_and_replaced(tmp_path, caplog, content):
    cache = tmp_path / "a.json"
    cache.write_text(content)
    with caplog.at_level(logging.WARNING, logger="vitlab.autotune"):
        assert autotune.cached_choice("k", "s", ["a", "b"], Timer({"a": 2, "b": 1}), cache=cache) == "b"
    assert "measuring again" in caplog.text
    assert autotune.timings("k", "s", cache=cache) == {"a": 2, "b": 1}


def test_malformed_entries_inside_a_valid_cache(tmp_path):
    cache = tmp_path / "a.json"
    m = autotune.machine_key()
    cache.write_text(json.dumps({m: {"k": {"s": {"timings": {"a": "fast", "b": -1}}}, "k2": 5}}))
    t = Timer({"a": 2, "b": 1})
    assert autotune.cached_choice("k", "s", ["a", "b"], t, cache=cache) == "b" and t.calls == ["a", "b"]
    assert autotune.cached_choice("k2", "s", ["a", "b"], Timer({"a": 1, "b": 2}), cache=cache) == "a"


def test_unwritable_cache_still_chooses(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="vitlab.autotune"):
        got = autotune.cached_choice("k", "s", ["a", "b"], Timer({"a": 2, "b": 1}), cache=blocker / "a.json")
    assert got == "b" and "not written" in caplog.text


def test_default_cache_location(tmp_path, monkeypatch):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "vc"))
    assert autotune.default_cache() == tmp_path / "vc" / "autotune.json"
    monkeypatch.delenv("VITLAB_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert autotune.default_cache() == tmp_path / "xdg" / "vitlab" / "autotune.json"
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "vc"))
    autotune.cached_choice("k", "s", ["a"], Timer({"a": 1}))
    assert (tmp_path / "vc" / "autotune.json").exists()


def test_machine_key_names_what_timings_depend_on(monkeypatch):
    from vitlab.perf.cpu import EMULATION_VARS

    for var in EMULATION_VARS:  # measured under kernel emulation, the key says so (tested below); here: a plain host
        monkeypatch.delenv(var, raising=False)
    key = autotune.machine_key()
    assert f"torch={torch.__version__}" in key and key.endswith("| cpu")
    assert f"threads={torch.get_num_threads()}" in key
    name, flags = autotune._cpu_model_and_flags()
    assert name in key and all(f in key for f in flags)


def test_cpu_flags_from_a_cpuinfo_file(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu avx512f avx512_bf16 avx512_vnni\n"
                    "processor\t: 1\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu avx512f avx512_bf16 avx512_vnni\n")
    assert cpu.cpu_model(str(info)) == "AMD EPYC 9R14"
    assert cpu.cpu_flags(str(info)) == {"fpu", "avx512f", "avx512_bf16", "avx512_vnni"}
    assert cpu.host_class(cpu.cpu_flags(str(info))) == "AVX-512+VNNI"


def test_machine_key_reads_the_flags_through_precision(monkeypatch):
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx2", "fma", "avx512_vnni"}))
    monkeypatch.setattr(cpu, "cpu_model", lambda: "Fake CPU")
    assert autotune._cpu_model_and_flags() == ("Fake CPU", ["avx512_vnni"])
    for var in cpu.EMULATION_VARS:
        monkeypatch.delenv(var, raising=False)
    native = autotune.machine_key()
    assert native.startswith("Fake CPU | avx512_vnni | ") and "emulated" not in native
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # AVX2 kernels forced: its timings are another machine's
    assert autotune.machine_key() == native + " | emulated ATEN_CPU_CAPABILITY=avx2"


def _writer(args: tuple[str, str]) -> str:
    cache, kind = args
    import os

    os.environ["VITLAB_AUTOTUNE"] = "on"
    return autotune.cached_choice(kind, "s", ["a", "b"], lambda c: {"a": 0.2, "b": 0.1}[c], cache=Path(cache))


def test_concurrent_writers_keep_every_entry(tmp_path):
    cache = tmp_path / "a.json"
    kinds = [f"k{i}" for i in range(16)]
    with multiprocessing.get_context("fork").Pool(4) as pool:  # fork: the children need not import torch again
        assert pool.map(_writer, [(str(cache), k) for k in kinds]) == ["b"] * len(kinds)
    data = json.loads(cache.read_text())
    (machine,) = data  # every process has the same machine key
    assert sorted(data[machine]) == sorted(kinds)


def test_timings_from_a_busy_machine_are_measured_again_when_quiet(tmp_path, monkeypatch):
    cache = tmp_path / "a.json"
    monkeypatch.setattr(autotune, "_cores", lambda: 2)
    monkeypatch.setattr(autotune, "_load", lambda: 9.0)  # busy
    autotune.cached_choice("k", "s", ["a", "b"], Timer({"a": 2, "b": 1}), cache=cache)
    busy = Timer({"a": 1, "b": 2})
    assert autotune.cached_choice("k", "s", ["a", "b"], busy, cache=cache) == "b" and busy.calls == []  # still busy
    monkeypatch.setattr(autotune, "_load", lambda: 1.0)  # quiet now: measured again, stored with the new load
    quiet = Timer({"a": 1, "b": 2})
    assert autotune.cached_choice("k", "s", ["a", "b"], quiet, cache=cache) == "a" and quiet.calls == ["a", "b"]
    again = Timer({"a": 5, "b": 1})
    assert autotune.cached_choice("k", "s", ["a", "b"], again, cache=cache) == "a" and again.calls == []
    assert json.loads(cache.read_text())[autotune.machine_key()]["k"]["s"]["load"] == 1.0
