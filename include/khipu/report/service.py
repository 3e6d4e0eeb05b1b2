"""The reports behind every page of the Khipu view, its JSON API and the read commands of the CLI.

Each reads the store (and, for traces, the archive) and answers one question. Questions about
something that does not exist (an unknown stream, hop, group or verdict kind, a negative window,
a malformed page cursor) raise :class:`ReportQueryError` naming what is known, never an empty
answer; a message with no verdict and no trace raises :class:`UnknownMessage`.

Given the registry as one person sees it (:class:`khipu.access.SeenRegistry`, what the view passes), a report
shows nothing beyond its reach: another team's stream, message, group or hop is answered as one that does not
exist. Given the registry itself (the CLI), it shows everything it reads.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyarrow import ArrowException

from khipu.access import Reach, alert_in_reach, reach_limit
from khipu.alerting.thresholds import window_start_ms
from khipu.detector.model import DETECTOR_QUERY
from khipu.detector.supervise import SupervisionConfig
from khipu.errors import InvalidSetting
from khipu.health.evaluate import time_lag_bound_ms
from khipu.health.rules import PartitionStatus
from khipu.offsets.model import PartitionKey
from khipu.reconcile.window import horizon_from_env
from khipu.registry.model import Registry, UnknownStreamError
from khipu.report.message import MessageReport, lay_out
from khipu.report.overview import (
    DAY_MS,
    WINDOWS,
    StreamInWindow,
    StreamOverview,
    ViewWindow,
    streams_in_window,
    streams_overview,
)
from khipu.report.routemap import PartitionState, RouteMap, route_map
from khipu.report.storage import StorageHealth, storage_health
from khipu.retention.policy import RetentionPolicy
from khipu.storage.location import Location
from khipu.store import Store
from khipu.trace.archive import HOUR_MS, hours_between, read_traces, read_traces_in_hours
from khipu.verdicts.archive import VerdictArchive
from khipu.verdicts.metrics import MinuteCounts
from khipu.verdicts.model import LOSS_KINDS, RESEND_KINDS, Cause, VerdictKind
from khipu.verdicts.read import verdicts_of, with_first_decisions

log = logging.getLogger(__name__)

DEFAULT_PAGE = 50
MAX_PAGE = 500
MAX_MINUTES = 366 * 24 * 60  # a year: the longest window a question may ask about
MAX_ATTRIBUTE_HOURS = 48  # a page's recovery attributes read at most this many archive hours (the newest)
LOSS_VERDICTS = tuple(sorted(kind.value for kind in LOSS_KINDS | RESEND_KINDS))  # losses, and how they ended
VERDICT_KINDS = tuple(sorted(kind.value for kind in VerdictKind))
CAUSES = tuple(sorted(cause.value for cause in Cause))


class ReportQueryError(InvalidSetting):
    kind = "query"


class UnknownMessage(LookupError):
    def __init__(self, message_id: str) -> None:
        super().__init__(f"no verdict and no archived trace of message {message_id!r}")
        self.message_id = message_id


def check_stream(registry: Registry, stream: str | None) -> None:
    if stream is not None:
        registry.stream(stream)  # UnknownStreamError names the streams the registry defines


def check_minutes(minutes: float) -> int:
    """A window in minutes -> ms; it must be more than 0 and at most a year."""
    if not (math.isfinite(minutes) and 0 < minutes <= MAX_MINUTES):
        raise ReportQueryError("minutes", minutes, f"a window of more than 0 minutes, at most {MAX_MINUTES} (a year)")
    return int(minutes * 60_000)


def trace_slack_ms() -> int:
    """How long before its first verdict a message's traces may have come: the reconciliation horizon."""
    return horizon_from_env()


def overview(store: Store, registry: Registry, now_ms: int) -> list[StreamOverview]:
    """Streams overview: every stream and hop, the last hour and day, the day's loss-rate and p99 series."""
    return streams_overview(registry, store.verdicts.read_metrics(since_ms=now_ms - DAY_MS), now_ms)


def check_window(key: str) -> ViewWindow:
    """The streams page's window named ``key`` (15m, 1h, 1d, 1w)."""
    window = next((w for w in WINDOWS if w.key == key), None)
    if window is None:
        raise ReportQueryError("window", key, f"one of {', '.join(w.key for w in WINDOWS)}")
    return window


