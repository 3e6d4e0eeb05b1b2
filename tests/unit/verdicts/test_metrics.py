"""A minute's metrics from its verdicts, as a numbered table of cases, each with the reason its answer is right."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from khipu.verdicts.metrics import MINUTE_MS, MinuteKey, MinuteMetrics, minute_metrics, minutes_touched

KEY = MinuteKey("orders", "orders/sink", 5 * MINUTE_MS)


class Stored(NamedTuple):
    verdict: str
    latency_ms: int | None = None


class Case(NamedTuple):
    number: int
    outcomes: list[Stored]
    counts: tuple[int, int, int, int, int]  # delivered, lost, duplicate, trace_lost, pending
    rates: tuple[float, float]  # loss, duplicate
    latencies: tuple[int | None, int | None, int | None]  # p50, p95, p99
    reason: str


def delivered(*latencies: int | None) -> list[Stored]:
    return [Stored("DELIVERED", ms) for ms in latencies]


# fmt: off
CASES = [
    Case(1, [], (0, 0, 0, 0, 0), (0.0, 0.0), (None, None, None),
         "no verdict in the minute: zero counts, rates over one verdict rather than a division by zero"),
    Case(2, delivered(30, 10, 20), (3, 0, 0, 0, 0), (0.0, 0.0), (20, 30, 30),
         "three latencies sorted 10, 20, 30: the median is the middle one; 95 % of the way rounds to the last"),
    Case(3, [*delivered(5, 5, 5), Stored("LOST")], (3, 1, 0, 0, 0), (0.25, 0.0), (5, 5, 5),
         "one LOST among four verdicts: loss rate 1/4; the LOST has no latency and adds none"),
    Case(4, [Stored("DUPLICATE", 7), *delivered(9)], (1, 0, 1, 0, 0), (0.0, 0.5), (7, 9, 9),
         "a duplicate is a verdict with its own latency: duplicate rate 1/2, two latencies"),
    Case(5, [Stored("LOST"), Stored("PENDING"), Stored("TRACE_LOST"), Stored("TRACE_LOST")],
         (0, 1, 0, 2, 1), (0.25, 0.0), (None, None, None),
         "PENDING and TRACE_LOST are judged verdicts too: they count in the denominator"),
    Case(6, [Stored("CONFIRMED_LOST"), Stored("RETRACTED", 50), *delivered(10)], (1, 0, 0, 0, 0), (1 / 3, 0.0),
         (10, 50, 50),
         "final verdicts count: a confirmed loss is a loss (1 of 3 verdicts); a retracted one was delivered late "
         "and has its latency"),
    Case(7, delivered(None, 8, None), (3, 0, 0, 0, 0), (0.0, 0.0), (8, 8, 8),
         "verdicts without a latency are counted but leave the percentiles to those that have one"),
    Case(8, delivered(20, 10), (2, 0, 0, 0, 0), (0.0, 0.0), (10, 20, 20),
         "two latencies: the median's rank 0.5 rounds half to even, to the lower one"),
    Case(9, delivered(*range(100, -1, -1)), (101, 0, 0, 0, 0), (0.0, 0.0), (50, 95, 99),
         "latencies 0..100 in any order: each percentile is the value of its rank"),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=[f"{c.number}" for c in CASES])
def test_minute_metrics(case: Case) -> None:
    got = minute_metrics(KEY, case.outcomes)
    assert (got.stream, got.hop, got.minute_ms) == KEY, case.reason
    assert (got.delivered, got.lost, got.duplicate, got.trace_lost, got.pending) == case.counts, case.reason
    assert (got.loss_rate, got.duplicate_rate) == case.rates, case.reason
    assert (got.latency_p50_ms, got.latency_p95_ms, got.latency_p99_ms) == case.latencies, case.reason


def test_the_numbers_are_the_same_however_the_verdicts_are_ordered() -> None:
    outcomes = [Stored("LOST"), *delivered(3, 1, 2), Stored("DUPLICATE", 9)]
    first: MinuteMetrics = minute_metrics(KEY, outcomes)
    assert minute_metrics(KEY, list(reversed(outcomes))) == first


def test_a_batch_touches_each_minute_of_each_stream_and_hop_once_at_the_minute_start() -> None:
    rows = [
        {"stream": "orders", "hop": "a", "decided_ms": MINUTE_MS - 1},
        {"stream": "orders", "hop": "a", "decided_ms": 0},  # the same minute again
        {"stream": "orders", "hop": "a", "decided_ms": MINUTE_MS},  # the next minute starts here
        {"stream": "orders", "hop": "b", "decided_ms": 10},
        {"stream": "payments", "hop": "a", "decided_ms": 3 * MINUTE_MS + 5},
    ]
    assert minutes_touched(rows) == [
        MinuteKey("orders", "a", 0),
        MinuteKey("orders", "a", MINUTE_MS),
        MinuteKey("orders", "b", 0),
        MinuteKey("payments", "a", 3 * MINUTE_MS),
    ]
    assert MinuteKey("orders", "a", MINUTE_MS).span == ("orders", "a", MINUTE_MS, 2 * MINUTE_MS)


def test_false_loss_rate_is_retracted_over_every_loss_once_said() -> None:
    outcomes = [Stored("LOST"), Stored("CONFIRMED_LOST"), Stored("RETRACTED", 5), Stored("RETRACTED", 6), *delivered(1)]
    got = minute_metrics(KEY, outcomes)
    assert (got.confirmed_lost, got.retracted, got.false_loss_rate) == (1, 2, 0.5)  # 2 of 4 LOSTs were false
    assert minute_metrics(KEY, delivered(1)).false_loss_rate is None  # no loss said: no rate to speak of
