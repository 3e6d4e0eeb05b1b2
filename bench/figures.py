"""What every bench prints beside a figure: its target and whether the figure met it, and percentiles in which what
never came counts as infinitely late."""

from __future__ import annotations

import math
from collections.abc import Iterable

from khipu.verdicts.metrics import percentile

NO_TARGET = "(no target)"


def against(target: str, met: bool) -> str:
    """``target >= 25,000 traces/s: met`` (or ``NOT met``)."""
    return f"target {target}: {'met' if met else 'NOT met'}"


def percentile_s(latencies_s: Iterable[float], fraction: float) -> float:
    """The latency at ``fraction`` by the rank the product's own percentiles take
    (:func:`khipu.verdicts.metrics.percentile`); ``math.inf`` stands for one that never came, so the p95 is
    infinite once more than 5 % never came. NaN when there are none."""
    ordered = sorted(latencies_s)
    rank = percentile(range(len(ordered)), fraction)
    return math.nan if rank is None else ordered[rank]


def seconds(value: float) -> str:
    """A latency figure as printed: ``12.3 s``, ``not reached`` (infinite: some never came), ``-`` (none)."""
    if math.isnan(value):
        return "-"
    return "not reached" if math.isinf(value) else f"{value:.1f} s"
