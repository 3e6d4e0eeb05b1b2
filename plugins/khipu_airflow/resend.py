"""Airflow's side of resending: a run of :class:`khipu.resend.run.Resender` with the project's connections,
its progress in the task log, its outcome told through the notifiers (and kept on the Alerts page)."""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from khipu.alerting.dispatch import dispatch_pending
from khipu.clock import now_ms
from khipu.errors import InvalidSetting
from khipu.registry.loader import load_registry
from khipu.resend.run import Resender, ResendRequestError, ResendSelection, run_alerts, wait_from_env
from khipu.settings import KhipuSettings
from khipu_airflow.hooks import KhipuStoreHook, cluster_connections
from khipu_airflow.notifiers import configured_notifiers

log = logging.getLogger(__name__)


def run_resend(selection: ResendSelection, store_conn_id: str, run_id: str) -> dict[str, Any]:
    """Resend what ``selection`` names; fail the task (no retry, nothing written) when it names what cannot be
    resent. Returns the run's outcomes (the task's XCom)."""
    settings = KhipuSettings.from_env()
    try:
        registry = load_registry(settings.registry_path)
        wait_ms = wait_from_env()
    except InvalidSetting as exc:
        raise AirflowFailException(str(exc)) from None
    store = KhipuStoreHook(store_conn_id).store()
    try:
        resender = Resender(
            store,
            registry,
            cluster_connections(registry),
            now_ms,
            settings.archive_dir,
            wait_ms,
            verdict_archive_dir=settings.verdict_archive_dir,
        )
        try:
            run = resender.run(selection, progress=log.info)
        except ResendRequestError as exc:
            raise AirflowFailException(str(exc)) from None
        alerts = run_alerts(run, run_id, now_ms())
        if alerts:
            added = sum(store.alerts.add(alert) for alert in alerts)
            report = dispatch_pending(store, configured_notifiers(), now_ms())
            log.info("resend notices: %d recorded, %d sent", added, report.sent)
    finally:
        store.close()
    return run.as_dict()
