"""
### Khipu demo burst

Runs one burst of the traced **demo pipeline** on the registry stream `demo.bursts`
(`demo-burst-producer → demo.bursts → demo-burst-enricher → demo.bursts-enriched →
demo-burst-sink-store / demo-burst-sink-audit`, topics and groups of its own, so it never
disturbs the continuously running demo) against the Kafka connection `khipu_kafka`, with the
faults you choose, and records the ground truth of every message in a ledger under the state
folder (`<state>/demo/burst-<run>.jsonl`). `<run>`, which also begins every message id of the
burst, is `burst` and 16 hex digits of a hash of Airflow's run id: each run its own.

Use it to exercise Khipu on demand: the traces land on the trace topic like any application's.

**Trigger by hand** (UI: *Trigger DAG* with parameters, or CLI):

    airflow dags trigger khipu_demo_burst --conf '{"count": 2000, "faults": {"consumer_skip": 0.01}}'

Parameters: `count` (messages), `rate_per_s`, `sampling_percent` (empty: the stream's own
rate from the registry), `faults` (fault name → probability: consumer_skip, processor_drop,
rebalance_drop, offset_rewind, producer_retry, delay, trace_loss), `seed`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from khipu_airflow.notifiers import notify_failure


@dag(
    dag_id="khipu_demo_burst",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["khipu", "demo"],
    default_args={
        "owner": "khipu",
        "retries": 1,
        "retry_delay": timedelta(seconds=30),
        "on_failure_callback": notify_failure,
    },
    params={
        "count": Param(500, type="integer", minimum=1, maximum=1_000_000, description="messages to produce"),
        "rate_per_s": Param(100.0, type="number", exclusiveMinimum=0, description="messages per second"),
        "sampling_percent": Param(
            None,
            type=["null", "number"],
            exclusiveMinimum=0,
            maximum=100,
            description="empty: the stream's sampling rate",
        ),
        "faults": Param(
            {
                "consumer_skip": 0.01,
                "processor_drop": 0.01,
                "offset_rewind": 0.01,
                "producer_retry": 0.01,
                "delay": 0.02,
            },
            type="object",
            description="fault name -> probability per message",
        ),
        "seed": Param(0, type="integer", description="fault plan seed"),
    },
)
def khipu_demo_burst() -> None:
    @task
    def run_demo_burst() -> dict[str, Any]:
        from khipu_airflow.demo import run_burst

        context = get_current_context()
        return run_burst(dict(context["params"]), airflow_run_id=context["ti"].run_id)

    run_demo_burst()


khipu_demo_burst()
