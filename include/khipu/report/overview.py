"""The streams overview: per stream and hop, what the verdicts of a window say, and how it moved.

Computed from the store's minute metric rows (``verdict_metrics``), never from the verdicts
themselves, so the page costs the same at a million verdicts as at a thousand. A window sums the
minutes from the one holding its start (:func:`khipu.alerting.thresholds.window_start_ms`, as the
alerts and the exporter do); the rates are recomputed from the sums; latency p95 and p99 are the
worst minute's (a bound that never hides a bad minute), p50 is the median of the minutes' p50s
weighted by their delivered counts.

The streams page shows one window at a time, chosen among :data:`WINDOWS` (15 minutes, an hour, a
day, a week): :func:`streams_in_window`. The JSON API's overview keeps the last hour and the last day
side by side: :func:`streams_overview`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from khipu.alerting.thresholds import COUNTED_KINDS as COUNTED
from khipu.alerting.thresholds import window_start_ms
from khipu.registry.model import Registry
from khipu.trace.archive import HOUR_MS
from khipu.verdicts.metrics import APART, MinuteCounts

MINUTE_MS = 60_000
DAY_MS = 24 * HOUR_MS


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """What one hop's verdicts of one window say."""

    since_ms: int
    delivered: int = 0
    lost: int = 0  # provisional LOST
    confirmed_lost: int = 0
    duplicate: int = 0
    trace_lost: int = 0
    pending: int = 0
    retracted: int = 0
    reprocessed: int = 0  # duplicates of an exactly-once processor's reprocessing: shown, not in the duplicate rate
    aborted: int = 0  # Kafka's own semantics, apart from every rate
    superseded: int = 0
    latency_p50_ms: int | None = None
    latency_p95_ms: int | None = None
    latency_p99_ms: int | None = None
    skewed: int = 0  # latencies clock skew made impossible (in no percentile)

    @property
    def verdicts(self) -> int:
        """The verdicts the rates are shares of (ABORTED and SUPERSEDED are not)."""
        return sum(getattr(self, name) for name in COUNTED)

    @property
    def loss_rate(self) -> float:
        return (self.lost + self.confirmed_lost) / self.verdicts if self.verdicts else 0.0

    @property
    def duplicate_rate(self) -> float:
        return self.duplicate / self.verdicts if self.verdicts else 0.0


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    """One bucket of a hop's time series: its start, verdicts, loss rate and worst p99 (None: no verdict)."""

    at_ms: int
    verdicts: int
    loss_rate: float | None
    latency_p99_ms: int | None


@dataclass(frozen=True, slots=True)
class HopOverview:
    stream: str
    hop: str
    hop_kind: str
    last_hour: WindowFigures
    last_day: WindowFigures
    series: tuple[SeriesPoint, ...]


@dataclass(frozen=True, slots=True)
class StreamOverview:
    stream: str
    owner: str
    loss_rate_threshold: float
    duplicate_rate_threshold: float
    latency_p99_threshold_ms: int | None
    hops: tuple[HopOverview, ...] = field(default_factory=tuple)


def window_figures(rows: Iterable[Mapping[str, Any]], since_ms: int) -> WindowFigures:
    """One hop's figures from its minute rows at or after ``since_ms`` (a minute's start)."""
    counts = dict.fromkeys((*COUNTED, *APART), 0)
    p50s: list[tuple[int, int]] = []
    p95: int | None = None
    p99: int | None = None
    skewed = 0
    for row in rows:
        if int(row["minute_ms"]) < since_ms:
            continue
        for name in counts:
            counts[name] += int(row.get(name) or 0)
        skewed += sum(MinuteCounts.histogram_of_json(row.get("skew_histogram")).values())
        if row.get("latency_p50_ms") is not None:
            p50s.append((int(row["latency_p50_ms"]), max(int(row.get("delivered") or 0), 1)))
        p95 = _worst(p95, row.get("latency_p95_ms"))
        p99 = _worst(p99, row.get("latency_p99_ms"))
    p50 = _weighted_median(p50s)
    return WindowFigures(since_ms, **counts, latency_p50_ms=p50, latency_p95_ms=p95, latency_p99_ms=p99, skewed=skewed)


