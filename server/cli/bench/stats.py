"""Small statistics for the benchmark: spreads, paired ratios, the sign test and Wilson intervals.

Pure Python (no numpy), so the rules are easy to read and test:

* a spread is the median with the interquartile range (linear interpolation between order
  statistics, numpy's default) and the extremes;
* two settings are compared on *paired* measurements (same run, same prompt, same temperature):
  the two-sided sign test counts the pairs each one wins, ties dropped;
* a pass rate's 95% confidence interval is the Wilson score interval; two pass rates measured on the
  same problems are compared with the exact McNemar test (a sign test on the discordant problems).
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


def quantile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile with linear interpolation between order statistics (numpy's default)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def median(xs: Sequence[float]) -> float:
    return quantile(xs, 0.5)


def spread(xs: Sequence[float]) -> dict[str, float]:
    """median, quartiles and extremes of ``xs`` (NaN when empty)."""
    xs = list(xs)
    nan = float("nan")
    return {
        "median": median(xs), "q1": quantile(xs, 0.25), "q3": quantile(xs, 0.75),
        "min": min(xs) if xs else nan, "max": max(xs) if xs else nan, "n": len(xs),
    }


def geomean(xs: Iterable[float]) -> float:
    xs = [x for x in xs]
    if not xs or any(x <= 0 for x in xs):
        return float("nan")
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact sign test: the probability, under "each pair is a coin flip", of a split at
    least as uneven as ``wins``/``losses`` (ties are not counted). 1.0 with no untied pairs."""
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Exact McNemar test on paired pass/fail outcomes: a sign test on the discordant pairs."""
    return sign_test(only_a, only_b)


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (95% by default); (0, 1) when ``n`` is 0."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # Exactly 0 (1) at no (all) successes, rather than a rounding error away from it.
    return (0.0 if successes <= 0 else max(0.0, centre - half)), (1.0 if successes >= n else min(1.0, centre + half))


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether the closed intervals ``a`` and ``b`` share a point."""
    return a[0] <= b[1] and b[0] <= a[1]
