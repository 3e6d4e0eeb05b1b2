"""
### Khipu backfill: reconcile any past window by hand

Re-decides, with all their traces, the messages first seen in a window you choose (and only the
streams you name), exactly as the hourly `khipu_reconcile` does for the hour whose horizon just
passed. Use it after a detector outage, after fixing a registry route, or to see what a window's
final verdicts would be.

**Trigger** from the UI ("Trigger DAG w/ config") or the CLI:
`airflow dags trigger khipu_backfill --conf
'{"start": "2026-11-23T08:00:00Z", "end": "2026-11-23T10:00:00Z", "dry_run": true}'`

- `start`, `end`: the window (ISO times with a zone); messages first seen in `[start, end)`;
- `streams`: stream names (empty: every stream);
- `dry_run`: say what would change (in the task log and its return value), write nothing;
- `driver_memory`, `executor_memory` (`512m`, `4g`), `executor_cores`, `total_executor_cores` (standalone),
  `num_executors` (YARN, Kubernetes): spark-submit's options of those names; null (the default): the Spark
  connection's extra `khipu.reconcile`, else Spark's defaults. A window of days reads more archive: give it more
  (sizing guidance: docs/reconciliation.md, "Sizing").

Refused, with the reason and nothing written: an end not after the start, a window whose horizon
has not passed yet, a window the archive does not cover (the missing hours are named), an
unknown stream. Running the same window twice changes nothing the second time.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from khipu_airflow.reconcile import CONFIRMED_LOSSES
from khipu_airflow.spark_submit import resource_params

KAFKA = "khipu_kafka"
STORE = "khipu_store"
SPARK = "spark_default"


@dag(
    dag_id="khipu_backfill",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["khipu", "reconciliation", "backfill", "spark"],
    # one retry for a Spark hiccup; a refused window fails at once (AirflowFailException skips retries) and
    # raises no alert: whoever triggered it sees why in the task log
    default_args={"owner": "khipu", "retries": 1, "retry_delay": timedelta(minutes=1)},
    params={
        "start": Param(
            "2026-11-23T00:00:00Z", type="string", format="date-time", description="window start (ISO, with zone)"
        ),
        "end": Param("2026-11-23T01:00:00Z", type="string", format="date-time", description="window end, exclusive"),
        "streams": Param([], type="array", items={"type": "string"}, description="streams (empty: all)"),
        "dry_run": Param(False, type="boolean", description="say what would change, write nothing"),
        **resource_params(),
    },
)
def khipu_backfill() -> None:
    @task
    def check_window() -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from khipu.clock import now_ms
        from khipu.errors import InvalidSetting
        from khipu.reconcile.window import ReconcileWindow, horizon_from_env, parse_time
        from khipu_airflow import reconcile

        params = get_current_context()["params"]
        try:
            window = ReconcileWindow(
                parse_time(str(params["start"])),
                parse_time(str(params["end"])),
                horizon_from_env(),
                tuple(params.get("streams") or ()),
            )
        except InvalidSetting as exc:
            raise AirflowFailException(str(exc)) from None
        checked = reconcile.check_window(window, STORE, now_ms(), scheduled=False)
        return {**checked, "dry_run": bool(params.get("dry_run"))}

    @task
    def reconcile_window(window: dict[str, Any]) -> dict[str, Any]:
        from khipu.reconcile.window import ReconcileWindow
        from khipu_airflow import reconcile

        chosen = ReconcileWindow(window["start_ms"], window["end_ms"], window["horizon_ms"], tuple(window["streams"]))
        params = get_current_context()["params"]
        return reconcile.run_reconciliation(chosen, window["dry_run"], KAFKA, STORE, SPARK, params)

    @task(outlets=[CONFIRMED_LOSSES])
    def announce_confirmed_losses(summary: dict[str, Any], outlet_events: Any = None) -> dict[str, Any]:
        from khipu.clock import now_ms
        from khipu_airflow import reconcile

        return reconcile.announce_confirmed_losses(STORE, bool(summary.get("dry_run")), outlet_events, now_ms())

    announce_confirmed_losses(reconcile_window(check_window()))


khipu_backfill()
