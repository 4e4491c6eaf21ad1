"""`vitlab.optimize(model, "auto", calib=images)`: the fastest speed mode that keeps the fp32 model's answers.

1. **Prune by CPU features, before building anything** (`plan_candidates`, from `vitlab.perf.cpu.cpu_flags`):
   no bf16 modes without native bf16 (amx_bf16 / avx512_bf16: emulated bf16 measured 9-10x slower than fp32 on an
   AVX2-only EPYC); without int8 dot products (amx_int8 / avx512_vnni / avx_vnni) none of the runtimes' calibrated
   int8 (OpenVINO int8 ran at 0.51x timm fp32 on that EPYC) but ours (dynamic int8 and int8-static, 1.55x and 1.66x
   timm fp32 with AVX2 kernels) and ONNX Runtime's dynamic int8 (1.03x there), which is left out where VNNI makes
   the static int8 modes faster. fp32 `compile` is not tried by default. Each skipped mode and its reason is logged
   and returned (`fast.auto_report.skipped`). Explicit `candidates=` are taken as given.
2. **The usual winner first, then cheap first, within a time budget** (`budget_s`, default 120 s): static int8 (the
   fastest on every CPU class measured, and the one that needs most of the budget), then the modes that build in
   seconds (eager bf16, dynamic int8), then the others that can win by a wide margin (compiled bf16, the runtimes'
   calibrated int8: tens of seconds to minutes), then the fp32 runtimes and compile. Before each, its cost is
   estimated from the fp32 forward time (`_BUILD_COST`, measured for ViT-B/16); one that would not fit in what is
   left of the budget is skipped and said so (not stored: a later call measures it within its own budget, so the
   stored list fills up over calls).
3. **Timed briefly, checked only when it could win**: one warm-up call (the compile modes compile in it), then
   the fastest of up to `_ROUNDS` timed calls (two when one call is slow); a candidate whose warm-up is already
   far slower than the best so far is not timed further. Top-1 agreement with the fp32 model on the first
   `check_images` calibration images must reach `MIN_AGREEMENT` (else not eligible; a pick among classes fp32 scores
   within `TIE` of the image's logit range, or within 3x the mode's own small logit error there, counts as
   agreeing, `agreement`); only candidates faster than
   the best eligible one so far are checked (a slower one cannot win). Candidates are timed one after another, not
   interleaved: on a busy machine two modes within ~10% of each other can come out in either order.

The timings are stored by vitlab.perf.autotune under the kind "optimize-mode", keyed by machine and model shape
(`shape_key`), so the next call on this machine for a model of the same shape builds only the winner. Agreement
depends on the weights, not only the shape, so the cached winner is checked again on this model's images; when it
falls short, the next fastest stored candidate is tried, down to fp32 (always eligible).
"""

from __future__ import annotations

import importlib.util
import logging
import statistics
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..perf import autotune, cpu, precision
from ..utils.extras import MissingExtraError
from .calibration import calibration_tensor, input_chw
from .modes import MODES, build_mode, example_batch
from .optimized import OptimizedModel
from .quant import DEFAULT_CALIB_IMAGES

__all__ = ["KIND", "MIN_AGREEMENT", "NOISE", "TIE", "AutoReport", "agreement", "plan_candidates", "select_mode",
           "shape_key"]

log = logging.getLogger("vitlab.optimize")

KIND = "optimize-mode"
MIN_AGREEMENT = 0.99  # top-1 agreement with fp32 on the checked calibration images a mode must reach
BUDGET_S = 120.0  # default time for a first "auto" (ViT-B/16 at 224 px must fit)
CHECK_IMAGES = 16  # calibration images the agreement is checked on (99% of 16: all of them)
TIE = 0.01  # a class whose reference logit is within this share of the image's logit range of the top: a near-tie
NOISE = 3.0  # ... or within this many times the mode's own rms logit error on the image, where that error is <= TIE
_ROUNDS = 3  # timed calls per candidate at most (two when one call takes over _SLOW_CALL_S)
_SLOW_CALL_S = 2.0
_HOPELESS = 2.0  # a warm-up slower than this many times the best median so far ends a candidate's timing

