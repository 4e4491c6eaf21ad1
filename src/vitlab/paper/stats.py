"""The claims' statistics over seeds (`vitlab.utils.stats`, a floor below: `vitlab demo --seeds` uses them too):
means with standard errors, "yes" / "no" / "within noise", and the sub-run directory of each seed."""

from ..utils.stats import (
    NO,
    NOISE,
    PARTLY,
    YES,
    Estimate,
    K,
    arm,
    binomial_se,
    combine,
    difference,
    pct_se,
    points,
    seed_name,
    verdict,
)

__all__ = [
    "NO",
    "NOISE",
    "PARTLY",
    "YES",
    "Estimate",
    "K",
    "arm",
    "binomial_se",
    "combine",
    "difference",
    "pct_se",
    "points",
    "seed_name",
    "verdict",
]
