"""Figures over a window and series from per-minute metric rows: boundaries, gaps, percentiles."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from khipu.alerting.thresholds import window_figures as alert_figures
from khipu.alerting.thresholds import window_start_ms
from khipu.registry.loader import parse_registry
from khipu.report.overview import (
    DAY_MS,
    DEFAULT_WINDOW,
    WINDOWS,
    ViewWindow,
    series,
    streams_in_window,
    window_figures,
)

MINUTE = 60_000


def minute(at: int, delivered: int = 0, **counts: Any) -> dict[str, Any]:
    return {"stream": "s", "hop": "h", "minute_ms": at, "delivered": delivered, **counts}


@dataclass(frozen=True)
class Case:
    name: str
    rows: list[dict[str, Any]]
    since_ms: int
    verdicts: int
    loss_rate: float
    p50: int | None
    p99: int | None


CASES = [
    Case("no rows: zeros, no latency", [], 0, 0, 0.0, None, None),
    Case(
        "a minute starting before the window start is out, one starting at it is in",
        [minute(0, 10, lost=10), minute(MINUTE, 9, lost=1)],
        MINUTE,
        10,
        0.1,
        None,
        None,
    ),
    Case(
        "confirmed losses count as losses; retracted and pending count as verdicts",
        [minute(0, 6, confirmed_lost=2, retracted=1, pending=1)],
        0,
        10,
        0.2,
        None,
        None,
    ),
    Case(
        "p99 is the worst minute's; p50 the delivered-weighted median of the minutes' p50s",
        [
            minute(0, 1, latency_p50_ms=900, latency_p99_ms=5_000),
            minute(MINUTE, 9, latency_p50_ms=100, latency_p99_ms=300),
        ],
        0,
        10,
        0.0,
        100,
        5_000,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_window_figures(case: Case) -> None:
    figures = window_figures(case.rows, case.since_ms)
    assert (figures.verdicts, figures.loss_rate, figures.latency_p50_ms, figures.latency_p99_ms) == (
        case.verdicts,
        pytest.approx(case.loss_rate),
        case.p50,
        case.p99,
    )


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_view_and_the_alerts_sum_the_same_minutes(case: Case) -> None:
    view = window_figures(case.rows, case.since_ms)
    alerts = alert_figures([r for r in case.rows if r["minute_ms"] >= case.since_ms]).get(("s", "h"))
    assert (view.verdicts, view.loss_rate) == ((alerts.verdicts, alerts.loss_rate) if alerts else (0, 0.0))


def test_a_window_starts_at_the_minute_holding_its_start() -> None:
    assert window_start_ms(10 * MINUTE + 1, 5 * MINUTE) == 5 * MINUTE
    assert window_start_ms(10 * MINUTE, 5 * MINUTE) == 5 * MINUTE


def test_series_has_every_bucket_and_empty_ones_have_no_figures() -> None:
    rows = [minute(0, 9, lost=1, latency_p99_ms=40), minute(MINUTE, 10, latency_p99_ms=70), minute(5 * MINUTE, 4)]
    points = series(rows, 0, 6 * MINUTE, 2 * MINUTE)
    assert [p.at_ms for p in points] == [0, 2 * MINUTE, 4 * MINUTE]
    assert [(p.verdicts, p.loss_rate, p.latency_p99_ms) for p in points] == [
        (20, 0.05, 70),
        (0, None, None),
        (4, 0.0, None),
    ]
    assert series(rows, 0, 0, MINUTE) == ()


@pytest.mark.parametrize("window", WINDOWS, ids=[w.key for w in WINDOWS])
def test_a_chosen_window_sums_its_minutes_and_charts_them_in_its_steps(window: ViewWindow) -> None:
    registry = parse_registry(
        "version: 1\nclusters: {c: {}}\nstreams:\n  s:\n    owner: team-t\n"
        "    route: {producers: [{location: p, writes: [c/t]}], consumers: [{group: g, reads: [c/t]}]}\n"
    )
    now = 1_000 * DAY_MS + 30_000  # half a minute into a minute
    hop = "p -> c/t"
    inside = [now - window.span_ms + window.step_ms + MINUTE, now - MINUTE]  # in its second step, in its last
    outside = [now - window.span_ms - MINUTE]  # the minute before the one holding its start
    rows = [{**minute(at // MINUTE * MINUTE, 3, lost=1), "hop": hop} for at in inside + outside]
    (stream,) = streams_in_window(registry, rows, now, window)
    figures = stream.figures[hop]
    assert (figures.delivered, figures.lost, figures.since_ms) == (6, 2, window_start_ms(now, window.span_ms))
    assert stream.figures["c/t -> g"].verdicts == 0 and stream.window is window
    (shown,) = [h for h in stream.hops if h.hop == hop]
    assert {b.at_ms % window.step_ms for b in shown.series} == {0}  # whole steps
    assert len(shown.series) == window.span_ms // window.step_ms  # every step of the window, empty ones too
    assert sum(b.verdicts for b in shown.series) == 8  # both minutes inside, not the one before the window


def test_the_windows_offered_are_15_minutes_an_hour_a_day_and_a_week() -> None:
    assert [(w.key, w.span_ms) for w in WINDOWS] == [
        ("15m", 15 * MINUTE), ("1h", 60 * MINUTE), ("1d", DAY_MS), ("1w", 7 * DAY_MS)
    ]  # fmt: skip
    assert DEFAULT_WINDOW.key == "1h"
