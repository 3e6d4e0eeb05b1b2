"""The retention DAG's task: the store connection, the registry and the archives -> a retention run's summary."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from khipu.reconcile.window import horizon_from_env
from khipu.registry.loader import load_registry
from khipu.retention.policy import RetentionPolicy, plan_retention
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
