"""Airflow's side of reconciliation: check a window against the archive, submit ``spark/reconcile.py``, and
say what it changed.

The job runs through Spark's own submit hook (``spark_default``; ``local[*]`` here; its public constructor
only) and the task waits for it, its output in the task log. Its driver and executor memory and cores come
from the run's Params, else the Spark connection's extra ``khipu.reconcile`` (:mod:`khipu.detector.sizing`).
Connections go to an owner-only file, as for the detector; the job writes a JSON summary the task returns (and
the confirmed-losses Asset carries).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk import Asset
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from khipu.clock import iso_text
from khipu.detector.launch import connector_jars, write_connections_file
from khipu.detector.model import DETECTOR_QUERY
from khipu.detector.sizing import SparkResources, spark_resources
from khipu.errors import InvalidSetting
from khipu.reconcile.window import (
    ArchiveCoverage,
    ReconcileWindow,
    archive_behind,
    coverage_problems,
    hour_start_ms,
)
from khipu.registry.loader import load_registry
from khipu.settings import KhipuSettings, project_root
from khipu.storage.location import Location
from khipu.storage.spark import hadoop_settings
from khipu.store import Store
from khipu.trace.archive import hour_of
from khipu_airflow.detector import driver_log_config
from khipu_airflow.hooks import KhipuKafkaHook, KhipuStoreHook, cluster_connections
from khipu_airflow.spark_submit import sizing_values, spark_target

log = logging.getLogger(__name__)

ARCHIVE_WAIT_S = 180.0  # an hourly run waits this long for the detector to archive its interval's end
INSTALL_READ_TIMEOUT_S = 5  # the install's read at parse waits no longer to connect (or for SQLite's lock)

# Updated when a reconciliation confirms new losses: the resend DAG is scheduled on it.
CONFIRMED_LOSSES = Asset("khipu://confirmed-losses", extra={"what": "losses confirmed by reconciliation"})


class ArchiveBehind(RuntimeError):
    """The detector has not archived the window's end yet: a failure the task's retries get past."""


def application() -> str:
    return str(project_root() / "spark" / "reconcile.py")


def archive_dir() -> Location:
    return KhipuSettings.from_env().archive_dir


def archive_coverage(store_conn_id: str) -> ArchiveCoverage:
    """The archive's first hour (its oldest hour folder) and up to when the detector has archived the topic."""
    hours = sorted(name.removeprefix("hour=") for name in archive_dir().child_folders("hour="))
    store = Store(KhipuStoreHook(store_conn_id).url())
    try:
        read_to = store.heartbeat.read_to_ms(DETECTOR_QUERY)
    finally:
        store.close()
    return ArchiveCoverage(hours[0] if hours else None, read_to)


def installed_ms(store_conn_id: str) -> int | None:
    """When Khipu was installed, as its store keeps it (:meth:`khipu.store.Store.installed_ms`), read when Airflow
    parses khipu_reconcile: its schedule starts at the hour after it. One small query, with a short timeout. Never
    fails the parse: without the connection, with the store unreachable or not migrated, it says why in one warning
    and gives None (the schedule's first run is then the next full hour).

    Not cached: Airflow parses a DAG file in a process of its own each time, and a task's process once."""
    try:
        url = KhipuStoreHook(store_conn_id).url()
        option = "timeout" if url.startswith("sqlite") else "connect_timeout"  # SQLite's lock wait, psycopg2's connect
        store = Store(url, connect_args={option: INSTALL_READ_TIMEOUT_S})
        try:
            found, where = store.installed_ms(), store.safe_url
        finally:
            store.close()
    except Exception as exc:  # whatever it is, the DAG must still parse: the reason goes to the log
        log.warning(
            "khipu_reconcile: the install time could not be read from the store (connection %r): %s; the schedule "
            "goes on without it (a DAG that never ran: from the next full hour) until a parse reads it",
            store_conn_id,
            exc,
        )
        return None
    if found is None:
        log.warning(
            "khipu_reconcile: the store at %s keeps no install time (its installation row was deleted); the schedule "
            "goes on without it (a DAG that never ran: from the next full hour)",
            where,
        )
    return found


