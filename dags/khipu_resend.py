"""
### Khipu auto-resend of confirmed losses

Runs when reconciliation announces new confirmed losses (the `khipu://confirmed-losses` Asset),
and every 15 minutes for attempts still open, for the streams whose registry `resend.mode` is
**auto**. Each confirmed loss is resent once from the first place that still holds it (the
record in its topic, the processor's input record, or the stream's recovery hook); the detector
turns it RESENT when the resent copy arrives. A loss with no original left, or past
`resend.max_attempts`, becomes UNRECOVERABLE. A retried or killed run never produces a second
copy of an attempt: the ledger and the destination topic (the resend id header) say whether it
landed. The notifiers get one message per run with its counts and one per UNRECOVERABLE.

For `manual` streams, or to choose what to resend, trigger `khipu_resend_manual`.
Connections: one per registry cluster (`khipu_kafka`), `khipu_store`. Docs: docs/resend.md.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import dag, task
from airflow.timetables.assets import AssetOrTimeSchedule
from airflow.timetables.trigger import CronTriggerTimetable

from khipu_airflow.notifiers import notify_failure
from khipu_airflow.reconcile import CONFIRMED_LOSSES

STORE = "khipu_store"


@dag(
    dag_id="khipu_resend",
    schedule=AssetOrTimeSchedule(
        timetable=CronTriggerTimetable("*/15 * * * *", timezone="UTC"), assets=[CONFIRMED_LOSSES]
    ),
    start_date=pendulum.datetime(2026, 11, 23, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(minutes=30),
    doc_md=__doc__,
    tags=["khipu", "resend"],
    default_args={
        "owner": "khipu",
        "retries": 2,
        "retry_delay": timedelta(minutes=2),
        "on_failure_callback": notify_failure,
    },
)
def khipu_resend() -> None:
    @task
    def resend_confirmed_losses(run_id: Any = None) -> dict[str, Any]:
        from khipu.registry.model import ResendMode
        from khipu.resend.run import ResendSelection
        from khipu_airflow.resend import run_resend

        return run_resend(ResendSelection(modes=frozenset({ResendMode.AUTO})), STORE, str(run_id))

    resend_confirmed_losses()


khipu_resend()
