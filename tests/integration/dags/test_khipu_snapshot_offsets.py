"""The snapshot DAG under dag.test(): real broker, real store, real HTTP webhook receiver on 127.0.0.1."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from khipu.localstack.broker import BrokerProcess
from khipu.store import Store
from tests.integration.helpers import consumer_config

pytestmark = pytest.mark.integration
DAGS = Path(__file__).resolve().parents[3] / "dags"


def test_snapshot_dag_stores_offsets_alerts_a_rewind_once_and_reports_failures(
    broker: BrokerProcess,
    airflow_db: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    webhook: tuple[str, list[dict[str, Any]]],
) -> None:
    url, received = webhook
    topic, group = f"snap-{secrets.token_hex(3)}", f"snap-group-{secrets.token_hex(3)}"
    broker.admin().ensure_topics({topic: 1})
    registry = tmp_path / "registry.yaml"
    registry.write_text(f"""
version: 1
clusters: {{local: {{connection_id: khipu_kafka}}}}
streams:
  snap.test:
    owner: tests
    route:
      producers: [{{location: p, writes: [local/{topic}]}}]
      consumers: [{{group: {group}, reads: [local/{topic}]}}]
""")
    store_path = tmp_path / "khipu.db"
    monkeypatch.setenv("KHIPU_REGISTRY", str(registry))
    monkeypatch.setenv("KHIPU_HEALTH_WINDOW", "3")
    monkeypatch.setenv(
        "AIRFLOW_CONN_KHIPU_KAFKA",
        json.dumps(
            {"conn_type": "kafka", "extra": {"bootstrap.servers": broker.bootstrap_servers, "khipu.cluster": "local"}}
        ),
    )
    monkeypatch.setenv("AIRFLOW_CONN_KHIPU_STORE", json.dumps({"conn_type": "sqlite", "host": str(store_path)}))
    monkeypatch.setenv("AIRFLOW_CONN_KHIPU_ALERT_WEBHOOK", json.dumps({"conn_type": "http", "extra": {"url": url}}))
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    for _ in range(50):
        producer.produce(topic, value=b"x", partition=0)
    producer.flush(10)
    committer = Consumer(consumer_config(broker, group))
    committer.commit(offsets=[TopicPartition(topic, 0, 50)], asynchronous=False)

    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState

    dag = DagBag(dag_folder=str(DAGS)).get_dag("khipu_snapshot_offsets")
    assert dag.test().state == DagRunState.SUCCESS
    assert received == []  # a caught-up group: nothing to say

    committer.commit(offsets=[TopicPartition(topic, 0, 10)], asynchronous=False)  # rewind 10..50
    committer.close()
    assert dag.test().state == DagRunState.SUCCESS
    assert dag.test().state == DagRunState.SUCCESS  # nothing changed: no alert may fire again

    assert [(a["kind"], a["state"]) for a in received] == [("offset_window", "firing")]
    details = received[0]["details"]
    assert (details["kind"], details["from_offset"], details["to_offset"], details["group"], details["topic"]) == (
        "rewind",
        10,
        50,
        group,
        topic,
    )
    store = Store(f"sqlite:///{store_path}")
    snapshots = store.snapshots.histories("local", 0)
    store.close()
    [(key, history)] = list(snapshots.items())
    assert (key.group, [s.committed for s in history], [s.log_end for s in history]) == (
        group,
        [50, 10, 10],
        [50, 50, 50],
    )

    from khipu_airflow.notifiers import notify_failure

    notify_failure(
        {
            "dag": dag,
            "run_id": "manual_1",
            "exception": RuntimeError("Kafka unreachable"),
            "ti": SimpleNamespace(task_id="snapshot_offsets", dag_id=dag.dag_id, run_id="manual_1"),
        }
    )
    failure = received[-1]
    assert (failure["kind"], failure["details"]["task_id"], failure["details"]["error"]) == (
        "task_failure",
        "snapshot_offsets",
        "RuntimeError: Kafka unreachable",
    )
