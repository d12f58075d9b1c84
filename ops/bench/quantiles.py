"""Quantiles as the benchmarks quote them.

Two definitions, each kept as the figures already quoted in docs/performance.md were computed:
:func:`nearest_rank` (the schedule benchmark's) and :func:`percentile` (the gateway benchmark's,
the value at index ``int(q * n)``). They differ by at most one rank.
"""

from __future__ import annotations

from collections import deque


def nearest_rank(values: list[float] | deque[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank; 0 for none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))] if ordered else 0.0


def percentile(values: list[float], q: float) -> float:
    """The value at index ``int(q * n)`` of ``values`` sorted (the last for ``q`` = 1); NaN for none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")
