"""The retention DAG's tasks: the store connection, the registry and the archives -> a retention run's summary, and
the archives' closed hours compacted."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from khipu.config import RetentionSection, load
from khipu.detector.model import DETECTOR_QUERY
from khipu.reconcile.window import horizon_from_env
from khipu.registry.loader import load_registry
from khipu.retention import compaction
from khipu.retention.policy import RetentionError, RetentionPolicy, plan_retention
from khipu.retention.run import run_retention
from khipu.settings import KhipuSettings
from khipu.verdicts.metrics import metrics_of
from khipu_airflow.hooks import KhipuStoreHook

log = logging.getLogger(__name__)

POLICY_PARAMS = (
    "trace_archive_hours",
    "verdict_archive_hours",
    "verdict_days",
    "quarantine_days",
    "heartbeat_days",
    "minute_metrics_days",
    "metrics_days",
    "backfill_hours",
)


def policy_of(params: Mapping[str, Any]) -> RetentionPolicy:
    """The run's policy: the settings in force (KHIPU_RETENTION_*), with the limits a run's Params set instead
    (validated again here: RetentionError names a bad one)."""
    return RetentionPolicy.from_env().overridden({name: params.get(name) for name in POLICY_PARAMS})


def apply_retention(store_conn_id: str, params: Mapping[str, Any], now_ms: int | None = None) -> dict[str, Any]:
    """Plan with the Params and the reconciliation horizon in force, then remove (or, with ``dry_run``, say what
    would go); returns the report's summary."""
    settings = KhipuSettings.from_env()
    at = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    plan = plan_retention(policy_of(params), at, horizon_from_env())
    registry = load_registry(settings.registry_path)
    store = KhipuStoreHook(store_conn_id).store()
    try:
        if not params.get("dry_run"):
            store.migrate()  # a dry run changes nothing, the schema included
        report = run_retention(
            store,
            settings.archive_dir,
            settings.verdict_archive_dir,
            registry,
            plan,
            metrics_of,
            dry_run=bool(params.get("dry_run")),
            progress=log.info,
        )
    finally:
        store.close()
    return report.as_dict()


def compact_archives(store_conn_id: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Compact both archives' closed hours into files of about ``KHIPU_ARCHIVE_FILE_MIB``
    (:mod:`khipu.retention.compaction`: closed by how far the detector has read, as its heartbeat in the store
    says); with ``dry_run``, say which hours would be and change nothing. Returns each archive's summary."""
    settings = KhipuSettings.from_env()
    target_mib = load(RetentionSection, error=RetentionError).archive_file_mib
    store = KhipuStoreHook(store_conn_id).store()
    try:
        read_to = store.heartbeat.read_to_ms(DETECTOR_QUERY)
    finally:
        store.close()
    done = compaction.compact_archives(
        settings.archive_dir,
        settings.verdict_archive_dir,
        read_to,
        target_mib,
        dry_run=bool(params.get("dry_run")),
        progress=log.info,
    )
    return {name: report.as_dict() for name, report in done.items()}