def check_window(
    window: ReconcileWindow, store_conn_id: str, now_ms: int, *, scheduled: bool, wait_s: float = ARCHIVE_WAIT_S
) -> dict[str, Any]:
    """Refuse a window the archive cannot answer for, naming why (and the missing hours); return the window
    to reconcile. An hourly run is kinder at the archive's start: a window that ended before the archive
    began is skipped, one that straddles its first hour is trimmed to it. A backfill gets what it asked
    for or a refusal."""
    registry = load_registry(KhipuSettings.from_env().registry_path)
    unknown = sorted(set(window.streams) - set(registry.streams))
    if unknown:
        raise AirflowFailException(
            f"unknown stream(s) {', '.join(unknown)}: the registry has {', '.join(sorted(registry.streams))}"
        )
    coverage = archive_coverage(store_conn_id)
    if scheduled and (coverage.first_hour is None or hour_of(window.end_ms - 1) < coverage.first_hour):
        raise AirflowSkipException(
            f"the archive starts at {coverage.first_hour or 'no hour yet'}: nothing to reconcile for "
            f"{iso_text(window.start_ms)} .. {iso_text(window.end_ms)}"
        )
    if scheduled and coverage.first_hour is not None and hour_of(window.start_ms) < coverage.first_hour:
        log.warning("the archive starts at hour %s: reconciling from there", coverage.first_hour)
        window = dataclasses.replace(window, start_ms=hour_start_ms(coverage.first_hour))
    problems = coverage_problems(window, coverage, now_ms)
    waited_s = 0.0
    while scheduled and problems == [archive_behind(window, coverage, now_ms)] and waited_s < wait_s:
        # the run starts as its interval ends: the detector is still archiving the last seconds
        time.sleep(10)
        waited_s += 10
        now_ms += 10_000
        coverage = archive_coverage(store_conn_id)
        problems = coverage_problems(window, coverage, now_ms)
    if problems:
        message = f"cannot reconcile {window.describe()}: " + "; ".join(problems)
        if scheduled and problems == [archive_behind(window, coverage, now_ms)]:
            raise ArchiveBehind(message + " (retried: the detector may be catching up)")
        raise AirflowFailException(message)
    log.info("reconciling %s", window.describe())
    return {
        "window": window.describe(),
        "start_ms": window.start_ms,
        "end_ms": window.end_ms,
        "horizon_ms": window.horizon_ms,
        "streams": list(window.streams),
        "archive_from": coverage.first_hour,
        "archived_to": coverage.read_to_ms,
    }


def write_job_connections(path: Path, kafka_conn_id: str, store_conn_id: str) -> None:
    """The job's connections (credentials included) in an owner-only file."""
    settings = KhipuSettings.from_env()
    trace = KhipuKafkaHook(kafka_conn_id).connection()
    clusters = cluster_connections(load_registry(settings.registry_path))
    write_connections_file(path, trace, clusters, KhipuStoreHook(store_conn_id).url())


def job_args(window: ReconcileWindow, dry_run: bool) -> list[str]:
    """spark/reconcile.py's arguments: times, names and paths only; the connections go to the owner-only file."""
    settings = KhipuSettings.from_env()
    folder = settings.state_dir / "reconcile"
    connections = folder / f"connections-{os.getpid()}.json"
    args = [
        "--start",
        str(window.start_ms),
        "--end",
        str(window.end_ms),
        "--horizon-ms",
        str(window.horizon_ms),
        "--registry",
        str(settings.registry_path),
        "--archive",
        archive_dir().url,
        "--verdict-archive",
        settings.verdict_archive_dir.url,
        "--work",
        (settings.data / "reconcile").url,
        "--connections-file",
        str(connections),
        "--summary-file",
        str(folder / f"summary-{os.getpid()}.json"),
    ]
    if window.streams:
        args += ["--streams", ",".join(window.streams)]
    if dry_run:
        args.append("--dry-run")
    return args