# Every CPU mode in the order tried: the reference, then our static int8 (the winner on every class measured: AMX,
# Zen 4, AVX2; it needs most of a first call's budget on a 2-core Zen 4, ~95-107 s of 120 by its estimate for
# ViT-B/16: tried after compile-bf16 it missed it, and after the seconds that bf16 and dynamic int8 take it still did
# when the host was slow, 2026-12-07 run ND), then the cheap ones (seconds), then the others that can win by a wide
# margin where the CPU has native bf16 / int8 (compiles and calibrations: tens of seconds to minutes), then the fp32
# runtimes and compile (fast to build, rarely the winner where bf16 or int8 is native). Cost of building, compiling
# (first call) and warming up, in fp32 forward passes of the example batch (t1) plus seconds, from ViT-B/16 batch 8 at
# 1 thread on this page's Xeon with AMX (t1 = 2.8 s; docs/speed.md "optimize auto"); the calibrated modes add one
# forward per 8 calibration images (`_estimate`); int8-static 10 s more since its graph has a C++ wrapper to compile
# too (ViT-B/16 on 2 Zen 4 cores, 2026-12-07: +7 s with Inductor's kernel cache warm, +22 s cold).
_BUILD_COST: dict[str, tuple[float, float]] = {
    "fp32": (0.0, 0.0), "int8-static": (2.0, 45.0), "bf16": (0.5, 1.0), "int8": (0.5, 1.0),
    "compile-bf16": (3.0, 15.0), "ort-int8-dynamic": (2.0, 20.0), "ort-int8": (4.0, 100.0),
    "openvino-int8": (4.0, 45.0), "openvino": (2.0, 20.0), "ort": (1.0, 10.0), "compile": (3.0, 45.0),
}
_CALIBRATED = {"int8-static": DEFAULT_CALIB_IMAGES, "ort-int8": 300, "openvino-int8": 300}  # images each uses at most
_BF16 = ("bf16", "compile-bf16")
_LAZY = ("compile", "compile-bf16", "int8-static")  # compiled on the first call
_RUNTIME_INT8 = ("ort-int8", "openvino-int8")  # calibrated int8 of the runtimes


@dataclass
class AutoReport:
    """What a first (or cached) `optimize(model, "auto")` did, as `fast.auto_report`.

    Attributes:
        host_class: `vitlab.perf.cpu.host_class()` of this CPU ("AVX2", "AVX-512", "AVX-512+VNNI", "AMX", "other").
        chosen: The mode returned.
        candidates: The modes considered after pruning, in the order tried.
        skipped: Mode -> why it was not built (CPU features, missing package, time budget, accuracy).
        timings: Mode -> seconds per call of the example batch (this call's or the stored ones; None: not eligible).
        build_s: Mode -> seconds this call spent building, checking and timing it.
        seconds: Wall time of the whole call.
    """

    host_class: str
    chosen: str = ""
    candidates: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float | None] = field(default_factory=dict)
    build_s: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


def _installed(mode: str) -> str | None:
    """Why `mode` cannot be built here for want of a package (None: it can)."""
    need = {"int8-static": ("torchao",), "openvino": ("openvino",), "openvino-int8": ("openvino", "nncf"),
            "ort": ("onnxruntime", "onnxscript"), "ort-int8": ("onnxruntime", "onnxscript"),
            "ort-int8-dynamic": ("onnxruntime", "onnxscript")}.get(mode, ())
    missing = [p for p in need if importlib.util.find_spec(p) is None]
    return f"not installed: {', '.join(missing)}" if missing else None