@dataclass(frozen=True, slots=True)
class StreamView:
    """A stream on the streams page: its hops' figures over the window, and its route map over the same."""

    table: StreamInWindow
    route: RouteMap


def streams_view(store: Store, registry: Registry, now_ms: int, window: ViewWindow) -> list[StreamView]:
    """Every stream, the busiest first, with its hops' figures over ``window`` and its route map: each hop's
    figures and state, and the consumer health the last evaluation stored on each cluster of the registry."""
    since_ms = window_start_ms(now_ms, window.span_ms)
    tables = streams_in_window(registry, store.verdicts.read_metrics(since_ms=since_ms), now_ms, window)
    clusters = sorted({hop.topic.cluster for s in registry.streams.values() for hop in s.route.hops})
    health = [
        PartitionState(cluster, str(row["group_id"]), str(row["topic"]), int(row["partition"]), status)
        for cluster in clusters
        for row in store.health.current_rows(cluster)
        if (status := PartitionStatus.__members__.get(str(row["status"]))) is not None
    ]
    return [
        StreamView(table, route_map(registry.streams[table.stream], table.figures, health, since_ms))
        for table in tables
    ]


def check_cluster(registry: Registry, cluster: str) -> None:
    """A cluster the registry declares (the consumer-health page of a group on another cluster than Khipu's)."""
    if cluster not in registry.clusters:
        raise ReportQueryError("cluster", cluster, f"a cluster of the registry: {', '.join(sorted(registry.clusters))}")


def metric_rows(store: Store, registry: Registry, stream: str | None, since_ms: int) -> list[dict[str, Any]]:
    check_stream(registry, stream)
    limit = reach_limit(registry)
    rows = store.verdicts.read_metrics(stream=stream, since_ms=since_ms)
    return [row for row in rows if _streams_in(limit, row["stream"])]


def _streams_in(limit: Reach | None, stream: object) -> bool:
    """A row of ``stream`` goes into an answer limited to ``limit`` (None: no limit)."""
    return limit is None or str(stream) in limit.streams


@dataclass(frozen=True, slots=True)
class VerdictQuery:
    verdicts: tuple[str, ...] = LOSS_VERDICTS
    stream: str | None = None
    hop: str | None = None
    cause: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    limit: int = DEFAULT_PAGE
    cursor: str | None = None  # the page after the one whose ``next_cursor`` this is

    def checked(self, registry: Registry) -> VerdictQuery:
        for verdict in self.verdicts:
            if verdict not in VERDICT_KINDS:
                raise ReportQueryError("verdict", verdict, f"one of {', '.join(VERDICT_KINDS)}")
        if self.cause is not None and self.cause not in CAUSES:
            raise ReportQueryError("cause", self.cause, f"one of {', '.join(CAUSES)}")
        check_stream(registry, self.stream)
        if self.hop is not None:
            hops = sorted(
                {hop.id for name, s in registry.streams.items() if self.stream in (None, name) for hop in s.route.hops}
            )
            if self.hop not in hops:
                raise ReportQueryError("hop", self.hop, f"a hop of {self.stream or 'a stream'}: {'; '.join(hops)}")
        if not 1 <= self.limit <= MAX_PAGE:
            raise ReportQueryError("limit", self.limit, f"1 to {MAX_PAGE} rows a page")
        if self.since_ms is not None and self.until_ms is not None and self.until_ms <= self.since_ms:
            raise ReportQueryError("until", self.until_ms, f"a time after since ({self.since_ms})")
        decode_cursor(self.cursor)
        return self


@dataclass(frozen=True, slots=True)
class VerdictPage:
    rows: list[dict[str, Any]]  # verdict columns + "attributes" (recovery) + "history" (its changes) + "resends"
    next_cursor: str | None  # None: this was the last page
    query: dict[str, Any] = field(default_factory=dict)
    attributes_note: str | None = None  # why some recovery attributes are not shown (None: all read)