def series(rows: Iterable[Mapping[str, Any]], start_ms: int, end_ms: int, bucket_ms: int) -> tuple[SeriesPoint, ...]:
    """The hop's loss rate and worst p99 per bucket of ``bucket_ms`` from ``start_ms`` to ``end_ms``; every bucket
    is there, empty ones with no figures (a gap in the line, not a zero)."""
    buckets = max(0, -(-(end_ms - start_ms) // bucket_ms))
    verdicts, losses = [0] * buckets, [0] * buckets
    p99s: list[int | None] = [None] * buckets
    for row in rows:
        index = (int(row["minute_ms"]) - start_ms) // bucket_ms
        if not 0 <= index < buckets:
            continue
        verdicts[index] += sum(int(row.get(name) or 0) for name in COUNTED)
        losses[index] += int(row.get("lost") or 0) + int(row.get("confirmed_lost") or 0)
        p99s[index] = _worst(p99s[index], row.get("latency_p99_ms"))
    return tuple(
        SeriesPoint(start_ms + i * bucket_ms, verdicts[i], losses[i] / verdicts[i] if verdicts[i] else None, p99s[i])
        for i in range(buckets)
    )


@dataclass(frozen=True, slots=True)
class ViewWindow:
    """A window the streams page shows: its name in the page's address, in words, its span, its charts' step, and
    how its charts name their first step's time."""

    key: str
    label: str
    span_ms: int
    step_ms: int
    ago: str


WINDOWS: tuple[ViewWindow, ...] = (
    ViewWindow("15m", "last 15 minutes", 15 * MINUTE_MS, MINUTE_MS, "15 min ago"),
    ViewWindow("1h", "last hour", HOUR_MS, 2 * MINUTE_MS, "1 h ago"),
    ViewWindow("1d", "last day", DAY_MS, 30 * MINUTE_MS, "24 h ago"),
    ViewWindow("1w", "last week", 7 * DAY_MS, 4 * HOUR_MS, "7 d ago"),
)
DEFAULT_WINDOW = WINDOWS[1]


@dataclass(frozen=True, slots=True)
class HopInWindow:
    hop: str
    hop_kind: str
    figures: WindowFigures
    series: tuple[SeriesPoint, ...]  # the window in steps of its ``step_ms``
    enters_route: bool = False  # a producer's write: the message's first trace, no latency is measured there


@dataclass(frozen=True, slots=True)
class StreamInWindow:
    stream: str
    owner: str
    loss_rate_threshold: float
    duplicate_rate_threshold: float
    latency_p99_threshold_ms: int | None
    window: ViewWindow
    hops: tuple[HopInWindow, ...] = field(default_factory=tuple)

    @property
    def figures(self) -> dict[str, WindowFigures]:
        """Each hop's figures, by hop id."""
        return {hop.hop: hop.figures for hop in self.hops}


MetricsByHop = dict[tuple[str, str], list[Mapping[str, Any]]]


def _by_hop(metric_rows: Iterable[Mapping[str, Any]]) -> MetricsByHop:
    by_hop: MetricsByHop = {}
    for row in metric_rows:
        by_hop.setdefault((str(row["stream"]), str(row["hop"])), []).append(row)
    return by_hop


def _streams_and_hops(registry: Registry, by_hop: MetricsByHop) -> list[tuple[str, list[tuple[str, str]]]]:
    """Every registry stream, the busiest first, with (hop id, kind) of each hop of its route in route order, then
    the hops that have metrics but left the route (kind "unknown")."""
    busiest = sorted(
        registry.streams, key=lambda name: (-sum(len(r) for (s, _), r in by_hop.items() if s == name), name)
    )
    found = []
    for name in busiest:
        hops = [(hop.id, hop.kind.value) for hop in registry.streams[name].route.hops]
        hops += [(hop, "unknown") for (s, hop) in sorted(by_hop) if s == name and hop not in dict(hops)]
        found.append((name, hops))
    return found


def streams_in_window(
    registry: Registry, metric_rows: Sequence[Mapping[str, Any]], now_ms: int, window: ViewWindow
) -> list[StreamInWindow]:
    """Every registry stream (the busiest first) with every hop of its route, in route order, with the figures of
    ``window`` and its series in steps of ``window.step_ms`` (from the first whole step in it)."""
    by_hop = _by_hop(metric_rows)
    since_ms = window_start_ms(now_ms, window.span_ms)
    first_step = -(-(now_ms - window.span_ms) // window.step_ms) * window.step_ms
    found = []
    for name, hops in _streams_and_hops(registry, by_hop):
        stream = registry.streams[name]
        entries = {hop.id for hop in stream.route.hops if stream.route.is_source(hop)}
        found.append(
            StreamInWindow(
                stream=name,
                owner=stream.owner,
                loss_rate_threshold=stream.alerts.loss_rate,
                duplicate_rate_threshold=stream.alerts.duplicate_rate,
                latency_p99_threshold_ms=stream.alerts.latency_p99_ms,
                window=window,
                hops=tuple(
                    HopInWindow(
                        hop=hop,
                        hop_kind=kind,
                        figures=window_figures(by_hop.get((name, hop), ()), since_ms),
                        series=series(by_hop.get((name, hop), ()), first_step, now_ms, window.step_ms),
                        enters_route=hop in entries,
                    )
                    for hop, kind in hops
                ),
            )
        )
    return found


def streams_overview(
    registry: Registry, metric_rows: Sequence[Mapping[str, Any]], now_ms: int, bucket_ms: int = 30 * 60_000
) -> list[StreamOverview]:
    """Every registry stream (the busiest first) with every hop of its route, in route order, with the last hour's
    and last day's figures and the last day's series; hops that have metrics but left the route come after."""
    by_hop = _by_hop(metric_rows)
    day_start = -(-(now_ms - DAY_MS) // bucket_ms) * bucket_ms  # the first whole bucket of the day
    overviews = []
    for name, hops in _streams_and_hops(registry, by_hop):
        stream = registry.streams[name]
        overviews.append(
            StreamOverview(
                stream=name,
                owner=stream.owner,
                loss_rate_threshold=stream.alerts.loss_rate,
                duplicate_rate_threshold=stream.alerts.duplicate_rate,
                latency_p99_threshold_ms=stream.alerts.latency_p99_ms,
                hops=tuple(
                    HopOverview(
                        stream=name,
                        hop=hop,
                        hop_kind=kind,
                        last_hour=window_figures(by_hop.get((name, hop), ()), window_start_ms(now_ms, HOUR_MS)),
                        last_day=window_figures(by_hop.get((name, hop), ()), window_start_ms(now_ms, DAY_MS)),
                        series=series(by_hop.get((name, hop), ()), day_start, now_ms, bucket_ms),
                    )
                    for hop, kind in hops
                ),
            )
        )
    return overviews


def _worst(current: int | None, value: object) -> int | None:
    if value is None:
        return current
    number = int(str(value))
    return number if current is None else max(current, number)


def _weighted_median(values: list[tuple[int, int]]) -> int | None:
    if not values:
        return None
    ordered = sorted(values)
    half, running = sum(weight for _, weight in ordered) / 2, 0
    for value, weight in ordered:
        running += weight
        if running >= half:
            return value
    return ordered[-1][0]