def plan_candidates(device: torch.device | str = "cpu", flags: Collection[str] | None = None
                    ) -> tuple[list[str], dict[str, str]]:
    """The modes "auto" tries on `device` (cheapest to build first) and those left out, each with its reason.

    Args:
        device: Where the model runs; on a GPU the eager and compile modes in fp32 / bf16 / fp16.
        flags: The CPU's flags (default: this CPU's, `vitlab.perf.cpu.cpu_flags()`); when none are known (not
            Linux x86) nothing is pruned by CPU features.

    Returns:
        (candidates, skipped): candidates in the order tried (`_BUILD_COST`'s), fp32 first; skipped maps mode ->
            reason.
    """
    if torch.device(device).type != "cpu":
        return ["fp32", "bf16", "fp16", "compile", "compile-bf16"], {}
    flags = cpu.cpu_flags() if flags is None else flags
    cls = cpu.host_class(flags)
    bf16, int8 = cpu.native_bf16(flags), cpu.native_int8(flags)
    skipped = {"fp16": "no fast fp16 on CPUs (without AVX512-FP16 it is emulated, many times slower)"}
    out = []
    for mode in _BUILD_COST:
        why: str | None
        if mode in _BF16 and bf16 is False:
            why = (f"no native bf16 on this {cls} CPU (no {' / '.join(cpu.BF16_FLAGS)}): bf16 is emulated, "
                   "9-10x slower than fp32 on an AVX2-only EPYC")
        elif mode in _RUNTIME_INT8 and int8 is False:
            why = (f"no int8 dot products on this {cls} CPU (no {' / '.join(cpu.INT8_FLAGS)}): u8 x s8 pairs "
                   "add up in int16 (VPMADDUBSW); on an AVX2-only EPYC OpenVINO int8 ran at 0.51x timm fp32 and "
                   "ONNX Runtime's int8 needs 7-bit weights there (its dynamic int8, ort-int8-dynamic, is tried)")
        elif mode == "compile":
            why = ("not tried by default: at best at parity with eager fp32 at batch 1-8 on AVX2 (emulated), "
                   "AVX-512 and AMX hosts, and Inductor's AVX-512 code for ViT-B/16 corrupted the heap on an AMX "
                   "host (torch 2.14.1; docs/speed.md); pass candidates= to include it")
        elif mode == "ort-int8-dynamic" and int8:
            why = ("this CPU has int8 dot products, where ONNX Runtime's static int8 (ort-int8) and ours are faster "
                   "(ORT dynamic 0.76 vs static 0.86 img/s on Zen 4); kept for CPUs without VNNI")
        else:
            why = _installed(mode)
        if why:
            skipped[mode] = why
        else:
            out.append(mode)
    return out, skipped


def shape_key(model: nn.Module, example: torch.Tensor) -> str:
    """What a timing holds for: the model's class and shape (its config's name and sizes, else its parameter count)
    and the input batch shape."""
    cfg = getattr(model, "cfg", None)
    if cfg is not None and hasattr(cfg, "embed_dim"):
        what = (f"{type(model).__name__} d{cfg.embed_dim} L{cfg.depth} h{cfg.num_heads} p{cfg.patch_size} "
                f"mlp{getattr(cfg, 'mlp_dim', '?')} cls{cfg.num_classes}")
    else:
        what = f"{type(model).__name__} params={sum(p.numel() for p in model.parameters())}"
    return f"{what} in={'x'.join(map(str, example.shape))}"


