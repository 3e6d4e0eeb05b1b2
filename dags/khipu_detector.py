"""
### Khipu streaming detector

Keeps the Spark streaming detector (`spark/detector.py`) running, and says so when it is not.
Every two minutes `check_detector` judges it from its heartbeat in the store and its driver
process: **healthy** or **starting** (submitted, not reporting yet) — nothing to do; **never
ran**, **down** (its driver is gone) or **hung** (its driver runs, its heartbeat is stale) —
`restart_detector` stops what is left of the old driver and submits the job again, returning as
soon as the new driver is up. The job resumes from its checkpoint, so no trace is skipped and no
verdict is stored twice. A detector going down or hung raises one **detector-down alert** through
the notifiers; it resolves when the detector is healthy again.

Beside it, `check_trace_trail` asks the broker how far the detector trails the trace topic (where its newest batch
ended on each partition, the log's bounds, the age of the oldest record it has not read) against the topic's
`retention.ms` / `retention.bytes`, running or not: a **trace_trail alert** fires before retention can outrun it,
again if the broker removed records before it read them, and resolves once it is back within them; a **trace_skip
alert** names each partition and the offsets a batch skipped (the detector reads with `failOnDataLoss=false`, so
Spark would skip them silently). See docs/consumer-health.md, "Alerts".

Locally (`spark_default` = `local[*]`) spark-submit runs detached, recorded with its pid and start
time in `<state>/run/detector.json` (so `khipu status` lists it and `khipu down` stops it); its
log is `<state>/logs/detector.log`. **On a cluster**: point `spark_default` at the master
(`spark://host:7077`, `yarn`, `k8s://...`) with `deploy-mode: cluster` in its extra, ship the
`khipu` package to the executors (`pip wheel . -w dist`, then `--py-files` /
`spark.submit.pyFiles`, or bake it into the Spark image); the connections file it reads must be
readable there too (`--files`, or a secret mount).

**Params** (sizing; each null by default, then the Spark connection's extra `khipu.detector` decides, e.g.
`{"deploy-mode": "client", "khipu.detector": {"executor_memory": "4g", "executor_cores": 2}}`, so that the
scheduled runs, which take the defaults, restart the detector at the same size):

- `buckets` (1-4096) and `shuffle_partitions`: fixed for a checkpoint; unset, the checkpoint's own (32 and 4 for a
  new one). Another count than the checkpoint keeps is refused before anything is stopped or submitted (see
  docs/detector.md, "Rescaling to another bucket count");
- `driver_memory`, `executor_memory` (`512m`, `4g`), `executor_cores`, `total_executor_cores` (standalone),
  `num_executors` (YARN, Kubernetes): spark-submit's options of those names; unset, Spark's defaults.

A Param out of range is refused at the trigger; a bad value in the extra fails `restart_detector`, naming it.
Sizing guidance (traces/s per core): docs/detector.md, "Sizing".

Settings: `KHIPU_DETECTOR_STALE_AFTER_S` (120), `KHIPU_DETECTOR_STARTUP_GRACE_S` (300).
Connections: `khipu_kafka` (the trace cluster), one per registry cluster, `khipu_store`,
`spark_default`. No secret goes on the spark-submit command line.

**Trigger by hand** to check (and restart if needed) now: `airflow dags trigger khipu_detector`; with a size for
the restart: `airflow dags trigger khipu_detector --conf '{"executor_memory": "4g"}'` (it applies only when the
check finds the detector needs a restart; a running detector is left as it is).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import dag, get_current_context, task

from khipu_airflow.notifiers import notify_failure
from khipu_airflow.spark_submit import detector_params

KAFKA = "khipu_kafka"
STORE = "khipu_store"
SPARK = "spark_default"


@dag(
    dag_id="khipu_detector",
    schedule="*/2 * * * *",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(minutes=10),
    doc_md=__doc__,
    tags=["khipu", "detector", "spark"],
    default_args={
        "owner": "khipu",
        "retries": 1,
        "retry_delay": timedelta(seconds=20),
        "on_failure_callback": notify_failure,
    },
    params=detector_params(),
)
def khipu_detector() -> None:
    @task
    def check_detector() -> dict[str, Any]:
        from khipu_airflow import detector

        return detector.check_detector(STORE)

    @task.branch
    def choose(health: dict[str, Any]) -> str:
        return "restart_detector" if health["restart"] else "detector_is_running"

    @task
    def restart_detector() -> dict[str, Any]:
        from khipu_airflow import detector

        return detector.restart_detector(KAFKA, STORE, SPARK, get_current_context()["params"])

    @task
    def check_trace_trail() -> dict[str, Any]:
        from khipu_airflow import detector

        return detector.check_trace_trail(KAFKA, STORE)

    @task(trigger_rule="all_done")  # whatever happened, the alerts it raised go out
    def send_alerts() -> dict[str, Any]:
        from khipu_airflow import offsets

        return offsets.send_alerts(STORE)

    health = check_detector()
    running = EmptyOperator(task_id="detector_is_running")
    restart = restart_detector()
    choose(health) >> [running, restart]
    [running, restart, check_trace_trail()] >> send_alerts()


khipu_detector()
