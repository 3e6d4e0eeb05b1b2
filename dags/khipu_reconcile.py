"""
### Khipu hourly reconciliation

Makes the streaming detector's verdicts final. Every hour it reconciles the hour whose
**horizon** has just passed (default two hours, `KHIPU_RECONCILE_HORIZON_MS`): the messages first
seen in `[start - horizon, end - horizon)` of its data interval, read from the trace archive with
all the traces that came up to the interval's end. Each message whose verdict is not final
(LOST, PENDING, TRACE_LOST, late evidence, or never judged; its verdicts are the store's and the
verdict archive's plain DELIVERED ones) is re-decided by `spark/reconcile.py`
with the detector's own rules: a LOST still missing becomes **CONFIRMED_LOST**, a LOST a late
trace contradicts becomes **RETRACTED**, each change kept in the verdict's history. New confirmed
losses update the `khipu://confirmed-losses` Asset (the resend DAG is scheduled on it).

`check_window` skips hours that ended before the archive began and fails, naming the missing
hours, when the archive cannot answer for the window (the detector is behind, or hours are gone).

**Since the install.** The schedule (`HourlySinceInstall`, a timetable registered by its own plugin) runs every full
hour from the first one after the **install**: when the Khipu store was created (`make up`, `khipu store migrate`),
or upgraded to the migration that began keeping it. The store keeps it, in its one-row table `installation`,
where every scheduler and worker of a cluster sees it; Airflow reads it through `khipu_store` each time it parses
this file, and the scheduler takes it from the parsed DAG. No hour before the install is scheduled, whatever the
start date (which only bounds backfills) and even after a backfill of earlier hours, so a fresh stack starts with
no queue. Every hour after it runs, each once, in order: **missed hours** (Airflow down before the first run or
after it, a slow hour) are caught up (`catchup`). The first two or three runs reconcile windows from before the
install (the horizon): `check_window` skips them without Spark, as it skips any window that ended before the
archive began. **If the store cannot be read at parse** (no `khipu_store` connection, the store unreachable or
not migrated), the parse still succeeds, one warning in its log says why, and the schedule falls back to the
next full hour for a DAG that never ran (Airflow's own hourly rule from its latest run otherwise) until a parse
reads it. Hours before the install are **backfill**'s: a run triggered by hand reconciles the hour ending (one
horizon before) its logical date, and Airflow's own backfill works too:
`airflow backfill create --dag-id khipu_reconcile --from-date 2026-11-23T00:00:00 --to-date 2026-11-23T06:00:00`.
Running a window again changes nothing the second time. For a window of your choosing, with
streams and a dry run, trigger `khipu_backfill`.

**Params** (sizing, each null by default, so the scheduled runs take the Spark connection's extra
`khipu.reconcile`, e.g. `{"khipu.reconcile": {"executor_memory": "4g"}}`, else Spark's defaults): `driver_memory`,
`executor_memory` (`512m`, `4g`), `executor_cores`, `total_executor_cores` (standalone), `num_executors` (YARN,
Kubernetes), spark-submit's options of those names. Its shuffle partitions are sized by the archive it reads
(one per 64 MiB, at least one per core), so there is no Param for them. Sizing guidance:
docs/reconciliation.md, "Sizing".

Connections: `khipu_kafka`, one per registry cluster, `khipu_store`, `spark_default`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import dag, get_current_context, task

from khipu_airflow.notifiers import notify_failure
from khipu_airflow.reconcile import CONFIRMED_LOSSES, installed_ms
from khipu_airflow.spark_submit import resource_params
from khipu_airflow.timetables import HourlySinceInstall

KAFKA = "khipu_kafka"
STORE = "khipu_store"
SPARK = "spark_default"


@dag(
    dag_id="khipu_reconcile",
    # Every hour from the first one after the install (kept in the store), not from the start date (which once queued
    # every hour since it); missed hours after it run too (catchup). Read at each parse; None: the next full hour.
    schedule=HourlySinceInstall(installed_ms(STORE)),
    start_date=pendulum.datetime(2026, 11, 23, tz="UTC"),  # Airflow asks for one with catchup; backfills go back to it
    catchup=True,
    max_active_runs=1,
    dagrun_timeout=timedelta(minutes=50),
    doc_md=__doc__,
    tags=["khipu", "reconciliation", "spark"],
    default_args={
        "owner": "khipu",
        "retries": 2,
        "retry_delay": timedelta(minutes=5),
        "on_failure_callback": notify_failure,
    },
    params=resource_params(),
)
def khipu_reconcile() -> None:
    @task
    def check_window(data_interval_start: Any = None, data_interval_end: Any = None) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from khipu.clock import now_ms
        from khipu.errors import InvalidSetting
        from khipu.reconcile.window import horizon_from_env, hourly_window
        from khipu_airflow import reconcile

        try:
            window = hourly_window(
                int(data_interval_start.timestamp() * 1000),
                int(data_interval_end.timestamp() * 1000),
                horizon_from_env(),
            )
        except InvalidSetting as exc:
            raise AirflowFailException(str(exc)) from None
        return reconcile.check_window(window, STORE, now_ms(), scheduled=True)

    @task
    def reconcile_window(window: dict[str, Any]) -> dict[str, Any]:
        from khipu.reconcile.window import ReconcileWindow
        from khipu_airflow import reconcile

        chosen = ReconcileWindow(window["start_ms"], window["end_ms"], window["horizon_ms"])
        return reconcile.run_reconciliation(chosen, False, KAFKA, STORE, SPARK, get_current_context()["params"])

    @task(outlets=[CONFIRMED_LOSSES])
    def announce_confirmed_losses(summary: dict[str, Any], outlet_events: Any = None) -> dict[str, Any]:
        from khipu.clock import now_ms
        from khipu_airflow import reconcile

        return reconcile.announce_confirmed_losses(STORE, bool(summary.get("dry_run")), outlet_events, now_ms())

    announce_confirmed_losses(reconcile_window(check_window()))


khipu_reconcile()
