"""
### Khipu streaming detector

Keeps the Spark streaming detector (`spark/detector.py`) running. Every two minutes it looks at
the detector's heartbeat in the store: healthy, nothing to do; never started, stale (down) or
hung, it stops what is left of the old driver and submits the job again with
`SparkSubmitOperator` (connection `spark_default`, `local[*]` on the local stack). The job resumes
from its checkpoint, so no trace is skipped and no verdict is stored twice. While the job runs,
`submit_detector` runs with it; when the job dies the task retries (a restart), and if that
fails too the failure callback alerts and the next run starts it again.

**On a cluster**: point `spark_default` at the master (`spark://host:7077`, `yarn`, `k8s://...`)
with `deploy-mode: cluster` in its extra, and ship the `khipu` package to the executors (build a
wheel, `pip wheel . -w dist`, and add it with `--py-files` / `spark.submit.pyFiles`, or bake it
into the Spark image). In cluster mode stopping a hung driver goes through the cluster manager.

**Trigger by hand** to restart it now: `airflow dags trigger khipu_detector`.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import dag, task

from khipu_airflow.detector import DetectorSubmitOperator
from khipu_airflow.notifiers import notify_failure

KAFKA = "khipu_kafka"
STORE = "khipu_store"


@dag(
    dag_id="khipu_detector",
    schedule="*/2 * * * *",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["khipu", "detector", "spark"],
    default_args={
        "owner": "khipu",
        "retries": 1,
        "retry_delay": timedelta(seconds=20),
        "on_failure_callback": notify_failure,
    },
)
def khipu_detector() -> None:
    @task.branch
    def check_detector() -> str:
        from khipu.detector.supervise import DetectorState
        from khipu_airflow.detector import detector_state

        return "detector_is_healthy" if detector_state(STORE) is DetectorState.HEALTHY else "stop_hung_detector"

    @task
    def stop_hung_detector() -> str:
        from khipu_airflow.detector import stop_hung_detector as stop

        return stop()

    healthy = EmptyOperator(task_id="detector_is_healthy")
    submit = DetectorSubmitOperator(
        task_id="submit_detector",
        conn_id="spark_default",
        kafka_conn_id=KAFKA,
        store_conn_id=STORE,
        conf={"spark.ui.enabled": "false"},
    )
    branch = check_detector()
    branch >> healthy
    branch >> stop_hung_detector() >> submit


khipu_detector()
