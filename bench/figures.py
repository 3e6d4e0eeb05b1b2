"""What every bench prints beside a figure: its target and whether the figure met it; percentiles in which what
never came counts as infinitely late; and the one rule the benches time a LOST verdict by."""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from khipu.verdicts.metrics import percentile

NO_TARGET = "(no target)"
LOST_DEADLINE_S = 180.0  # a loss not seen LOST this long after the responsible group's commit: infinitely late
K = TypeVar("K", bound=Hashable)  # what names a lost message


def against(target: str, met: bool) -> str:
    """``target >= 25,000 traces/s: met`` (or ``NOT met``)."""
    return f"target {target}: {'met' if met else 'NOT met'}"


def unjudged(target: str, why: str) -> str:
    """``target >= 25,000 traces/s: not judged (why)``: a figure this run did not measure as its target asks."""
    return f"target {target}: not judged ({why})"


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


@dataclass(frozen=True)
class LostLatencies:
    """The LOST latencies of a set of losses, by :func:`lost_latencies`'s rule."""

    latencies_s: tuple[float, ...]  # one per loss counted: seen LOST within the deadline, or math.inf
    late: int  # seen LOST, but more than the deadline after the commit (counted as infinitely late)
    never: int  # not seen LOST, the deadline passed (counted as infinitely late)
    pending: int  # not seen LOST yet, the deadline not yet passed: not counted
    deadline_s: float

    @property
    def within(self) -> int:
        """Losses seen LOST within the deadline."""
        return len(self.latencies_s) - self.late - self.never

    def at(self, fraction: float) -> float:
        """:func:`percentile_s` of the losses counted."""
        return percentile_s(self.latencies_s, fraction)

    def worst(self) -> float:
        return max(self.latencies_s, default=math.nan)

    def counted(self) -> str:
        """What the figure counts, as its line says it: ``40 losses, 2 not seen LOST within 180 s of the commit,
        counted as infinitely late (1 seen later, 1 never)``, and any not counted yet."""
        waiting = f"; {self.pending:,} not seen yet, within their {self.deadline_s:.0f} s (not counted)"
        return (
            f"{len(self.latencies_s):,} losses, {self.late + self.never:,} not seen LOST within "
            f"{self.deadline_s:.0f} s of the commit, counted as infinitely late ({self.late:,} seen later, "
            f"{self.never:,} never){waiting if self.pending else ''}"
        )


def lost_latencies(
    committed_at: Mapping[K, float], seen_at: Mapping[K, float], now: float, deadline_s: float = LOST_DEADLINE_S
) -> LostLatencies:
    """Every bench's rule for LOST latency: from the responsible group's commit passing a lost message
    (``committed_at``, epoch s) to the bench first seeing its LOST verdict (``seen_at``). A loss not seen LOST within
    ``deadline_s`` of that commit counts as infinitely late, whether it was seen later or never. One not seen yet at
    ``now`` whose deadline has not passed is not counted (the caller waits out the deadlines before its last
    figure). ``seen_at`` may hold messages that were not lost: they are not latencies (the caller reports them)."""
    latencies: list[float] = []
    late = never = pending = 0
    for message, committed in committed_at.items():
        seen = seen_at.get(message)
        if seen is not None and seen - committed <= deadline_s:
            latencies.append(seen - committed)
        elif seen is not None:
            late += 1
            latencies.append(math.inf)
        elif now - committed > deadline_s:
            never += 1
            latencies.append(math.inf)
        else:
            pending += 1
    return LostLatencies(tuple(latencies), late, never, pending, deadline_s)
