"""Khipu's Prometheus exporter: what the store holds, read afresh on every scrape.

A custom collector (:class:`KhipuCollector`) opens the store on each scrape, reads it, closes it and
turns the reading into metric families (:func:`metric_families`, pure: the reading and the clock come
in as arguments). Names follow KMinion's and Burrow's exporter: snake_case, units as suffixes
(``_seconds``), ``_total`` only for real counters (there are none here: every figure is a gauge over
a sliding window or a current state), ``cluster, group, topic, partition`` labels on consumer metrics.
Labels are streams, hops, verdict kinds, causes, groups, partitions, query names, emitter locations
and alert kinds: all bounded by the registry and the deployment, never a message id.

A store that cannot be read still gets an answer: ``khipu_exporter_scrape_error 1`` and the
exporter's own metrics, with the error logged (its store named without the URL's password).

:func:`serve_metrics` serves a registry on ``/metrics`` (a bearer token optional);
:func:`run_exporter` is what ``khipu exporter`` runs.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import make_wsgi_app
from prometheus_client.core import GaugeHistogramMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector, CollectorRegistry

from khipu.alerting.decide import DETECTOR_ALERT_KIND
from khipu.alerting.thresholds import (
    VERDICT_ALERT_KIND,
    HopFigures,
    ThresholdConfig,
    window_figures,
    window_start_ms,
)
from khipu.alerting.trail import TRAIL_ALERT_KIND
from khipu.clock import now_ms
from khipu.config import ExporterSection, default, load
from khipu.detector.model import DETECTOR_QUERY
from khipu.detector.trail import TrailFigures, trail_figures
from khipu.errors import InvalidSetting
from khipu.health.evaluate import time_lag_bound_ms
from khipu.health.rules import PartitionStatus
from khipu.registry.loader import load_registry
from khipu.registry.model import AlertThresholds
from khipu.report.storage import storage_families, storage_health
from khipu.retention.policy import RetentionPolicy
from khipu.settings import KhipuSettings
from khipu.storage.location import Location
from khipu.store import Store, StoreError
from khipu.trace.archive import HOUR_MS
from khipu.verdicts.metrics import counts_by_hop, verdict_counts
from khipu.verdicts.model import VerdictKind

log = logging.getLogger(__name__)

DEFAULT_HOST: str = default(ExporterSection, "host")
DEFAULT_PORT: int = default(ExporterSection, "port")
METRICS_PATH = "/metrics"
MINUTE_MS = 60_000
SKIPPED_WINDOW_MS = 86_400_000
LATENCY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# Alert kinds that resolve, so that "firing" means something. offset_window and task_failure alerts are
# one-off events, never resolved: every subject they ever named would count as firing forever.
GROUP_STATUS_ALERT_KIND = "group_status"
RESOLVING_ALERT_KINDS = (DETECTOR_ALERT_KIND, GROUP_STATUS_ALERT_KIND, TRAIL_ALERT_KIND, VERDICT_ALERT_KIND)
CONSUMER_LABELS = ("cluster", "group", "topic", "partition")

LatencyCounts = tuple[list[int], int, int]  # cumulative counts per bound, count, sum in ms (each latency as its bucket)


class ExporterConfigError(InvalidSetting):
    kind = "exporter setting"


class ExporterError(RuntimeError):
    """The exporter could not start serving (the address is taken or cannot be bound)."""


@dataclass(frozen=True, slots=True)
class ExporterConfig:
    """Where the exporter listens, the token it asks for, and the windows of its figures."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    token: str | None = field(default=None, repr=False)  # None: no token asked for
    alert_window_ms: int = ThresholdConfig().window_ms  # the verdict-threshold alerts' window
    verdict_window_ms: int = HOUR_MS  # verdict counts and the latency histogram

    def __post_init__(self) -> None:
        if self.token is None and not _is_loopback(self.host):  # every team's figures, to whoever reaches the port
            raise ExporterConfigError(
                "KHIPU_EXPORTER_TOKEN",
                None,
                f"a bearer token when the exporter listens on {self.host}, which is not a loopback address: its "
                "metrics carry every team's figures (set KHIPU_EXPORTER_TOKEN, or KHIPU_EXPORTER_HOST=127.0.0.1)",
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ExporterConfig:
        """``KHIPU_EXPORTER_HOST``, ``KHIPU_EXPORTER_PORT``, ``KHIPU_EXPORTER_TOKEN`` (unset or empty: none;
        :class:`khipu.config.ExporterSection`), and the alert window of :class:`ThresholdConfig`
        (``KHIPU_ALERT_WINDOW_MS``)."""
        section = load(ExporterSection, environ, ExporterConfigError)
        return cls(
            host=section.host,
            port=section.port,
            token=section.token,
            alert_window_ms=ThresholdConfig.from_env(environ).window_ms,
        )


@dataclass(frozen=True, slots=True)
class ExportWindows:
    """The windows the exported figures cover."""

    verdict_window_ms: int = HOUR_MS
    alert_window_ms: int = ThresholdConfig().window_ms
    latency_buckets_s: tuple[float, ...] = LATENCY_BUCKETS_S


@dataclass(frozen=True, slots=True)
class StoreReading:
    """What one scrape read from the store."""

    verdict_kinds: Mapping[tuple[str, str, str, str], int]  # (stream, hop, verdict, cause or "") -> verdicts
    hop_figures: Mapping[tuple[str, str], HopFigures]  # over the alert window
    latencies: Mapping[tuple[str, str], LatencyCounts]  # per (stream, hop), bounds as the buckets
    skew: Mapping[tuple[str, str], tuple[int, int]]  # per (stream, hop): impossible latencies, the worst (ms)
    partitions: Sequence[Mapping[str, Any]]  # store.health.current_rows
    heartbeats: Mapping[str, Mapping[str, Any] | None]  # query -> its newest report (None: never)
    quarantined: int
    gaps: Sequence[Mapping[str, Any]]  # store.channel.gap_summary
    alerts_firing: Mapping[str, int]  # alert kind -> subjects whose last alert fired
    trails: Mapping[str, TrailFigures | None] = field(default_factory=dict)  # query -> how far it trails the topic
    skipped: Mapping[str, int] = field(default_factory=dict)  # query -> offsets it skipped in the last day


NOTHING_READ = StoreReading({}, {}, {}, {}, [], {}, 0, [], {})


def read_store(store: Store, cluster: str, now_ms: int, windows: ExportWindows, queries: Sequence[str]) -> StoreReading:
    """Everything a scrape shows, read from the store. Verdict counts and latencies come from the minute metrics
    (every verdict is counted there, rows and archived DELIVERED alike), the causes of the exceptions from
    their rows; both over the same whole minutes."""
    bounds_ms = [round(bound_s * 1000) for bound_s in windows.latency_buckets_s]
    alert_since = window_start_ms(now_ms, windows.alert_window_ms)
    verdict_since = window_start_ms(now_ms, windows.verdict_window_ms)
    metric_rows = store.verdicts.read_metrics(since_ms=min(alert_since, verdict_since))
    in_verdict_window = [row for row in metric_rows if row["minute_ms"] >= verdict_since]
    exceptions = store.verdicts.kind_counts(verdict_since, excluding=[VerdictKind.DELIVERED.value])
    quarantined, _ = store.channel.quarantine_page(limit=1)
    return StoreReading(
        verdict_kinds=verdict_counts(exceptions, in_verdict_window),
        hop_figures=window_figures(row for row in metric_rows if row["minute_ms"] >= alert_since),
        latencies={
            hop: (counts.latencies_at_most(bounds_ms), counts.latency_count, counts.latency_sum_ms)
            for hop, counts in counts_by_hop(in_verdict_window).items()
            if counts.latency_count
        },
        skew={
            hop: (counts.skewed, min(counts.skew_histogram))
            for hop, counts in counts_by_hop(in_verdict_window).items()
            if counts.skewed
        },
        partitions=store.health.current_rows(cluster),
        heartbeats={query: store.heartbeat.latest(query) for query in queries},
        quarantined=quarantined,
        gaps=store.channel.gap_summary(),
        alerts_firing={kind: len(store.alerts.firing_subjects(kind)) for kind in RESOLVING_ALERT_KINDS},
        trails={query: trail_figures(store.heartbeat.trail(query)) for query in queries},
        skipped={
            query: sum(skip.offsets for skip in store.heartbeat.skips(query, since_ms=now_ms - SKIPPED_WINDOW_MS))
            for query in queries
        },
    )


def metric_families(reading: StoreReading, now_ms: int, windows: ExportWindows) -> list[Metric]:
    """The metric families of a reading, as of ``now_ms``."""
    return [
        *verdict_families(reading, windows),
        *hop_rate_families(reading, windows),
        latency_family(reading, windows),
        *skew_families(reading, windows),
        *consumer_families(reading),
        *detector_families(reading, now_ms),
        *trail_families(reading, now_ms),
        *trace_channel_families(reading),
        alerts_family(reading),
    ]


def verdict_families(reading: StoreReading, windows: ExportWindows) -> list[Metric]:
    verdicts = GaugeMetricFamily(
        "khipu_verdicts",
        f"Verdicts decided in the last {_duration(windows.verdict_window_ms)} (a sliding window of whole minutes, "
        "not a counter), per stream, hop, verdict kind and cause (empty when the verdict has none).",
        labels=("stream", "hop", "verdict", "cause"),
    )
    for (stream, hop, verdict, cause), count in sorted(reading.verdict_kinds.items()):
        verdicts.add_metric([stream, hop, verdict, cause], count)
    return [verdicts]


def hop_rate_families(reading: StoreReading, windows: ExportWindows) -> list[Metric]:
    window = f"the alert window (the last {_duration(windows.alert_window_ms)}, in whole minutes)"
    loss = GaugeMetricFamily(
        "khipu_hop_loss_rate",
        f"Lost verdicts (LOST and CONFIRMED_LOST) over the judged verdicts of the hop in {window} (all but "
        "ABORTED and SUPERSEDED, Kafka's own semantics): the figure the verdict-threshold alerts compare with the "
        "stream's loss_rate.",
        labels=("stream", "hop"),
    )
    duplicate = GaugeMetricFamily(
        "khipu_hop_duplicate_rate",
        f"DUPLICATE verdicts over the judged verdicts of the hop in {window} (an exactly-once processor's "
        "reprocessing after an abort is not one): the figure the verdict-threshold alerts compare with the "
        "stream's duplicate_rate.",
        labels=("stream", "hop"),
    )
    verdicts = GaugeMetricFamily(
        "khipu_hop_verdicts_window",
        f"Verdicts of the hop in {window}: the rates' denominator (alerts need a minimum of them).",
        labels=("stream", "hop"),
    )
    for (stream, hop), figures in sorted(reading.hop_figures.items()):
        loss.add_metric([stream, hop], figures.loss_rate)
        duplicate.add_metric([stream, hop], figures.duplicate_rate)
        verdicts.add_metric([stream, hop], figures.verdicts)
    return [loss, duplicate, verdicts]


def latency_family(reading: StoreReading, windows: ExportWindows) -> Metric:
    histogram = GaugeHistogramMetricFamily(
        "khipu_hop_latency_seconds",
        f"Latency from the previous hop to this one of the verdicts decided in the last "
        f"{_duration(windows.verdict_window_ms)} (whole minutes) that have one, per stream and hop "
        "(a gauge histogram: the buckets count the window's verdicts, they never only grow; latencies above "
        "1 s are counted to 3 significant digits, rounded down).",
        labels=("stream", "hop"),
    )
    bounds = [str(float(bound_s)) for bound_s in windows.latency_buckets_s]  # as prometheus_client writes le
    for (stream, hop), (cumulative, count, sum_ms) in sorted(reading.latencies.items()):
        buckets = [*zip(bounds, map(float, cumulative), strict=True), ("+Inf", float(count))]
        histogram.add_metric([stream, hop], buckets, sum_ms / 1000)
    return histogram


def skew_families(reading: StoreReading, windows: ExportWindows) -> list[Metric]:
    window = f"the last {_duration(windows.verdict_window_ms)} (whole minutes)"
    impossible = GaugeMetricFamily(
        "khipu_hop_clock_skew_latencies",
        f"Latencies of the hop in {window} that came out negative (received before written): the clocks of its "
        "two emitters disagree. Counted here, never in khipu_hop_latency_seconds.",
        labels=("stream", "hop"),
    )
    worst = GaugeMetricFamily(
        "khipu_hop_clock_skew_worst_seconds",
        f"The most negative latency of the hop in {window} (three significant digits): how far its clocks disagree.",
        labels=("stream", "hop"),
    )
    for (stream, hop), (count, worst_ms) in sorted(reading.skew.items()):
        impossible.add_metric([stream, hop], count)
        worst.add_metric([stream, hop], worst_ms / 1000)
    return [impossible, worst]


def consumer_families(reading: StoreReading) -> list[Metric]:
    codes = ", ".join(f"{status.value} {status.name}" for status in PartitionStatus)
    lag = GaugeMetricFamily(
        "khipu_consumer_partition_lag",
        "Messages between the group's committed offset and the partition's log end, as last evaluated.",
        labels=CONSUMER_LABELS,
    )
    time_lag = GaugeMetricFamily(
        "khipu_consumer_partition_time_lag_seconds",
        "Age of the oldest record the group has not consumed yet, as last evaluated (at least this old, to within one "
        "snapshot interval; 0: nothing waits). Absent when it was not measured: see "
        "khipu_consumer_partition_time_lag_at_most_seconds.",
        labels=CONSUMER_LABELS,
    )
    time_lag_at_most = GaugeMetricFamily(
        "khipu_consumer_partition_time_lag_at_most_seconds",
        "A bound, not a time lag: the oldest record the group has not consumed was written since the previous "
        "snapshot (a group keeping up), so its age was not measured, only known to be under this. Served only for "
        "such partitions.",
        labels=CONSUMER_LABELS,
    )
    status = GaugeMetricFamily(
        "khipu_consumer_partition_status",
        f"Partition status by Burrow's evaluation rules, as a code (higher is worse): {codes}.",
        labels=CONSUMER_LABELS,
    )
    for row in reading.partitions:
        labels = [str(row["cluster"]), str(row["group_id"]), str(row["topic"]), str(row["partition"])]
        if row["lag"] is not None:
            lag.add_metric(labels, row["lag"])
        if row["time_lag_ms"] is not None:
            time_lag.add_metric(labels, row["time_lag_ms"] / 1000)
        else:
            bound_ms = time_lag_bound_ms(json.loads(row["evidence"] or "{}"))
            if bound_ms is not None:
                time_lag_at_most.add_metric(labels, bound_ms / 1000)
        code = _status_code(str(row["status"]))
        if code is not None:
            status.add_metric(labels, code)
    return [lag, time_lag, time_lag_at_most, status]


def _status_code(name: str) -> int | None:
    try:
        return PartitionStatus[name].value
    except KeyError:
        log.warning("khipu exporter: unknown partition status %r in the store, not exported", name)
        return None


def detector_families(reading: StoreReading, now_ms: int) -> list[Metric]:
    """The newest heartbeat of each detector query; a query without one has no samples."""
    age = _query_gauge("khipu_detector_heartbeat_age_seconds", "Seconds since the query's newest heartbeat.")
    input_rate = _query_gauge("khipu_detector_input_rows_per_second", "Input rows a second in the newest batch.")
    processed_rate = _query_gauge(
        "khipu_detector_processed_rows_per_second", "Rows processed a second in the newest batch."
    )
    duration = _query_gauge("khipu_detector_batch_duration_seconds", "How long the newest batch took.")
    state_rows = _query_gauge(
        "khipu_detector_state_rows", "Messages the query holds in state (in flight, undecided) after the newest batch."
    )
    job = _query_gauge(
        "khipu_detector_batch_job_seconds",
        "The newest batch's Spark job: from its start to its results decoded on the driver (the executors' part).",
    )
    serial = _query_gauge(
        "khipu_detector_batch_serial_seconds",
        "The newest batch's time in which no task of the query ran: its duration less its job (the driver's part).",
    )
    for query, beat in sorted(reading.heartbeats.items()):
        if beat is None:
            continue
        age.add_metric([query], max(0.0, (now_ms - int(beat["at_ms"])) / 1000))
        _add_known(input_rate, query, beat["input_rows_per_s"])
        _add_known(processed_rate, query, beat["processed_rows_per_s"])
        _add_known(duration, query, None if beat["batch_duration_ms"] is None else beat["batch_duration_ms"] / 1000)
        _add_known(state_rows, query, beat["state_rows"])
        collect_ms, duration_ms = beat.get("collect_ms"), beat["batch_duration_ms"]
        if collect_ms is not None and duration_ms is not None:  # a batch the writer finished, of this release
            job.add_metric([query], collect_ms / 1000)
            serial.add_metric([query], max(0, duration_ms - collect_ms) / 1000)
    return [age, input_rate, processed_rate, duration, state_rows, job, serial]


def trail_families(reading: StoreReading, now_ms: int) -> list[Metric]:
    """How far each detector query trails the trace topic (:mod:`khipu.detector.trail`), as the broker last told: after
    each of its batches, and at each check of the detector DAG (every 2 minutes, so a stopped query's figures stay
    current); absent for a query that recorded none yet."""
    records = _query_gauge(
        "khipu_detector_trail_records",
        "Trace-topic offsets the query has not read yet: from where its newest finished batch ended to the log end, "
        "summed over the partitions, as the broker last told (after each batch, and at each detector DAG check); "
        "those the broker removed before it read them count too (khipu_detector_trail_removed_offsets).",
    )
    seconds = _query_gauge(
        "khipu_detector_trail_seconds",
        "How old the oldest trace-topic record the query has not read yet is now: the broker's timestamp of the first "
        "record still in the log after where its newest finished batch ended (the broker's append time on a "
        "LogAppendTime topic), the oldest over the partitions, to this scrape; 0 when none waits. Absent when one "
        "waits whose time is not known. Retention removes nothing younger than retention.ms: the trace_trail alert "
        "compares the two.",
    )
    removed = _query_gauge(
        "khipu_detector_trail_removed_offsets",
        "Trace-topic offsets the broker removed before the query read them, as last told: it skips them when it reads "
        "on (Spark's failOnDataLoss=false) and the messages they traced are never judged.",
    )
    skipped = _query_gauge(
        "khipu_detector_skipped_offsets",
        f"Trace-topic offsets the query's batches skipped in the last {_duration(SKIPPED_WINDOW_MS)} (a sliding "
        "window, not a counter): the broker removed them before a batch read them.",
    )
    for query, figures in sorted(reading.trails.items()):
        if figures is None:
            continue
        records.add_metric([query], figures.records_behind)
        removed.add_metric([query], figures.removed_unread)
        _add_known(seconds, query, figures.seconds_behind(now_ms))
    for query, offsets in sorted(reading.skipped.items()):
        skipped.add_metric([query], offsets)
    return [records, seconds, removed, skipped]


def _query_gauge(name: str, documentation: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, f"{documentation} Per detector streaming query.", labels=("query",))


def _add_known(family: GaugeMetricFamily, query: str, value: float | None) -> None:
    if value is not None:
        family.add_metric([query], value)


def trace_channel_families(reading: StoreReading) -> list[Metric]:
    quarantined = GaugeMetricFamily(
        "khipu_quarantined_records", "Malformed trace records kept in quarantine (all stored, not a window)."
    )
    quarantined.add_metric([], reading.quarantined)
    gaps = GaugeMetricFamily(
        "khipu_trace_gaps",
        "Open gaps in the sequence numbers of the location's trace emitters (traces they lost).",
        labels=("location",),
    )
    missing = GaugeMetricFamily(
        "khipu_trace_gap_missing_traces",
        "Sequence numbers the location's open trace gaps miss: traces never received.",
        labels=("location",),
    )
    by_location: dict[str, tuple[int, int]] = {}
    for row in reading.gaps:
        before_gaps, before_missing = by_location.get(str(row["location"]), (0, 0))
        by_location[str(row["location"])] = (before_gaps + int(row["gaps"]), before_missing + int(row["missing"] or 0))
    for location, (open_gaps, missing_traces) in sorted(by_location.items()):
        gaps.add_metric([location], open_gaps)
        missing.add_metric([location], missing_traces)
    return [quarantined, gaps, missing]


def alerts_family(reading: StoreReading) -> Metric:
    firing = GaugeMetricFamily(
        "khipu_alerts_firing",
        f"Subjects whose last alert of the kind fired and has not resolved since ({', '.join(RESOLVING_ALERT_KINDS)}"
        "; offset_window and task_failure alerts are one-off events, never resolved, so not counted here).",
        labels=("kind",),
    )
    for kind, subjects in sorted(reading.alerts_firing.items()):
        firing.add_metric([kind], subjects)
    return firing


def exporter_families(duration_s: float, store_unreadable: bool) -> list[Metric]:
    duration = GaugeMetricFamily(
        "khipu_exporter_scrape_duration_seconds", "How long this scrape took to read the store and build its metrics."
    )
    duration.add_metric([], duration_s)
    error = GaugeMetricFamily(
        "khipu_exporter_scrape_error",
        "1 when this scrape could not read the store (the exporter logs why; the store's metrics are absent), else 0.",
    )
    error.add_metric([], 1 if store_unreadable else 0)
    return [duration, error]


def _duration(ms: int) -> str:
    for unit_ms, unit in ((HOUR_MS, "h"), (MINUTE_MS, "min"), (1000, "s")):
        if ms % unit_ms == 0:
            return f"{ms // unit_ms} {unit}"
    return f"{ms} ms"


def threshold_family(thresholds: Mapping[str, AlertThresholds]) -> Metric:
    """Each stream's registry alert thresholds, so dashboards draw the line the alerts use."""
    family = GaugeMetricFamily(
        "khipu_stream_alert_threshold",
        "The stream's registry alert threshold: metric loss_rate and duplicate_rate (ratios), "
        "latency_p99_seconds; compare with khipu_hop_loss_rate, khipu_hop_duplicate_rate and the p99 of "
        "khipu_hop_latency_seconds.",
        labels=["stream", "metric"],
    )
    for stream, limits in sorted(thresholds.items()):
        family.add_metric([stream, "loss_rate"], limits.loss_rate)
        family.add_metric([stream, "duplicate_rate"], limits.duplicate_rate)
        if limits.latency_p99_ms is not None:
            family.add_metric([stream, "latency_p99_seconds"], limits.latency_p99_ms / 1000)
    return family


class KhipuCollector:
    """A ``prometheus_client`` collector reading the store on each scrape: one Store opened from
    ``open_store`` per scrape and closed after it; ``now_ms`` is the clock of the figures and
    ``elapsed_s`` the one that times the scrape."""

    def __init__(
        self,
        open_store: Callable[[], Store],
        cluster: str,
        now_ms: Callable[[], int],
        windows: ExportWindows | None = None,
        *,
        store_name: str = "the Khipu store",  # how logs name it: never with a password
        queries: Sequence[str] = (DETECTOR_QUERY,),
        elapsed_s: Callable[[], float] = time.perf_counter,
        thresholds: Mapping[str, AlertThresholds] | None = None,  # each stream's, from the registry
        archives: Mapping[str, Location | Path] | None = None,  # name -> where: their storage use is served too
        policy: RetentionPolicy | None = None,  # the disk threshold the khipu_state_disk_low gauge compares with
    ) -> None:
        self._open_store = open_store
        self._cluster = cluster
        self._now_ms = now_ms
        self._windows = windows or ExportWindows()
        self._store_name = store_name
        self._queries = tuple(queries)
        self._elapsed_s = elapsed_s
        self._thresholds = dict(thresholds or {})
        self._archives = {name: Location.of(where, name) for name, where in (archives or {}).items()}
        self._policy = policy or RetentionPolicy()
        remote = [f"the {name} ({where.url})" for name, where in self._archives.items() if not where.is_local]
        if remote:
            log.info(
                "khipu exporter: %s in an object store, on no local disk: khipu_archive_local is 0 for each "
                "archive there, and no khipu_state_disk_* gauge covers one",
                " and ".join(remote),
            )

    def describe(self) -> Iterable[Metric]:
        """The families served, without reading the store (the registry checks names with it)."""
        return [
            *metric_families(NOTHING_READ, 0, self._windows),
            threshold_family(self._thresholds),
            *exporter_families(0.0, False),
        ]

    def collect(self) -> Iterable[Metric]:
        started_s = self._elapsed_s()
        now_ms = self._now_ms()
        reading = self._read(now_ms)
        families = [] if reading is None else metric_families(reading, now_ms, self._windows)
        return [
            *families,
            *self._storage(),
            threshold_family(self._thresholds),
            *exporter_families(self._elapsed_s() - started_s, reading is None),
        ]

    def _storage(self) -> list[Metric]:
        """The archives' and the state disk's gauges (none without archives); the store's size when it answers."""
        if not self._archives:
            return []
        size = None
        try:
            store = self._open_store()
            try:
                size = store.engine.size_bytes()
            finally:
                store.close()
        except StoreError:
            pass  # the scrape error gauge already says the store could not be read
        try:
            return storage_families(storage_health(self._archives, self._policy, size))
        except OSError as exc:  # an object store that does not answer costs the storage gauges, not the scrape
            log.error("khipu exporter: the archives' storage could not be read, no storage gauges served: %s", exc)
            return []

    def _read(self, now_ms: int) -> StoreReading | None:
        """The store's reading, or None when it could not be read (logged)."""
        try:
            store = self._open_store()
            try:
                return read_store(store, self._cluster, now_ms, self._windows, self._queries)
            finally:
                store.close()
        except StoreError as exc:  # names the store without its password
            log.error("khipu exporter: cannot read the store, answering with khipu_exporter_scrape_error 1: %s", exc)
        except Exception:
            log.exception("khipu exporter: reading %s failed, answering with scrape error 1", self._store_name)
        return None


class _QuietHandler(WSGIRequestHandler):
    """wsgiref's handler, its request lines sent to the debug log rather than stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("khipu exporter: %s " + format, self.address_string(), *args)


class MetricsServer:
    """A started exporter HTTP server, answering in its own threads until :meth:`close`."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{METRICS_PATH}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def metrics_app(collector_registry: Collector, token: str | None = None) -> WSGIApplication:
    """``/metrics`` in Prometheus text format; other paths 404; with a token, 401 without
    ``Authorization: Bearer <token>`` (on every path)."""
    metrics = make_wsgi_app(collector_registry)
    expected = None if token is None else f"Bearer {token}".encode()

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if expected is not None:
            given = str(environ.get("HTTP_AUTHORIZATION", "")).encode("latin-1")  # PEP 3333: headers as latin-1
            if not hmac.compare_digest(given, expected):
                challenge = [("WWW-Authenticate", 'Bearer realm="khipu exporter"')]
                return _answer(start_response, "401 Unauthorized", "a bearer token is required", challenge)
        if environ.get("PATH_INFO") != METRICS_PATH:
            return _answer(start_response, "404 Not Found", f"the Khipu exporter serves {METRICS_PATH} only")
        return metrics(environ, start_response)  # type: ignore[no-any-return]

    return app


def _answer(
    start_response: StartResponse, status: str, text: str, headers: Sequence[tuple[str, str]] = ()
) -> list[bytes]:
    body = f"{text}\n".encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"), *headers])
    return [body]


def serve_metrics(
    collector_registry: Collector, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, token: str | None = None
) -> MetricsServer:
    """Serve the registry on ``http://host:port/metrics`` in a background thread, with ``prometheus_client``'s own
    thread-per-request server (as its ``start_http_server``) and :func:`metrics_app` in front of its WSGI app, so
    that the token is checked before any request is answered."""

    class Server(ThreadingWSGIServer):  # prometheus_client's server, in the address family of ``host``
        pass

    try:
        Server.address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        server = make_server(host, port, metrics_app(collector_registry, token), Server, handler_class=_QuietHandler)
    except OSError as exc:
        raise ExporterError(f"the exporter cannot listen on {host} port {port}: {exc.strerror or exc}") from None
    thread = threading.Thread(target=server.serve_forever, name="khipu-exporter", daemon=True)
    thread.start()
    return MetricsServer(server, thread)


def run_exporter(settings: KhipuSettings, config: ExporterConfig, say: Callable[[str], object] = print) -> None:
    """Serve Khipu's metrics of ``settings.cluster`` from ``settings.store_url`` until SIGTERM or SIGINT."""
    probe = Store(settings.store_url)  # parses the URL (a bad one fails here, at start); connects to nothing
    store_name = probe.safe_url
    probe.close()
    collector_registry = CollectorRegistry()
    collector_registry.register(
        KhipuCollector(
            lambda: Store(settings.store_url),
            settings.cluster,
            now_ms,
            ExportWindows(verdict_window_ms=config.verdict_window_ms, alert_window_ms=config.alert_window_ms),
            store_name=store_name,
            thresholds={name: stream.alerts for name, stream in load_registry(settings.registry_path).streams.items()},
            archives={"trace archive": settings.archive_dir, "verdict archive": settings.verdict_archive_dir},
            policy=RetentionPolicy.from_env(),
        )
    )
    stop = threading.Event()
    previous = _on_stop_signals(stop)
    try:
        with serve_metrics(collector_registry, config.host, config.port, config.token) as server:
            say(_listening_line(server, settings.cluster, store_name, config.token is not None))
            while not stop.wait(timeout=1.0):
                pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _on_stop_signals(stop: threading.Event) -> dict[int, Any]:
    """Set ``stop`` on SIGTERM and SIGINT; returns the handlers they had."""

    def handle(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    return {signum: signal.signal(signum, handle) for signum in (signal.SIGTERM, signal.SIGINT)}


def _listening_line(server: MetricsServer, cluster: str, store_name: str, token_required: bool) -> str:
    access = "a bearer token (KHIPU_EXPORTER_TOKEN) is required" if token_required else "no token is required"
    return (
        f"khipu exporter: serving the metrics of cluster {cluster} from {store_name} at {server.url}; "
        f"{access}; stop with Ctrl-C or SIGTERM"
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


__all__ = [
    "DEFAULT_PORT",
    "LATENCY_BUCKETS_S",
    "ExportWindows",
    "ExporterConfig",
    "ExporterConfigError",
    "ExporterError",
    "KhipuCollector",
    "MetricsServer",
    "StoreReading",
    "metric_families",
    "metrics_app",
    "read_store",
    "run_exporter",
    "serve_metrics",
]