@torch.no_grad()
def agreement(fast: nn.Module, logits: torch.Tensor, images: torch.Tensor, batch: int) -> float:
    """Share of `images` on which `fast` keeps the reference's answer (`logits`, (N, classes)): it picks the
    reference's top-1 class, or a class the reference itself scores close enough below its top-1 to be a near-tie
    that any change of summation order or precision may break either way: within `TIE` of that image's logit range
    (max - min), or, where `fast`'s rms logit error on the image is itself within `TIE` of the range, within `NOISE`
    times that error (independent errors of two classes differ by more than 3 rms on ~2% of pairs). Random-weight
    models are full of near-ties: ViT-B/16 with random weights and 1000 classes, on 64 Fashion-MNIST images, had its
    top two fp32 logits within 1% of the range on 17% of them; static int8 (rms logit error 0.42-0.76% of the
    range) picked another class on 5 of 64, at 0.18-1.08% of the range, the last one past `TIE` alone
    (docs/speed.md). A mode with a larger error gets no more than `TIE`, and a trained model's answers have far wider
    margins, so a flip there still counts against the mode."""
    same = 0
    for i in range(0, len(images), batch):
        ref = logits[i : i + batch].float()  # (b, classes)
        out = fast(images[i : i + batch]).float()  # (b, classes)
        pick = out.argmax(-1)  # (b,)
        top, low = ref.max(-1).values, ref.min(-1).values  # (b,)
        tie = TIE * (top - low)  # (b,)
        err = (out - ref).pow(2).mean(-1).sqrt()  # (b,): fast's rms logit error on each image
        allow = torch.where(err <= tie, torch.maximum(tie, NOISE * err), tie)  # (b,)
        picked = ref.gather(-1, pick[:, None]).squeeze(-1)  # (b,): the reference's logit for fast's class
        same += int((picked >= top - allow).sum())
    return same / len(images)


def _now() -> float:  # the budget's clock (tests replace it)
    return time.perf_counter()


def _estimate(mode: str, t1: float, n_calib: int, n_check: int, timed: bool = True) -> float:
    """Seconds `mode` is expected to take to build (its `_BUILD_COST`, which includes the first call's compile, plus
    one forward per 8 calibration images for the calibrated modes), check (`n_check` forwards) and, when `timed`,
    time (a warm-up and up to three calls), from one fp32 forward's `t1`."""
    passes, fixed = _BUILD_COST.get(mode, (4.0, 60.0))
    calib = min(n_calib, _CALIBRATED[mode]) / 8 if mode in _CALIBRATED else 0.0
    return (passes + calib + n_check + (4 if timed else 0)) * t1 + fixed


def select_mode(model: nn.Module, calib: Any, *, example: torch.Tensor | None = None,
                candidates: Sequence[str] | None = None, dynamic: bool | None = None, budget_s: float = BUDGET_S,
                check_images: int = CHECK_IMAGES) -> OptimizedModel:
    """The "auto" mode of `vitlab.optimize` (see the module docstring); its `.mode` is the chosen mode and its
    `.auto_report` an `AutoReport`.

    Args:
        budget_s: Seconds a first call may spend building and timing candidates (estimated before each one; fp32
            is always measured).
        check_images: Calibration images the top-1 agreement is checked on (the first ones).

    Raises:
        ValueError: Bad calibration images or candidates (unknown, repeated, "auto" itself).
    """
    selection = _Selection(model, calib, candidates, dynamic=dynamic, budget_s=budget_s)
    selection.reference(example, check_images)
    return selection.report(selection.choose())