def encode_cursor(row: dict[str, Any]) -> str:
    raw = json.dumps([int(row["decided_ms"]), str(row["message_id"]), str(row["hop"])]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> tuple[int, str, str] | None:
    if not cursor:
        return None
    try:
        decided_ms, message_id, hop = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if not 0 <= int(decided_ms) < 2**62:
            raise ValueError(decided_ms)
        return int(decided_ms), str(message_id), str(hop)
    except (ValueError, TypeError):
        raise ReportQueryError("cursor", cursor, "the next_cursor of a previous page") from None


def verdict_page(
    store: Store, registry: Registry, archive_dir: Location | Path | None, query: VerdictQuery
) -> VerdictPage:
    """One page of verdicts, newest first, each with its recovery attributes and its history."""
    query = query.checked(registry)
    limit = reach_limit(registry)
    rows = store.verdicts.page(
        streams=None if limit is None else limit.streams,
        verdicts=query.verdicts,
        stream=query.stream,
        hop=query.hop,
        cause=query.cause,
        since_ms=query.since_ms,
        until_ms=query.until_ms,
        before=decode_cursor(query.cursor),
        limit=query.limit + 1,
    )
    more, rows = len(rows) > query.limit, rows[: query.limit]
    ids = {str(row["message_id"]) for row in rows}
    histories = store.verdicts.histories(ids)
    resends = store.resends.of_messages(ids)
    attributes, note = _attributes(archive_dir, rows)
    for row in rows:
        row["history"] = [  # the store's row ids are its own business
            {k: v for k, v in c.items() if k != "id"}
            for c in histories.get(str(row["message_id"]), [])
            if c["hop"] == row["hop"]
        ]
        row["attributes"] = attributes.get(str(row["message_id"]), {})
        row["resends"] = resends.get((str(row["message_id"]), str(row["hop"])), [])  # the resend ledger, by attempt
    return VerdictPage(
        rows=rows,
        next_cursor=encode_cursor(rows[-1]) if more else None,
        query={
            "verdicts": list(query.verdicts),
            "stream": query.stream,
            "hop": query.hop,
            "cause": query.cause,
            "since_ms": query.since_ms,
            "until_ms": query.until_ms,
            "limit": query.limit,
        },
        attributes_note=note,
    )


def _attributes(
    archive_dir: Location | Path | None, rows: Sequence[dict[str, Any]]
) -> tuple[dict[str, dict[str, str]], str | None]:
    """The recovery attributes of the rows' messages, from the archive hours each row's traces can be in (at most
    the newest MAX_ATTRIBUTE_HOURS of them); an archive that cannot be read costs the attributes, not the page."""
    if archive_dir is None or not rows:
        return {}, None
    slack = trace_slack_ms()
    hours: set[int] = set()
    for row in rows:
        hours.update(hours_between(int(row.get("first_seen_ms") or row["decided_ms"]) - slack, int(row["decided_ms"])))
    read = sorted(hours)[-MAX_ATTRIBUTE_HOURS:]
    note = None
    if len(read) < len(hours):
        note = f"recovery attributes read from the newest {MAX_ATTRIBUTE_HOURS} of {len(hours)} archive hours"
    try:
        traces = read_traces_in_hours(archive_dir, {str(row["message_id"]) for row in rows}, read)
    except (OSError, ArrowException) as exc:
        log.warning("recovery attributes not read from the trace archive %s: %s", archive_dir, exc)
        return {}, f"recovery attributes unavailable: the trace archive could not be read ({type(exc).__name__})"
    found: dict[str, dict[str, str]] = {}
    for trace in traces:
        found.setdefault(trace.message_id, {}).update(trace.attributes)
    return found, note


def message_report(
    store: Store,
    registry: Registry,
    archive_dir: Location | Path | None,
    message_id: str,
    now_ms: int,
    verdict_archive_dir: Location | Path | None = None,
) -> MessageReport:
    """Everything known of one message, along its route: its verdicts (the store's, and the verdict archive's
    plain DELIVERED ones where the store has none), their history (an archived verdict's: its decision),
    its traces. Raises UnknownMessage when nothing is known."""
    if verdict_archive_dir is None:
        found = verdicts_of(store.verdicts, None, [message_id])
    else:
        with VerdictArchive(verdict_archive_dir, store) as archive:
            found = verdicts_of(store.verdicts, archive, [message_id])
    limit = reach_limit(registry)  # another team's message is one that does not exist
    verdicts = [row for row in found.rows if _streams_in(limit, row["stream"])]
    changes = [change for change in store.verdicts.history(message_id) if _streams_in(limit, change["stream"])]
    history = with_first_decisions(changes, verdicts)
    resends = [
        entry
        for entries in store.resends.of_messages([message_id]).values()
        for entry in entries
        if _streams_in(limit, entry["stream"])
    ]
    if verdicts:
        slack = trace_slack_ms()
        seen = [int(row.get("first_seen_ms") or row["decided_ms"]) for row in verdicts]
        last = [int(row["decided_ms"]) for row in verdicts] + [int(e["updated_ms"]) for e in resends]
        span = (min(seen) - slack, max(last) + slack)  # a resent copy's traces come when it was produced
    else:
        span = (now_ms - DAY_MS, now_ms)
    traces = read_traces(archive_dir, [message_id], *span) if archive_dir is not None else []
    traces = [trace for trace in traces if _streams_in(limit, trace.stream)]
    names = {str(row["stream"]) for row in verdicts} | {trace.stream for trace in traces}
    stream = next((registry.streams[name] for name in sorted(names) if name in registry.streams), None)
    report = dataclasses.replace(
        lay_out(message_id, stream, verdicts, history, traces), resends=resends, verdicts_note=found.note
    )
    if not verdicts and not traces:
        raise UnknownMessage(message_id)
    return report


@dataclass(frozen=True, slots=True)
class PartitionHealthLine:
    cluster: str
    group: str
    topic: str
    partition: int
    status: str
    since_ms: int
    evaluated_ms: int
    lag: int | None
    time_lag_ms: int | None  # the oldest unconsumed record's age; None: not known (khipu.health.evaluate.time_lag)
    reason: str
    expiry_risk: bool
    retention_ms: int | None
    evidence_from_ms: int | None  # the evidence window: first and last committed-offset observation judged
    evidence_to_ms: int | None
    committed: int | None
    log_end: int | None
    lag_history: list[int | None] = field(default_factory=list)  # the last hour's snapshots, oldest first
    time_lag_under_ms: int | None = None  # the time lag is not known, but under this (records came since a snapshot)


@dataclass(frozen=True, slots=True)
class ConsumerReport:
    cluster: str
    partitions: list[PartitionHealthLine]
    windows: list[dict[str, Any]]  # skips and rewinds: offset windows
    transitions: list[dict[str, Any]]  # status changes, newest first


def consumer_report(
    store: Store, cluster: str, now_ms: int, group: str | None = None, registry: Registry | None = None
) -> ConsumerReport:
    """Consumer health per group and partition (the Burrow view), its offset windows and its history; given a seen
    registry, of the partitions its streams' routes read only."""
    limit = reach_limit(registry) if registry is not None else None

    def seen(group_id: object, topic: object) -> bool:
        return limit is None or (cluster, str(group_id), str(topic)) in limit.reads

    rows = [row for row in store.health.current_rows(cluster) if seen(row["group_id"], row["topic"])]
    groups = sorted({str(row["group_id"]) for row in rows})
    if group is not None and group not in groups:
        raise ReportQueryError(
            "group", group, f"a group with health recorded on cluster {cluster!r}: {', '.join(groups) or 'none yet'}"
        )
    histories = store.snapshots.histories(cluster, since_ms=now_ms - HOUR_MS)
    lines = []
    for row in rows:
        if group is not None and row["group_id"] != group:
            continue
        key = PartitionKey(row["cluster"], row["group_id"], row["topic"], int(row["partition"]))
        evidence = json.loads(row["evidence"] or "{}")
        window = evidence.get("window") or []
        lines.append(
            PartitionHealthLine(
                cluster=row["cluster"],
                group=row["group_id"],
                topic=row["topic"],
                partition=int(row["partition"]),
                status=row["status"],
                since_ms=int(row["since_ms"]),
                evaluated_ms=int(row["evaluated_ms"]),
                lag=row["lag"],
                time_lag_ms=row["time_lag_ms"],
                reason=row["reason"],
                expiry_risk=row["status"] == "EXPIRY_RISK",
                retention_ms=evidence.get("retention_ms"),
                evidence_from_ms=int(window[0][1]) if window else None,
                evidence_to_ms=int(window[-1][1]) if window else None,
                committed=evidence.get("committed"),
                log_end=evidence.get("log_end"),
                lag_history=[snapshot.lag for snapshot in histories.get(key, [])],
                time_lag_under_ms=time_lag_bound_ms(evidence),
            )
        )
    windows = [
        {
            "group": w.key.group,
            "topic": w.key.topic,
            "partition": w.key.partition,
            "kind": w.kind,
            "from_offset": w.from_offset,
            "to_offset": w.to_offset,
            "detected_ms": w.detected_ms,
        }
        for w in store.health.offset_windows(cluster, since_ms=now_ms - DAY_MS)
        if group in (None, w.key.group) and seen(w.key.group, w.key.topic)
    ]
    transitions = [
        {k: row[k] for k in ("group_id", "topic", "partition", "from_status", "to_status", "at_ms", "reason")}
        for row in store.health.transition_rows(cluster, since_ms=now_ms - DAY_MS, group=group)
        if seen(row["group_id"], row["topic"])
    ]
    return ConsumerReport(cluster, lines, sorted(windows, key=lambda w: -int(w["detected_ms"])), transitions)


@dataclass(frozen=True, slots=True)
class QueryBeat:
    query: str
    at_ms: int | None  # the newest heartbeat; None: never
    age_s: float | None
    batch_id: int | None
    input_rows_per_s: float | None
    processed_rows_per_s: float | None
    batch_duration_ms: int | None
    state_rows: int | None
    caught_up: bool | None
    stale: bool  # no heartbeat, or none for longer than the detector-down alert allows
    series: list[dict[str, Any]]  # the last hour: at_ms, input and processed rows/s, batch duration, state rows


@dataclass(frozen=True, slots=True)
class SkewLine:
    """A hop whose latencies clock skew made impossible (negative) over the last day: the emitters at its two ends."""

    stream: str
    hop: str
    earlier: str  # the location(s) whose trace the latency starts from (the topic's writers; a processor itself)
    later: str  # the location whose trace it ends at
    impossible: int  # latencies that came out negative: counted here, in no percentile
    worst_ms: int  # the most negative of them (as its bucket: three significant digits)


@dataclass(frozen=True, slots=True)
class KhipuHealth:
    queries: list[QueryBeat]
    quarantined: int
    quarantine: list[dict[str, Any]]  # the newest quarantined: topic, partition, offset, line, reason
    emitters_with_gaps: list[dict[str, Any]]  # per emitter: gaps open, sequence numbers missing
    clock_skew: list[SkewLine] = field(default_factory=list)  # per hop, worst first
    skew_by_emitter: dict[str, int] = field(default_factory=dict)  # location -> impossible latencies it took part in
    storage: StorageHealth | None = None  # the archives, the store and the state folder's disk (when they are known)


def clock_skew(registry: Registry, metric_rows: Sequence[dict[str, Any]]) -> list[SkewLine]:
    """Per hop, the latencies clock skew made impossible in these minute rows, with the emitters at its ends."""
    counts: dict[tuple[str, str], MinuteCounts] = {}
    for row in metric_rows:
        if row.get("skew_histogram"):
            key = (str(row["stream"]), str(row["hop"]))
            counts[key] = counts.get(key, MinuteCounts()).plus(MinuteCounts.of_row(row))
    limit = reach_limit(registry)
    lines = []
    for (stream_name, hop_id), summed in counts.items():
        if not summed.skewed or (limit is not None and (stream_name, hop_id) not in limit.hops):
            continue
        stream = registry.streams.get(stream_name)
        hop = next((h for h in stream.route.hops if h.id == hop_id), None) if stream is not None else None
        earlier = later = "?"
        if stream is not None and hop is not None and hop.group is not None:  # a read: the writers, then the group
            earlier = ", ".join(sorted({h.location or "?" for h in stream.route.writers_of(hop.topic)}))
            later = stream.route.location_of(hop.group) or hop.group
        elif hop is not None:  # a processor's write: its own receive, then its write
            earlier = later = hop.location or "?"
        lines.append(SkewLine(stream_name, hop_id, earlier, later, summed.skewed, min(summed.skew_histogram)))
    return sorted(lines, key=lambda line: (line.worst_ms, line.stream, line.hop))


def khipu_health(
    store: Store,
    now_ms: int,
    queries: Collection[str] = (DETECTOR_QUERY,),
    stale_after_ms: int | None = None,
    registry: Registry | None = None,
    archives: Mapping[str, Location | Path] | None = None,
    policy: RetentionPolicy | None = None,
) -> KhipuHealth:
    """Khipu's own health: the detector's heartbeat and rates, the trace channel's gaps and quarantine, and (with
    the registry) the emitters whose clocks disagree over the last day. A heartbeat older than ``stale_after_ms``
    (default: the detector-down alert's, KHIPU_DETECTOR_STALE_AFTER_S) is stale."""
    stale_ms = SupervisionConfig.from_env().stale_after_ms if stale_after_ms is None else stale_after_ms
    beats = []
    for name in queries:
        latest = store.heartbeat.latest(name)
        series = [
            {
                k: row[k]
                for k in ("at_ms", "input_rows_per_s", "processed_rows_per_s", "batch_duration_ms", "state_rows")
            }
            for row in store.heartbeat.series(name, now_ms - HOUR_MS)
        ]
        beats.append(
            QueryBeat(
                query=name,
                at_ms=None if latest is None else int(latest["at_ms"]),
                age_s=None if latest is None else max(0.0, (now_ms - int(latest["at_ms"])) / 1000),
                batch_id=None if latest is None else int(latest["batch_id"]),
                input_rows_per_s=None if latest is None else latest["input_rows_per_s"],
                processed_rows_per_s=None if latest is None else latest["processed_rows_per_s"],
                batch_duration_ms=None if latest is None else latest["batch_duration_ms"],
                state_rows=None if latest is None else latest["state_rows"],
                caught_up=None if latest is None else bool(latest["caught_up"]),
                stale=latest is None or now_ms - int(latest["at_ms"]) > stale_ms,
                series=series,
            )
        )
    total, newest = store.channel.quarantine_page(limit=20)
    skew = clock_skew(registry, store.verdicts.read_metrics(since_ms=now_ms - DAY_MS)) if registry is not None else []
    by_emitter: dict[str, int] = {}
    for line in skew:
        for location in {*line.earlier.split(", "), line.later}:
            by_emitter[location] = by_emitter.get(location, 0) + line.impossible
    storage = None
    if archives:
        storage = storage_health(
            archives, policy or RetentionPolicy(), store.engine.size_bytes(), store.verdicts.oldest_minute()
        )
    limit = reach_limit(registry) if registry is not None else None
    gaps = [gap for gap in store.channel.gap_summary() if limit is None or gap["location"] in limit.locations]
    return KhipuHealth(beats, total, newest, gaps, skew, dict(sorted(by_emitter.items())), storage)


def alerts_report(store: Store, since_ms: int, registry: Registry | None = None) -> list[dict[str, Any]]:
    """Alerts fired and resolved since ``since_ms``, newest first, with each notifier's outcome; given a seen
    registry, those about its streams and the groups their routes read with, and those about Khipu itself."""
    limit = reach_limit(registry) if registry is not None else None
    return [
        {
            "subject": alert.subject,
            "kind": alert.kind,
            "state": alert.state,
            "severity": alert.severity,
            "title": alert.title,
            "at_ms": alert.at_ms,
            "details": alert.details,
            "delivered_ms": alert.delivered_ms if alert.delivered_ms and alert.delivered_ms > 0 else None,
            "deliveries": alert.deliveries,
        }
        for alert in reversed(store.alerts.read(since_ms=since_ms))
        if limit is None or alert_in_reach(alert.details, limit)
    ]


__all__ = [
    "ConsumerReport",
    "KhipuHealth",
    "MessageReport",
    "ReportQueryError",
    "StreamOverview",
    "UnknownMessage",
    "UnknownStreamError",
    "VerdictPage",
    "VerdictQuery",
    "StreamView",
    "alerts_report",
    "check_cluster",
    "check_minutes",
    "check_window",
    "consumer_report",
    "khipu_health",
    "message_report",
    "metric_rows",
    "overview",
    "streams_view",
    "verdict_page",
]
