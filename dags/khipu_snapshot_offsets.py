"""
### Khipu offset-watermark snapshots and consumer health

Every minute, for every cluster of the registry (each through its own connection,
`clusters.<name>.connection_id`): for each consumer group on a registered route (and, with
`all_groups`, every group of the cluster), per partition, the committed offset next to the log-start and log-end
offsets, written to the Khipu store in one transaction. Then every partition is judged by
Burrow's rules (OK, WARN, STALL, STOP, REWIND) plus expiry risk, offset skips, rewinds and
expired ranges are recorded as windows, and transitions raise alerts through the configured
notifiers (task log; webhook connection `khipu_alert_webhook`; `KHIPU_NOTIFIERS`). Each stream's
registry thresholds (`alerts.loss_rate`, `duplicate_rate`, `latency_p99_ms`) are checked against
the verdict metrics of the last `KHIPU_ALERT_WINDOW_MS` (5 min): one alert when a hop crosses one,
one resolve when it falls back. The disk holding Khipu's state folder raises an alert when less than
the retention's `disk_free_min_percent` (10 %) of it is free. Snapshots older than `keep_days` are pruned.

Missed minutes are not back-filled (no catch-up): the snapshot history shows the gap.

**Trigger by hand** (an extra snapshot now, e.g. of every group):

    airflow dags trigger khipu_snapshot_offsets --conf '{"all_groups": true}'

Connections: one per registry cluster (`khipu_kafka` for the local stack's `local`), `khipu_store`
(the store). A cluster that cannot be reached fails `snapshot_offsets` after the others are written.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from khipu_airflow.notifiers import notify_failure

STORE = "khipu_store"


@dag(
    dag_id="khipu_snapshot_offsets",
    schedule="* * * * *",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(minutes=5),
    doc_md=__doc__,
    tags=["khipu", "offsets", "health"],
    on_failure_callback=notify_failure,
    default_args={
        "owner": "khipu",
        "retries": 1,
        "retry_delay": timedelta(seconds=10),
        "on_failure_callback": notify_failure,
    },
    params={
        "all_groups": Param(
            False, type="boolean", description="snapshot every group of the cluster, not only the registry's"
        ),
        "keep_days": Param(7.0, type="number", exclusiveMinimum=0, description="snapshot retention in days"),
    },
)
def khipu_snapshot_offsets() -> None:
    @task
    def snapshot_offsets() -> dict[str, Any]:
        from khipu_airflow import offsets

        return offsets.snapshot_offsets(STORE, bool(get_current_context()["params"]["all_groups"]))

    @task
    def evaluate_health(snapshot: dict[str, Any]) -> dict[str, Any]:
        from khipu_airflow import offsets

        return offsets.evaluate_health(STORE)

    @task
    def check_verdict_thresholds(evaluation: dict[str, Any]) -> dict[str, Any]:
        from khipu_airflow import offsets

        return offsets.check_verdict_thresholds(STORE)

    @task
    def check_state_disk() -> dict[str, Any]:
        from khipu_airflow import offsets

        return offsets.check_state_disk(STORE)

    @task(trigger_rule="all_done")  # the alerts raised go out whatever a check did
    def send_alerts() -> dict[str, Any]:
        from khipu_airflow import offsets

        return offsets.send_alerts(STORE)

    @task
    def prune_snapshots(evaluation: dict[str, Any]) -> dict[str, Any]:
        from khipu_airflow import offsets

        return offsets.prune_snapshots(STORE, float(get_current_context()["params"]["keep_days"]))

    evaluation = evaluate_health(snapshot_offsets())
    [check_verdict_thresholds(evaluation), check_state_disk()] >> send_alerts()
    prune_snapshots(evaluation)


khipu_snapshot_offsets()
