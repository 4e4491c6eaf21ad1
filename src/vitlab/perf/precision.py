"""Mixed precision: what `precision: auto` means on this machine, and the autocast context for a precision.

bf16 autocast keeps weights and optimizer state in fp32 and runs matmuls and convolutions in bf16. Whether that is
faster depends on more than one CPU flag: with AMX tiles it is (~10x in the GEMMs); with AVX-512 alone it depends
on the CPU and the work (an Intel AVX-512 host without AMX measured bf16 slower than fp32; a Zen 4 with
avx512_bf16 runs bf16 GEMMs at about twice the fp32 rate), and the casts autocast adds weigh more on small models.
So "auto" is decided by measuring this model's own step in each precision on this machine (`choose_precision`):
a few interleaved steps of each, the winner cached per machine and shape by `vitlab.perf.autotune` (later runs read
it back). A CPU without native bf16 (no amx_bf16 / avx512_bf16: an AVX2-only host, an AVX-512 host before Cooper
Lake) takes fp32 without measuring: bf16 is emulated there (9-10x slower on an AVX2 EPYC) and its trial steps alone
would take minutes. `VITLAB_AUTOTUNE=off` keeps the rule of thumb (`rule_precision`): bf16 on a CUDA GPU with bf16
or a CPU with AMX, else fp32. On a GPU the rule is used without measuring (bf16 tensor cores win there).

What the CPU has (`cpu_flags`, `host_class`, `native_bf16`) is `vitlab.perf.cpu`'s to say; its names are importable
from here too.

Training measures with `vitlab.train.tune.train_precision`, inference with `inference_precision` (used by
`vitlab.inference.evaluate`). torch is imported only when a function runs: recipes validate without it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from . import autotune
from .cpu import (  # noqa: F401  (BF16_FLAGS ... native_int8: re-exported, the names this module had)
    BF16_FLAGS,
    EMULATION_VARS,
    HOST_CLASSES,
    INT8_FLAGS,
    amx_kernels,
    cpu_flags,
    cpu_has_amx,
    cpu_model,
    host_class,
    kernel_emulation,
    native_bf16,
    native_int8,
)

if TYPE_CHECKING:
    import torch
    from torch import nn

PRECISIONS = ("auto", "bf16", "fp32")

log = logging.getLogger("vitlab.precision")
_clock = time.perf_counter  # the clock of `time_rounds` (tests replace it with a fake clock)


def _check(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")


def rule_precision(device: torch.device | str) -> str:
    """The rule of thumb, no measuring: "bf16" on a CUDA GPU with bf16 or a CPU with AMX, else "fp32" (also on an
    AMX CPU whose kernels are held to a lesser CPU's by `kernel_emulation()`: bf16 is emulated there)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if device.type == "cpu" and amx_kernels() else "fp32"


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """A precision without measuring: "auto" -> `rule_precision(device)`; "bf16" / "fp32" as they are.

    Code that has a model and an input at hand should use `choose_precision` (or `inference_precision`), which
    measures instead.
    """
    _check(precision)
    return rule_precision(device) if precision == "auto" else precision


def autocast(device: torch.device | str, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on CPU and GPU (weights stay fp32); a no-op context for fp32; "auto" as `resolve_precision`."""
    import torch

    device = torch.device(device)
    if resolve_precision(precision, device) == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


# -- measuring ---------------------------------------------------------------------------------------------------


def model_signature(model: nn.Module) -> str:
    """A short name of a model's shape for cache keys: its class, parameter count and a hash of every parameter's
    name and shape (two models with the same signature run the same computation)."""
    names = [f"{n}:{tuple(p.shape)}" for n, p in model.named_parameters()]
    digest = hashlib.sha1("|".join(names).encode()).hexdigest()[:10]
    count = sum(p.numel() for p in model.parameters())
    return f"{type(model).__name__} {count / 1e6:.2f}M {digest}"


def time_rounds(run: Callable[[str], object], candidates: Sequence[str], *, device: torch.device | str = "cpu",
                warmup: int = 1, rounds: int | None = None, iters: int = 1, budget_s: float = 4.0,
                clock: Callable[[], float] | None = None, settle_s: float = 0.0) -> dict[str, list[float]]:
    """vitlab's one timer: seconds per `run(candidate)` call of each candidate, one entry per round.

    `warmup` untimed calls of each candidate, then rounds of `iters` timed calls per candidate in turn (A, B, A, B: a
    machine shared with other work slows all alike), each round starting one candidate later (A, B, C, then B, C,
    A, ...), with `settle_s` of idle before each. A CUDA device is synchronised around each timed stretch, so a
    call is timed to its end, not its launch. `time_interleaved` (autotune's precision and mode choices),
    `vitlab.bench.timing.time_calls` (one candidate), the benchmark suite and mode "auto" all time with it.

    Args:
        run: Does one call of the candidate it is given.
        candidates: Names passed to `run`, timed in this order each round.
        warmup: Untimed calls per candidate first (allocator, caches, lazy initialisation, compilation).
        rounds: Timed rounds; None: as many as fit in about `budget_s` seconds (judged by the first), 2 to 5.
        iters: Calls per candidate per round, averaged (raise it for calls of well under a millisecond).
        clock: Seconds now (default `time.perf_counter`, through this module's `_clock`, which tests replace).
        settle_s: Idle seconds before each candidate's timed calls, untimed: lets the worker threads the candidate
            before it left spinning go to sleep (ONNX Runtime's intra-op threads spin for ~20-50 ms after a call
            and slowed the next session's batch-1 call by 1.45x on a 2-core Zen 4, 2026-12-07).

    Raises:
        ValueError: rounds < 1, iters < 1 or warmup < 0.
    """
    if (rounds is not None and rounds < 1) or iters < 1 or warmup < 0 or not settle_s >= 0:
        raise ValueError(f"need rounds >= 1, iters >= 1, warmup >= 0, settle_s >= 0; got {rounds}, {iters}, {warmup}, "
                         f"{settle_s}")
    import torch

    device = torch.device(device)
    now = clock or _clock

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for c in candidates:
        for _ in range(warmup):
            run(c)
    times: dict[str, list[float]] = {c: [] for c in candidates}
    order = list(candidates)

    def one_round() -> None:
        # each round starts one candidate later (A B C, B C A, C A B): none always runs first, right after the
        # warm-up or another batch size's work
        k = len(times[order[0]]) % len(order)  # the rounds done so far
        for c in order[k:] + order[:k]:
            if settle_s:
                time.sleep(settle_s)
            sync()
            t0 = now()
            for _ in range(iters):
                run(c)
            sync()
            times[c].append((now() - t0) / iters)

    one_round()
    if rounds is None:
        rounds = max(2, min(5, int(budget_s / max(sum(t[0] for t in times.values()), 1e-9))))
    for _ in range(rounds - 1):
        one_round()
    return times


def time_interleaved(run: Callable[[str], object], candidates: Sequence[str], *, device: torch.device | str = "cpu",
                     warmup: int = 1, rounds: int | None = None, budget_s: float = 4.0) -> dict[str, float]:
    """Seconds per `run(candidate)` call of each candidate: `time_rounds`' fastest round of each (the least
    disturbed by other work). `rounds` None: as many as fit in about `budget_s` seconds, 2 to 5."""
    times = time_rounds(run, candidates, device=device, warmup=warmup, rounds=rounds, budget_s=budget_s)
    return {c: min(t) for c, t in times.items()}


def choose_precision(precision: str, device: torch.device | str, *, kind: str, shape_key: str,
                     run: Callable[[str], object], what: str = "step") -> str:
    """`precision` itself unless it is "auto"; then the faster of fp32 and bf16 for `run(precision)` on this
    machine, measured once (`time_interleaved`) and cached per machine and `shape_key` (`vitlab.perf.autotune`).

    The rule of thumb (`rule_precision`) is the answer on a GPU and with `VITLAB_AUTOTUNE=off`. On a CPU without
    native bf16 (`native_bf16()` False: no amx_bf16 / avx512_bf16), or whose kernels `kernel_emulation()` holds to a
    lesser CPU's, the answer is fp32 without measuring: there the bf16 trial steps alone would cost minutes. A log
    line (logger "vitlab.precision") says what was measured and chosen, or why nothing was.

    Args:
        kind: The autotune kind ("train-precision", "infer-precision").
        shape_key: What the timing holds for: model signature, input shape, anything else that changes it.
        run: Does one unit of the work (one training step, one forward pass) in the precision it is given.
        what: The unit's name in the log line.
    """
    import torch

    _check(precision)
    if precision != "auto":
        return precision
    device = torch.device(device)
    rule = rule_precision(device)
    if device.type != "cpu":
        log.info("precision auto -> %s (%s: the rule for this device, not measured)", rule, device.type)
        return rule
    if autotune.mode() == "off":
        log.info("precision auto -> %s (VITLAB_AUTOTUNE=off: the CPU-flag rule, %s)", rule,
                 "AMX" if cpu_has_amx() else "no AMX")
        return rule
    if native_bf16() is False:  # known x86 flags without bf16 dot products: bf16 cannot win, and costs to measure
        log.info("precision auto -> fp32 (not measured: this CPU (%s) has no native bf16 (%s), so bf16 runs "
                 "emulated; an AVX2-only EPYC measured it 9-10x slower than fp32)", host_class(),
                 " / ".join(BF16_FLAGS))
        return "fp32"
    if emulated := kernel_emulation():  # the kernels are a lesser CPU's: bf16 runs emulated, as it would there
        log.info("precision auto -> fp32 (not measured: %s hold the kernels to a lesser CPU's, so bf16 runs "
                 "emulated)", " ".join(f"{k}={v}" for k, v in emulated.items()))
        return "fp32"
    candidates = [rule, "bf16" if rule == "fp32" else "fp32"]  # the rule's answer first: the fallback
    timed: dict[str, float] = {}

    def measure(c: str) -> float | None:
        if not timed:  # the first call times every candidate, interleaved; later calls read the result
            timed.update(time_interleaved(run, candidates, device=device))
        return timed[c]

    choice = autotune.cached_choice(kind, shape_key, candidates, measure, device=device)
    t: dict[str, float | None] = {**autotune.timings(kind, shape_key, device=device), **timed}
    parts = ", ".join(f"{c} {s * 1e3:.0f} ms" for c in candidates if (s := t.get(c)) is not None)
    log.info("precision auto -> %s: %s per %s (%s; %s) [%s]", choice, parts, what,
             "measured now" if timed else "measured earlier on this machine", shape_key, autotune.default_cache())
    return choice


def inference_precision(model: nn.Module, x: torch.Tensor, precision: str = "auto") -> str:
    """`precision`, with "auto" decided by timing `model(x)` (no grad, eval mode, x on the model's device) in fp32
    and under bf16 autocast (`choose_precision`, kind "infer-precision", keyed by the model and x's shape)."""
    import torch

    _check(precision)
    if precision != "auto":
        return precision

    def forward(p: str) -> None:
        with torch.no_grad(), autocast(x.device, p):
            model(x)

    was_training = model.training
    model.eval()
    try:
        return choose_precision(precision, x.device, kind="infer-precision",
                                shape_key=f"{model_signature(model)} x{tuple(x.shape)}", run=forward,
                                what="forward pass")
    finally:
        model.train(was_training)
