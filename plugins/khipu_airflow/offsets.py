"""The offset-snapshot DAG's tasks: connections -> khipu calls -> small JSON-able summaries."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from typing import Any

from khipu.alerting.cluster import evaluate_cluster
from khipu.alerting.disk import DISK_ALERT_KIND, disk_alert
from khipu.alerting.dispatch import dispatch_pending
from khipu.alerting.incidents import incident_alerts
from khipu.alerting.model import AlertState, alert_from
from khipu.alerting.thresholds import VERDICT_ALERT_KIND, ThresholdConfig, breaches, window_figures, window_start_ms
from khipu.health.evaluate import health_config_from_env
from khipu.offsets.collect import SnapshotError, collect_snapshot, groups_to_watch
from khipu.registry.loader import load_registry
from khipu.retention.policy import RetentionPolicy
from khipu.retention.usage import disk_usage
from khipu.settings import KhipuSettings
from khipu_airflow.hooks import KafkaConnectionError, KhipuKafkaHook, KhipuStoreHook
from khipu_airflow.notifiers import configured_notifiers

log = logging.getLogger(__name__)
DAY_MS = 86_400_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def snapshot_offsets(store_conn_id: str, all_groups: bool) -> dict[str, Any]:
    """Snapshot every cluster of the registry through its own connection; one unreachable cluster fails
    the task after the others are written."""
    registry = load_registry(KhipuSettings.from_env().registry_path)
    store = KhipuStoreHook(store_conn_id).store()
    summaries: dict[str, Any] = {}
    unreachable: list[str] = []
    try:
        store.migrate()
        for cluster, spec in sorted(registry.clusters.items()):
            watched = groups_to_watch(registry, cluster)
            try:
                connection = KhipuKafkaHook(spec.connection_id, cluster=cluster).connection()
                run, rows = collect_snapshot(connection, watched, now_ms(), all_groups=all_groups)
            except (SnapshotError, KafkaConnectionError) as exc:
                log.error("snapshot of %s failed: %s", cluster, exc)
                unreachable.append(str(exc))
                continue
            written = store.snapshots.write(run, rows)
            for error in run.errors:
                log.warning("snapshot of %s: %s", cluster, error)
            log.info(
                "snapshot of %s at %d: %d groups, %d partitions in %d ms%s",
                cluster,
                run.snapshot_ms,
                run.groups,
                run.partitions,
                run.duration_ms,
                "" if written else " (already stored)",
            )
            summaries[cluster] = {
                "snapshot_ms": run.snapshot_ms,
                "groups": run.groups,
                "partitions": run.partitions,
                "errors": list(run.errors),
                "written": written,
            }
    finally:
        store.close()
    if unreachable:
        raise SnapshotError("; ".join(unreachable))
    return summaries


def evaluate_health(store_conn_id: str) -> dict[str, Any]:
    registry = load_registry(KhipuSettings.from_env().registry_path)
    store = KhipuStoreHook(store_conn_id).store()
    results: dict[str, Any] = {}
    try:
        for cluster in sorted(registry.clusters):
            result = evaluate_cluster(store, cluster, health_config_from_env())
            log.info(
                "health of %s: %s; %d transitions, %d offset windows, %d alerts",
                cluster,
                result.statuses,
                result.transitions,
                result.windows,
                result.alerts,
            )
            results[cluster] = asdict(result)
    finally:
        store.close()
    return results


def check_verdict_thresholds(store_conn_id: str) -> dict[str, Any]:
    """Each stream's registry thresholds over the sliding window of verdict metrics: one alert per stream and
    figure crossing it, naming the hops one cause explains (khipu.alerting.incidents), one resolve saying whether
    the figure fell or the window emptied."""
    registry = load_registry(KhipuSettings.from_env().registry_path)
    config = ThresholdConfig.from_env()
    now = now_ms()
    since = window_start_ms(now, config.window_ms)
    store = KhipuStoreHook(store_conn_id).store()
    try:
        figures = window_figures(store.verdicts.read_metrics(since_ms=since))
        limits = {name: stream.alerts for name, stream in registry.streams.items()}
        found = breaches(figures, limits, config.min_verdicts)
        firing = store.alerts.firing(VERDICT_ALERT_KIND)
        causes = {
            (stream, hop, metric): counts
            for metric, kinds in (("loss_rate", ["LOST", "CONFIRMED_LOST"]), ("duplicate_rate", ["DUPLICATE"]))
            for (stream, hop), counts in store.verdicts.cause_counts(since, kinds).items()
        }
        alerts = incident_alerts(found, figures, firing, causes, registry.streams, config, now)
        added = sum(store.alerts.add(alert) for alert in alerts)
    finally:
        store.close()
    log.info(
        "verdict thresholds over %d s: %d hops judged, %d above a threshold, %d alerts raised",
        config.window_ms // 1000,
        len(figures),
        len(found),
        added,
    )
    return {"hops": len(figures), "breaches": len(found), "alerts": added}  # counts: no stream names in the XCom


def check_state_disk(store_conn_id: str, min_free_percent: float | None = None) -> dict[str, Any]:
    """The state folder's disk against ``KHIPU_DISK_FREE_MIN_PERCENT`` (or ``min_free_percent``): one alert when
    it falls below, one resolve when it is back."""
    settings = KhipuSettings.from_env()
    limit = RetentionPolicy.from_env().disk_free_min_percent if min_free_percent is None else min_free_percent
    disk = disk_usage(settings.state_dir)
    store = KhipuStoreHook(store_conn_id).store()
    try:
        last = store.alerts.latest(DISK_ALERT_KIND)
        firing = last is not None and alert_from(last).state is AlertState.FIRING
        alert = disk_alert(disk, limit, firing, now_ms())
        raised = alert is not None and store.alerts.add(alert)
    finally:
        store.close()
    log.info("state disk %s: %.1f %% free (alert below %g %%)%s", disk.path, disk.free_percent, limit,
             f"; {alert.title}" if raised and alert else "")  # fmt: skip
    return {"free_percent": round(disk.free_percent, 2), "min_free_percent": limit, "alert": bool(raised)}


def send_alerts(store_conn_id: str) -> dict[str, Any]:
    store = KhipuStoreHook(store_conn_id).store()
    try:
        report = dispatch_pending(store, configured_notifiers(), now_ms())
    finally:
        store.close()
    log.info(
        "alerts: %d sent, %d failed deliveries, %d left pending",
        report.sent,
        report.failed_deliveries,
        report.undelivered,
    )
    if report.undelivered:
        raise RuntimeError(f"{report.undelivered} alerts could not be delivered by any notifier; they stay pending")
    return asdict(report)


def prune_snapshots(store_conn_id: str, keep_days: float) -> dict[str, Any]:
    store = KhipuStoreHook(store_conn_id).store()
    try:
        deleted = store.snapshots.prune(before_ms=now_ms() - int(keep_days * DAY_MS))
    finally:
        store.close()
    log.info("pruned %d snapshot rows older than %g days", deleted, keep_days)
    return {"deleted": deleted}
