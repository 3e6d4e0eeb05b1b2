"""
### Khipu retention: remove what is older than its kind's age limit, and compact the archives' closed hours

Every hour, removes by age, each kind with its own limit: the `KHIPU_RETENTION_*` settings
(`khipu settings` shows them; defaults in [docs/retention.md](docs/retention.md)), or a Param of a
manual run:

- **trace archive** hours (`<data>/archive`, raw traces: reconciliation's and backfill's input; `<data>` is
  `KHIPU_DATA_URL`, the state folder or an object-store prefix such as `s3a://bucket/khipu`);
- **verdict archive** hours (`<data>/verdicts`, plain DELIVERED verdicts) and their index rows;
- the store's settled **verdicts** and their **history** (LOST and PENDING are kept at any age:
  reconciliation decides them), **quarantined** records, emitter **sequence gaps**, detector **heartbeats**;
- **per-minute metrics**, rolled up into whole hours after `minute_metrics_days` (a window's counts and
  percentiles stay the same), and the hourly ones after `metrics_days`.

It never removes what reconciliation or a resend still needs: the trace archive is kept at least the
reconciliation reach (2 x horizon + 1 h) plus `backfill_hours`, the archived and stored verdicts at least
as long as the traces, and a confirmed loss still waiting for its resend keeps its verdicts and traces
whatever their age. Limits that would break this are refused, with the reason, before anything is touched.
Offset snapshots have their own retention (`khipu_snapshot_offsets`, `keep_days`).

Then it **compacts** each archive hour the detector will not write again (read past its end by 10 min, and not
holding the newest micro-batch, which Spark may replay): the hour's micro-batch files (~1,800 an hour at a 2 s
trigger) become files of about `KHIPU_ARCHIVE_FILE_MIB` (128 MiB), one line in the log per hour. An hour
compacted before is left alone; a dry run says which hours it would compact. The removal goes first, so that no
hour about to go is compacted; a run whose removal fails (a limit refused) compacts nothing.

**Trigger by hand**, e.g. to see what a shorter limit would remove:

    airflow dags trigger khipu_retention --conf '{"trace_archive_hours": 96, "dry_run": true}'

Connection: `khipu_store`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from khipu_airflow.notifiers import notify_failure

STORE = "khipu_store"


def _limit(unit: str, description: str) -> Param:
    return Param(
        None, type=["null", "integer"], minimum=1, description=f"{description}, in {unit} (empty: the setting)"
    )


@dag(
    dag_id="khipu_retention",
    schedule="@hourly",
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
        "trace_archive_hours": _limit("hours", "raw-trace archive kept (KHIPU_RETENTION_TRACE_ARCHIVE_HOURS)"),
        "verdict_archive_hours": _limit("hours", "verdict archive kept (KHIPU_RETENTION_VERDICT_ARCHIVE_HOURS)"),
        "verdict_days": _limit("days", "settled store verdicts and their history kept (KHIPU_RETENTION_VERDICT_DAYS)"),
        "quarantine_days": _limit("days", "quarantined records kept (KHIPU_RETENTION_QUARANTINE_DAYS)"),
        "heartbeat_days": _limit("days", "detector heartbeats kept (KHIPU_RETENTION_HEARTBEAT_DAYS)"),
        "minute_metrics_days": _limit("days", "metrics kept per minute (KHIPU_RETENTION_MINUTE_METRICS_DAYS)"),
        "metrics_days": _limit("days", "hourly metrics kept (KHIPU_RETENTION_METRICS_DAYS)"),
        "backfill_hours": _limit("hours", "backfill reach beyond the horizon (KHIPU_RETENTION_BACKFILL_HOURS)"),
        "dry_run": Param(False, type="boolean", description="say what would be removed and compacted, change nothing"),
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

    @task
    def compact_archives() -> dict[str, Any]:
        from khipu_airflow import retention

        return retention.compact_archives(STORE, get_current_context()["params"])

    apply_retention() >> compact_archives()


khipu_retention()
