"""
### Khipu retention: remove what is older than its kind's age limit

Once a day, removes by age, each kind with its own limit (the Params below; defaults in
[docs/retention.md](docs/retention.md)):

- **trace archive** hours (`<state>/archive`, raw traces: reconciliation's and backfill's input);
- **verdict archive** hours (`<state>/verdicts`, plain DELIVERED verdicts) and their index rows;
- the store's settled **verdicts** and their **history** (LOST and PENDING are kept at any age:
  reconciliation decides them), **quarantined** records, emitter **sequence gaps**, detector **heartbeats**;
- **per-minute metrics**, rolled up into whole hours after `minute_metrics_days` (a window's counts and
  percentiles stay the same), and the hourly ones after `metrics_days`.

It never removes what reconciliation or a resend still needs: the trace archive is kept at least the
reconciliation reach (2 x horizon + 1 h) plus `backfill_hours`, the archived and stored verdicts at least
as long as the traces, and a confirmed loss still waiting for its resend keeps its verdicts and traces
whatever their age. Limits that would break this are refused, with the reason, before anything is touched.
Offset snapshots have their own retention (`khipu_snapshot_offsets`, `keep_days`).

**Trigger by hand**, e.g. to see what a shorter limit would remove:

    airflow dags trigger khipu_retention --conf '{"trace_archive_hours": 96, "dry_run": true}'

Connection: `khipu_store`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from khipu.retention.policy import RetentionPolicy
from khipu_airflow.notifiers import notify_failure

STORE = "khipu_store"
DEFAULTS = RetentionPolicy()


def _limit(value: int, description: str) -> Param:
    return Param(value, type="integer", minimum=1, description=description)


@dag(
    dag_id="khipu_retention",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(hours=6),
    doc_md=__doc__,
    tags=["khipu", "retention"],
    default_args={
        "owner": "khipu",
        "retries": 1,
        "retry_delay": timedelta(minutes=10),
        "on_failure_callback": notify_failure,
    },
    params={
        "trace_archive_hours": _limit(DEFAULTS.trace_archive_hours, "raw-trace archive hours kept"),
        "verdict_archive_hours": _limit(DEFAULTS.verdict_archive_hours, "verdict archive hours kept"),
        "verdict_days": _limit(DEFAULTS.verdict_days, "days the store keeps settled verdicts and their history"),
        "quarantine_days": _limit(DEFAULTS.quarantine_days, "days quarantined records are kept"),
        "heartbeat_days": _limit(DEFAULTS.heartbeat_days, "days detector heartbeats are kept"),
        "minute_metrics_days": _limit(DEFAULTS.minute_metrics_days, "days per-minute metrics are kept as minutes"),
        "metrics_days": _limit(DEFAULTS.metrics_days, "days the hourly metrics are kept"),
        "backfill_hours": _limit(DEFAULTS.backfill_hours, "how far back beyond the horizon a backfill may reach"),
        "dry_run": Param(False, type="boolean", description="say what would be removed, remove nothing"),
    },
)
def khipu_retention() -> None:
    @task
    def apply_retention() -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from khipu.retention.policy import RetentionError
        from khipu_airflow import retention

        try:
            return retention.apply_retention(STORE, get_current_context()["params"])
        except RetentionError as exc:  # limits that would remove what is still needed: no retry will help
            raise AirflowFailException(str(exc)) from None

    apply_retention()


khipu_retention()
