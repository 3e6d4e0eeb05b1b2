"""The demo-burst DAG runs under dag.test() against the real broker and records its ground truth."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from khipu.demo.ledger import build_truth, read_ledger
from khipu.kafka.trace_topic import read_trace_topic, tally_traces
from khipu.localstack.broker import BrokerProcess

pytestmark = pytest.mark.integration


def test_demo_burst_dag_runs_the_pipeline_and_its_traces_reach_the_trace_topic(
    broker: BrokerProcess, airflow_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_KHIPU_KAFKA",
        json.dumps(
            {
                "conn_type": "kafka",
                "extra": {
                    "bootstrap.servers": broker.bootstrap_servers,
                    "khipu.cluster": "local",
                    "khipu.trace_topic": "dagtest.traces",
                },
            }
        ),
    )
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState

    dag = DagBag(dag_folder=str(Path(__file__).resolve().parents[3] / "dags")).get_dag("khipu_demo_burst")
    run = dag.test(run_conf={"count": 60, "rate_per_s": 200, "faults": {"processor_drop": 0.2}, "seed": 3})

    assert run.state == DagRunState.SUCCESS
    ledgers = list((Path(__import__("os").environ["KHIPU_STATE_DIR"]) / "demo").glob("burst-*.jsonl"))
    assert len(ledgers) == 1
    truth = build_truth(read_ledger(ledgers[0]))
    assert len(truth.messages) == 60
    dropped = truth.fault_counts()["processor_drop"]
    assert dropped > 0
    tally = tally_traces(read_trace_topic(broker.bootstrap_servers, "dagtest.traces"))
    assert tally.by_hop == truth.expected_trace_counts()
    assert tally.by_hop[("demo-burst-enricher -> local/demo.bursts-enriched", "SENT")] == 60 - dropped
