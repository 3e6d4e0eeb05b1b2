"""Per-minute metrics of verdicts: counts per kind, loss and duplicate rates, latency percentiles.

A minute's metrics are recomputed from every verdict stored for that (stream, hop, minute)
whenever a batch touches it, so a replayed batch leaves the same numbers. The detector's
verdict writer drives it: it reads the minutes' verdicts from the store, computes here, and
upserts the result (:class:`khipu.detector.outputs.VerdictWriter`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from khipu.detector.model import VerdictKind

MINUTE_MS = 60_000
COUNTED = (
    VerdictKind.DELIVERED,
    VerdictKind.LOST,
    VerdictKind.DUPLICATE,
    VerdictKind.TRACE_LOST,
    VerdictKind.PENDING,
    VerdictKind.CONFIRMED_LOST,
    VerdictKind.RETRACTED,
)  # every kind a stored verdict has; the rates are shares of these
# a resent or unrecoverable loss was a confirmed loss all the same: its minute's loss rate does not change
COUNTED_AS = {VerdictKind.RESENT: VerdictKind.CONFIRMED_LOST, VerdictKind.UNRECOVERABLE: VerdictKind.CONFIRMED_LOST}


class Outcome(Protocol):
    """What the metrics read of one stored verdict."""

    @property
    def verdict(self) -> str: ...
    @property
    def latency_ms(self) -> int | None: ...


class MinuteKey(NamedTuple):
    stream: str
    hop: str
    minute_ms: int  # the minute's start

    @property
    def span(self) -> tuple[str, str, int, int]:
        """(stream, hop, from_ms, to_ms): the verdicts decided in this minute."""
        return self.stream, self.hop, self.minute_ms, self.minute_ms + MINUTE_MS


@dataclass(frozen=True, slots=True)
class MinuteMetrics:
    stream: str
    hop: str
    minute_ms: int
    delivered: int
    lost: int
    duplicate: int
    trace_lost: int
    pending: int
    confirmed_lost: int
    retracted: int
    false_loss_rate: float | None  # retracted / provisional LOST (lost + confirmed + retracted); None: no loss said
    loss_rate: float  # (lost + confirmed lost) / verdicts counted (0 when none)
    duplicate_rate: float
    latency_p50_ms: int | None  # None: no verdict of the minute has a latency
    latency_p95_ms: int | None
    latency_p99_ms: int | None


def minute_of(decided_ms: int) -> int:
    return decided_ms // MINUTE_MS * MINUTE_MS


def minutes_touched(rows: Iterable[Mapping[str, Any]]) -> list[MinuteKey]:
    """The (stream, hop, minute) of each verdict row (``stream``, ``hop``, ``decided_ms``), once each, sorted."""
    return sorted({MinuteKey(r["stream"], r["hop"], minute_of(int(r["decided_ms"]))) for r in rows})


def minute_metrics(key: MinuteKey, outcomes: Iterable[Outcome]) -> MinuteMetrics:
    """The metrics of one minute of a stream's hop from every verdict stored for it."""
    seen = list(outcomes)
    counts = dict.fromkeys(COUNTED, 0)
    for outcome in seen:
        kind = VerdictKind(outcome.verdict)
        counts[COUNTED_AS.get(kind, kind)] += 1
    judged = sum(counts.values()) or 1
    said_lost = counts[VerdictKind.LOST] + counts[VerdictKind.CONFIRMED_LOST] + counts[VerdictKind.RETRACTED]
    latencies = [int(o.latency_ms) for o in seen if o.latency_ms is not None]
    return MinuteMetrics(
        stream=key.stream,
        hop=key.hop,
        minute_ms=key.minute_ms,
        delivered=counts[VerdictKind.DELIVERED],
        lost=counts[VerdictKind.LOST],
        duplicate=counts[VerdictKind.DUPLICATE],
        trace_lost=counts[VerdictKind.TRACE_LOST],
        pending=counts[VerdictKind.PENDING],
        confirmed_lost=counts[VerdictKind.CONFIRMED_LOST],
        retracted=counts[VerdictKind.RETRACTED],
        false_loss_rate=counts[VerdictKind.RETRACTED] / said_lost if said_lost else None,
        loss_rate=(counts[VerdictKind.LOST] + counts[VerdictKind.CONFIRMED_LOST]) / judged,
        duplicate_rate=counts[VerdictKind.DUPLICATE] / judged,
        latency_p50_ms=percentile(latencies, 0.50),
        latency_p95_ms=percentile(latencies, 0.95),
        latency_p99_ms=percentile(latencies, 0.99),
    )


def percentile(values: Iterable[int], fraction: float) -> int | None:
    """The value at ``fraction`` of the sorted values (the nearest rank, rounded); None when there are none."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]
