"""The verdict of a claim from runs over seeds: means, standard errors and "yes" / "no" / "within noise" (used by
`vitlab reproduce --seeds`, `vitlab.paper`, and `vitlab demo --seeds`; a floor below both).

An arm of an experiment (one model, one method, one setting) run with N seeds (model init, data order,
augmentation) is summarised by its mean and the standard error of that mean, s / sqrt(N) with s the seeds'
sample standard deviation. With one seed there is no spread to measure: the standard error is then the test set's
own, sqrt(p (1 - p) / n) for a top-1 p on n test images (the only noise one run can state; it does not include the
seed's). Two arms' difference has the standard error sqrt(se_a^2 + se_b^2) (independent runs). A claim that the
difference is at least a bar reads "yes" only when the mean difference is at least K = 2 standard errors above the
bar, "no" only when it is 2 below, and otherwise "within noise"; the report gives the numbers either way.

    a, b = arm([0.91, 0.90, 0.92]), arm([0.89, 0.88, 0.90])
    d = difference(a, b)                # mean 0.02, se sqrt(2) * 0.01 / sqrt(3)
    verdict(d.mean, d.se, bar=0.01)     # "within noise": 0.02 - 0.01 < 2 * 0.0082
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

K = 2.0  # standard errors a difference must clear
YES, NO, NOISE, PARTLY = "yes", "no", "within noise", "partly"


@dataclass(frozen=True)
class Estimate:
    """A mean with its standard error.

    Attributes:
        mean: The mean over the seeds (or a difference of means).
        se: Its standard error (nan when nothing says it).
        n: Seeds behind it (for a difference, the smaller of the two arms').
        values: The individual seeds' values (empty for a difference).
        source: "seeds" (the seeds' spread), "test set" (one seed: the binomial standard error of its test set),
            or "none".
    """

    mean: float
    se: float
    n: int
    values: tuple[float, ...] = field(default=())
    source: str = "seeds"

    def to_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "se": self.se if math.isfinite(self.se) else None, "n": self.n,
                "values": list(self.values), "se_source": self.source}


def binomial_se(p: float, n: int) -> float:
    """The standard error of an accuracy `p` measured on `n` images: sqrt(p (1 - p) / n)."""
    return math.sqrt(max(0.0, p * (1 - p)) / n) if n and n > 0 else float("nan")


def arm(values: Sequence[float], test_images: int | None = None) -> Estimate:
    """The mean of an arm's per-seed `values` and its standard error: the seeds' s / sqrt(N) with two or more seeds,
    else the binomial standard error on `test_images` (nan without it)."""
    xs = tuple(float(v) for v in values)
    if not xs:
        raise ValueError("an arm needs at least one value")
    n = len(xs)
    mean = sum(xs) / n
    if n >= 2:
        s2 = sum((x - mean) ** 2 for x in xs) / (n - 1)
        return Estimate(mean, math.sqrt(s2 / n), n, xs, "seeds")
    if test_images:
        return Estimate(mean, binomial_se(mean, test_images), 1, xs, "test set")
    return Estimate(mean, float("nan"), 1, xs, "none")


def difference(a: Estimate, b: Estimate) -> Estimate:
    """a minus b, with the standard error of the difference of two independent means, sqrt(se_a^2 + se_b^2)."""
    source = a.source if a.source == b.source else f"{a.source} / {b.source}"
    return Estimate(a.mean - b.mean, math.sqrt(a.se ** 2 + b.se ** 2), min(a.n, b.n), (), source)


def verdict(diff: float, se: float, bar: float = 0.0, k: float = K) -> str:
    """"yes" when `diff` is at least `k` standard errors above `bar`, "no" when at least `k` below, else "within
    noise" (also when the standard error is unknown)."""
    if not math.isfinite(se):
        return NOISE
    if diff - bar >= k * se:
        return YES
    if diff - bar <= -k * se:
        return NO
    return NOISE


def combine(verdicts: Iterable[str]) -> str:
    """One verdict for a claim tested at several settings: the common one when all agree, else "partly"."""
    vs = set(verdicts)
    if len(vs) == 1:
        return vs.pop()
    return PARTLY if vs else NOISE


def points(x: float | Estimate, digits: int = 1) -> str:
    """An accuracy difference as points, "+1.5 ± 0.4" (± one standard error, when known)."""
    if isinstance(x, Estimate):
        se = f" ± {100 * x.se:.{digits}f}" if math.isfinite(x.se) else ""
        return f"{100 * x.mean:+.{digits}f}{se}"
    return f"{100 * x:+.{digits}f}"


def pct_se(e: Estimate | None, digits: int = 1) -> str:
    """An arm as "90.6% ± 0.3 (3 seeds)", or "90.6%" for one seed."""
    if e is None:
        return "-"
    if e.n >= 2:
        return f"{100 * e.mean:.{digits}f}% ± {100 * e.se:.{digits}f} ({e.n} seeds)"
    return f"{100 * e.mean:.{digits}f}%"


def seed_name(base: str, seed: int) -> str:
    """The sub-run directory of seed `seed` of an arm: seed 0 keeps the arm's own name (the single-seed runs of
    earlier versions are its seed 0), seed k > 0 is `base-seed{k}`."""
    return base if seed == 0 else f"{base}-seed{seed}"