class _Selection:
    """One "auto" call, in the order it runs: the candidates (`__init__`), the fp32 reference answers and timing
    (`reference`), each candidate measured within the budget (`measure`: `build`, `_time`, `eligible`), the winner
    chosen (`choose`, from this call's timings or the stored ones) and reported (`report`)."""

    def __init__(self, model: nn.Module, calib: Any, candidates: Sequence[str] | None, *, dynamic: bool | None,
                 budget_s: float) -> None:
        self.start, self.budget_s, self.dynamic = _now(), budget_s, dynamic
        ref = next(model.parameters(), None)
        self.device = ref.device if ref is not None else torch.device("cpu")
        self.auto = AutoReport(cpu.host_class() if self.device.type == "cpu" else self.device.type)
        if candidates is not None:
            cands = list(candidates)
        else:
            cands, skipped = plan_candidates(self.device)
            self.auto.skipped.update(skipped)
        bad = [c for c in cands if c not in MODES or c == "auto"]
        if bad or not cands or len(set(cands)) != len(cands):
            raise ValueError(f"auto candidates must be distinct speed modes other than 'auto'; got {bad or cands}")
        if candidates is None and self.auto.skipped:
            log.info("auto (%s CPU): skipped without building: %s", self.auto.host_class,
                     "; ".join(f"{m}: {why}" for m, why in self.auto.skipped.items()))
        self.auto.candidates = self.cands = cands
        self.model, self.calib = model.eval(), calib
        self.best: dict[str, OptimizedModel] = {}  # the fastest eligible built so far, handed back without rebuilding
        self.best_time = float("inf")
        self.measured: dict[str, float | None] = {}

    @torch.no_grad()
    def reference(self, example: torch.Tensor | None, check_images: int) -> None:
        """The fp32 answers on the check images (timed: fp32's own timing when they fill two batches of the timed
        shape), the shape key, and the time kept back to rebuild a stored winner."""
        self.x = example_batch(self.model, self.calib, example).to(self.device)  # (B, C, H, W): the batch timed
        # (N, C, H, W): what the int8 modes calibrate on; its first (n, C, H, W) images check the agreement
        self.calib_all = calibration_tensor(self.calib, input_chw(self.model), 1 << 62)
        self.images = self.calib_all[:check_images].to(self.device)
        self.chunks, ref_s, outs = self.images.split(len(self.x)), [], []
        for c in self.chunks:
            t = _clock(self.device)
            outs.append(self.model(c))
            ref_s.append(_clock(self.device) - t)
        self.logits = torch.cat(outs)  # (n, classes): the fp32 answers
        # fp32's own timing, when the check ran at least two batches of the timed shape (the first one warms up)
        two = len(self.chunks) >= 2 and len(self.chunks[1]) == len(self.x)
        self.fp32_s = statistics.median(ref_s[1:]) if two else None
        self.t1 = self.fp32_s or sum(ref_s) / len(ref_s)  # seconds of one fp32 forward of a batch like x
        self.key = shape_key(self.model, self.x)
        # a later call builds the stored winner after measuring what is left: keep its building time out of the budget
        known = {c: s for c, s in autotune.timings(KIND, self.key, device=self.device).items()
                 if c in self.cands and s is not None}
        lead = min(known, key=known.__getitem__) if known and autotune.mode() == "on" else None
        self.reserve = 0.0 if lead in (None, "fp32") else self._estimate(lead, timed=False)

    def _estimate(self, mode: str, timed: bool = True) -> float:
        return _estimate(mode, self.t1, len(self.calib_all), len(self.chunks), timed=timed)

    def build(self, mode: str) -> OptimizedModel | None:
        """`mode` built, or None (the reason logged and reported) when it cannot run here."""
        try:
            return build_mode(self.model, mode, dynamic=self.dynamic, calib=self.calib_all, example=self.x)
        except (MissingExtraError, RuntimeError, NotImplementedError, ValueError) as e:  # logged, not hidden
            self.auto.skipped[mode] = f"cannot run here: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
            log.info("auto: %s %s", mode, self.auto.skipped[mode])
            return None

    def eligible(self, mode: str, fast: OptimizedModel) -> bool:
        """Whether `fast` agrees with the fp32 answers often enough (fp32 itself always does)."""
        if mode == "fp32":
            return True  # the reference itself
        agree = agreement(fast, self.logits, self.images, len(self.x))
        if agree < MIN_AGREEMENT:
            self.auto.skipped[mode] = (f"agrees with fp32 on {100 * agree:.2f}% of {len(self.images)} images "
                                       f"(< {100 * MIN_AGREEMENT:.0f}%)")
            log.info("auto: %s %s: not eligible", mode, self.auto.skipped[mode])
            return False
        return True

    def measure(self, mode: str) -> Any:
        """Seconds per call of `mode` (None: cannot run or not eligible; NOT_NOW: no time left in the budget); the
        `measure` of `autotune.cached_choice`."""
        left = self.start + self.budget_s - self.reserve - _now()
        cost = self._estimate(mode)
        if mode != "fp32" and cost > left:
            self.auto.skipped[mode] = (f"time budget: ~{cost:.0f} s to build and time, {max(left, 0):.0f} s left "
                                       f"of {self.budget_s:.0f} s")
            log.info("auto: %s skipped: %s", mode, self.auto.skipped[mode])
            return autotune.NOT_NOW
        t0 = _now()
        try:
            fast = self.build(mode)
            if fast is None:
                return None
            if mode == "fp32" and self.fp32_s is not None and self.x.shape == self.chunks[1].shape:
                seconds = self.fp32_s  # timed while computing the reference answers
            else:
                seconds = _time(fast, self.x, self.device, self.best_time, lazy=mode in _LAZY)
            if seconds < self.best_time and not self.eligible(mode, fast):
                self.measured[mode] = None
                return None
            self.measured[mode] = seconds
        finally:
            self.auto.build_s[mode] = _now() - t0
        log.info("auto: %s %.0f ms per batch of %d (built, checked and timed in %.1f s)", mode, seconds * 1e3,
                 len(self.x), self.auto.build_s[mode])
        if seconds < self.best_time:
            self.best = {mode: fast}
            self.best_time = seconds
        return seconds

    def choose(self) -> OptimizedModel:
        """The winner: measured now, or stored by an earlier call (then built and checked for this model's weights,
        falling back to the next fastest stored candidate, down to fp32)."""
        winner = autotune.cached_choice(KIND, self.key, self.cands, self.measure, device=self.device)
        stored = {**autotune.timings(KIND, self.key, device=self.device), **self.measured}
        self.auto.timings = {c: stored[c] for c in self.cands if c in stored}
        fast = self.best.get(winner)
        if fast is not None:
            return fast
        faster = sorted((c for c in self.cands if c != winner and stored.get(c) is not None),
                        key=lambda c: stored[c] or 0.0)
        for mode in [winner, *faster, *(["fp32"] if winner != "fp32" and "fp32" not in faster else [])]:
            got = self.build(mode)
            if got is not None and self.eligible(mode, got):
                return got
            log.info("auto: stored winner %s is not eligible for this model; trying the next", mode)
        raise AssertionError("fp32 always agrees with itself")

    def report(self, fast: OptimizedModel) -> OptimizedModel:
        """`fast` with its `auto_report`, the choice and the timings logged in one line."""
        auto = self.auto
        auto.chosen, auto.seconds = fast.mode, _now() - self.start
        fast.auto_report = auto
        times = ", ".join(f"{c} {s * 1e3:.0f} ms" if s is not None else f"{c} n/a" for c, s in auto.timings.items())
        log.info("auto (%s CPU) -> %s in %.0f s: %s per batch of %d%s", auto.host_class, auto.chosen,
                 auto.seconds, times or "not measured", len(self.x),
                 f"; skipped {', '.join(auto.skipped)}" if auto.skipped else "")
        return fast


@torch.no_grad()
def _time(fast: nn.Module, x: torch.Tensor, device: torch.device, best: float, lazy: bool = False) -> float:
    """Seconds of `fast(x)` (`vitlab.perf.precision.time_rounds`, the one timer): the fastest of up to `_ROUNDS`
    calls (two when a call is slow; the least disturbed by other work, as `vitlab.perf.precision.time_interleaved`
    keeps) after one warm-up call (two when `lazy`: the first compiles), or the warm-up's time alone when it was
    already `_HOPELESS` times slower than `best`."""

    def timed(warmup: int, rounds: int) -> list[float]:  # the one timer, on the budget's clock
        return precision.time_rounds(lambda _: fast(x), ("mode",), device=device, warmup=warmup, rounds=rounds,
                                     clock=_now)["mode"]

    warm = timed(1 if lazy else 0, 1)[0]
    if warm > _HOPELESS * best:
        return warm
    return min(timed(0, _ROUNDS if warm < _SLOW_CALL_S else 2))


def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return _now()
