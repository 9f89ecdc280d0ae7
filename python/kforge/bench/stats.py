"""Suite statistics. Pure functions over plain numbers, so that they are unit-tested directly."""
from __future__ import annotations

import math
from typing import Iterable, Sequence

FAST_P_THRESHOLDS = (1.0, 1.5, 2.0, 4.0)


def geomean(values: Iterable[float]) -> float | None:
    """Geometric mean of positive values; None when there are none."""
    vals = [float(v) for v in values]
    if not vals:
        return None
    if any(v <= 0 or math.isnan(v) for v in vals):
        raise ValueError(f"geomean needs positive numbers, got {vals}")
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def fast_p(speedups: Sequence[float | None], p: float) -> float | None:
    """Fraction of workloads that are correct AND faster than the baseline by more than p.

    `speedups` holds one entry per workload of the suite: the speedup of a correct result, or
    None for a workload whose KForge result is missing, failed or incorrect (it counts in the
    denominator as not fast). As in KernelBench, the comparison is strict: fast_1 counts
    workloads strictly faster than the baseline. None when the suite is empty.
    """
    if not speedups:
        return None
    return sum(1 for s in speedups if s is not None and s > p) / len(speedups)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100] (numpy's default method)."""
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50.0)


def summarize(speedups: Sequence[float | None], roofline_fractions: Sequence[float | None]) -> dict:
    """The per-policy suite summary written to JSON and Markdown."""
    correct = [s for s in speedups if s is not None]
    fractions = [f for f in roofline_fractions if f is not None and f > 0]
    return {
        "workloads": len(speedups),
        "correct": len(correct),
        "geomean_speedup": geomean(correct),
        "fast_p": {f"{p:g}": fast_p(speedups, p) for p in FAST_P_THRESHOLDS},
        "geomean_roofline_fraction": geomean(fractions),
    }