def resources(spark_conn_id: str, params: Mapping[str, object]) -> SparkResources:
    """The job's driver and executor memory and cores: the run's Params, else the connection's extra
    ``khipu.reconcile`` (it sizes its shuffles by the archive it reads)."""
    target = spark_target(spark_conn_id)
    return spark_resources(
        sizing_values(params, detector=False),
        target.sizing_extra("reconcile"),
        "the run's Params",
        f"{spark_conn_id}'s extra khipu.reconcile",
    )


def run_reconciliation(
    window: ReconcileWindow,
    dry_run: bool,
    kafka_conn_id: str,
    store_conn_id: str,
    spark_conn_id: str,
    params: Mapping[str, object] | None = None,
) -> dict[str, Any]:
    """Submit the job (sized by ``params``, the run's Params), wait for it, return its summary."""
    try:
        sized = resources(spark_conn_id, params or {})
    except InvalidSetting as exc:  # no retry makes it right
        raise AirflowFailException(f"the reconciliation is not submitted: {exc}") from None
    args = job_args(window, dry_run)
    connections, summary_file = Path(_after(args, "--connections-file")), Path(_after(args, "--summary-file"))
    hook = SparkSubmitHook(
        conn_id=spark_conn_id,
        conf={
            "spark.ui.enabled": "false",
            "spark.sql.session.timeZone": "UTC",
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{driver_log_config()}",
            **hadoop_settings(os.environ),  # where the object store is; its credentials stay in the environment
        },
        jars=",".join(str(jar) for jar in connector_jars()),  # S3A with them, for an archive in an object store
        name="khipu-reconcile",
        application_args=args,
        env_vars={"PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)},
        **sized.hook_arguments(),
    )
    try:
        write_job_connections(connections, kafka_conn_id, store_conn_id)  # after the hook: nothing left if it fails
        hook.submit(application())  # waits; the job's output goes to the task log
        summary: dict[str, Any] = json.loads(summary_file.read_text())
    finally:
        connections.unlink(missing_ok=True)
        summary_file.unlink(missing_ok=True)
    log.info(
        "%s: %d re-decided, %d changed (%s), %d confirmed lost, %d retracted, %d lead(s)",
        "dry run" if dry_run else "reconciled",
        summary["redecided"],
        summary["changes"],
        summary["changes_by_kind"],
        len(summary["confirmed_losses"]),
        len(summary["retracted"]),
        len(summary["leads"]),
    )
    return summary


def announce_confirmed_losses(store_conn_id: str, dry_run: bool, outlet_events: Any, now_ms: int) -> dict[str, Any]:
    """Update the confirmed-losses Asset with every CONFIRMED_LOST not announced yet, from the store (so a
    retried run still announces what an earlier attempt stored); skip (no Asset event) when there is none.

    The event, the task's return value and its log carry a count only: Airflow shows an Asset's events to every
    user, whatever their team (docs/view.md#airflows-own-surfaces); the losses themselves are in the store, which
    the resend DAG and the view read."""
    if dry_run:
        raise AirflowSkipException("a dry run announces nothing")
    store = Store(KhipuStoreHook(store_conn_id).url())
    try:
        rows = store.verdicts.unannounced_confirmed()
        if not rows:
            raise AirflowSkipException("no new confirmed losses")
        outlet_events[CONFIRMED_LOSSES].extra = {"count": len(rows)}
        store.verdicts.mark_announced([(r["message_id"], r["hop"]) for r in rows], now_ms)
    finally:
        store.close()
    log.info("announced %d confirmed losses on %s", len(rows), CONFIRMED_LOSSES.uri)
    return {"count": len(rows)}


def _after(args: Sequence[str], flag: str) -> str:
    return args[list(args).index(flag) + 1]
