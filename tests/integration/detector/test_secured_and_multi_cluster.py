"""The detector against secured and several clusters, on real brokers.

1. SASL_PLAINTEXT with a user and password: the detector reads the trace topic, looks up committed
   offsets and log starts only through the broker's SASL listener, and its verdicts are exact; a wrong
   password is refused by the broker.
2. A route across two clusters (two brokers): snapshotted by the DAG and judged by the detector, each
   cluster through its own connection (the registry's ``clusters.<name>.connection_id``).
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from khipu.demo.score import observable_messages, score
from khipu.detector.job import DetectorJob, start_detector
from khipu.kafka import KafkaAdmin, KafkaConnection, KafkaUnavailable
from khipu.localstack.broker import BrokerProcess
from khipu.store import Store
from khipu.tracing import TracedConsumer, TracedProducer, TraceEmitter, TraceEmitterConfig, carry_trace_headers
from tests.integration.conftest import SASL_USER
from tests.integration.detector.conftest import FAST, REGISTRY, demo_traces, run_detector_until, wait_until_settled
from tests.integration.helpers import TEST_SESSION_TIMEOUT_MS

pytestmark = pytest.mark.integration
DAGS = Path(__file__).resolve().parents[3] / "dags"


def sasl_connection(broker: BrokerProcess, password: str) -> KafkaConnection:
    assert broker.spec.sasl_bootstrap_servers is not None
    return KafkaConnection.from_settings(
        {
            "bootstrap.servers": broker.spec.sasl_bootstrap_servers,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": SASL_USER,
            "sasl.password": password,
        },
        cluster="local",
    )


def test_the_detector_reads_and_judges_through_a_sasl_listener_with_a_user_and_password(
    broker: BrokerProcess, spark: Any, tmp_path: Path
) -> None:
    demo = demo_traces(broker, tmp_path, "sasl", count=80, seed=3)
    secured = sasl_connection(broker, broker.spec.sasl_users[SASL_USER])
    wrong = sasl_connection(broker, "not-the-password")
    with pytest.raises(KafkaUnavailable, match="Authentication failed"):
        KafkaAdmin(wrong, timeout_s=5).partitions()
    assert demo.trace_topic in KafkaAdmin(secured).partitions()  # the right one gets in

    store_url = f"sqlite:///{tmp_path / 'sasl.db'}"
    Store(store_url).migrate()
    lost_topic = f"lost-{secrets.token_hex(3)}"
    broker.admin().ensure_topics({lost_topic: 1})
    job = DetectorJob(
        registry_path=REGISTRY,
        trace_connection=secured,
        store_url=store_url,
        checkpoint_dir=tmp_path / "sasl-checkpoint",
        archive_dir=tmp_path / "sasl-archive",
        verdicts_dir=tmp_path / "sasl-verdicts",
        trace_topic=demo.trace_topic,
        lost_topic=lost_topic,
        cluster_connections={"local": secured},
        trigger_seconds=1.0,
        detector=FAST,
    )
    queries = start_detector(spark, job)
    try:
        verdicts = wait_until_settled(store_url, len(observable_messages(demo.truth)), verdicts_dir=job.verdicts_dir)
    finally:
        for query in queries:
            query.stop()
    result = score(demo.truth, verdicts)
    assert result.exact and result.matched > 300, (result.wrong, result.missing, result.extra)
    lost = [v for v in verdicts if v["verdict"] == "LOST"]
    assert lost  # the LOST verdicts went to the lost topic through the SASL listener too
    assert sum(high for _, high in KafkaAdmin(secured).watermarks([(lost_topic, 0)]).found.values()) == len(lost)


def test_a_route_across_two_clusters_is_snapshotted_and_judged_with_each_clusters_own_connection(
    broker: BrokerProcess,
    second_broker: BrokerProcess,
    spark: Any,
    airflow_db: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tag = secrets.token_hex(3)
    source, output, traces = f"in-{tag}", f"out-{tag}", f"traces-{tag}"
    proc, sink = f"proc-{tag}", f"sink-{tag}"
    broker.admin().ensure_topics({source: 2, traces: 2})
    second_broker.admin().ensure_topics({output: 2})
    registry = tmp_path / "registry.yaml"
    registry.write_text(f"""
version: 1
clusters:
  east: {{connection_id: kafka_east}}
  west: {{connection_id: kafka_west}}
streams:
  across:
    owner: tests
    route:
      producers: [{{location: api, writes: [east/{source}]}}]
      consumers:
        - {{group: {proc}, reads: [east/{source}], writes: [west/{output}]}}
        - {{group: {sink}, reads: [west/{output}]}}
""")
    east, west = broker.connection("east"), second_broker.connection("west")

    def emitter(location: str) -> TraceEmitter:
        return TraceEmitter(TraceEmitterConfig(broker.bootstrap_servers, location, "east", topic=traces))

    def consumer(on: BrokerProcess, group: str, topic: str, cluster: str, via: TraceEmitter) -> TracedConsumer:
        built = TracedConsumer(
            {
                "bootstrap.servers": on.bootstrap_servers,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": TEST_SESSION_TIMEOUT_MS,
            },
            emitter=via,
            cluster=cluster,
        )
        built.subscribe([topic])
        return built

    count, skipped = 20, None
    with emitter("api") as api, emitter(proc) as proc_emitter, emitter(sink) as sink_emitter:
        producer = TracedProducer({"bootstrap.servers": broker.bootstrap_servers}, emitter=api, stream="across")
        ids = [producer.produce(source, value=str(n).encode()) for n in range(count)]
        assert producer.flush(10) == 0
        reader = consumer(broker, proc, source, "east", proc_emitter)
        writer = TracedProducer(
            {"bootstrap.servers": second_broker.bootstrap_servers}, emitter=proc_emitter, cluster="west"
        )
        moved = 0
        deadline = time.monotonic() + 60
        while moved < count and time.monotonic() < deadline:
            msg = reader.poll(0.5)
            if msg is not None and msg.error() is None:
                writer.produce(output, value=msg.value(), headers=carry_trace_headers(msg.headers()))
                moved += 1
        assert writer.flush(10) == 0
        reader.commit(asynchronous=False)
        reader.close()
        sinker = consumer(second_broker, sink, output, "west", sink_emitter)
        read = 0
        deadline = time.monotonic() + 60
        while read < count - 1 and time.monotonic() < deadline:
            msg = sinker.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            read += 1
            if skipped is None:  # skip the next record of this partition, as a buggy offset manager would
                skipped = (msg.partition(), msg.offset() + 1)
                sinker.seek(TopicPartition(output, msg.partition(), msg.offset() + 2))
        sinker.commit(asynchronous=False)
        sinker.close()
    assert skipped is not None

    # the snapshot DAG: each cluster through its own connection
    store_path = tmp_path / "khipu.db"
    for variable, connection in (("KAFKA_EAST", east), ("KAFKA_WEST", west)):
        monkeypatch.setenv(
            f"AIRFLOW_CONN_{variable}",
            json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": connection.bootstrap_servers}}),
        )
    monkeypatch.setenv("AIRFLOW_CONN_KHIPU_STORE", json.dumps({"conn_type": "sqlite", "host": str(store_path)}))
    monkeypatch.setenv("KHIPU_REGISTRY", str(registry))
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState

    assert DagBag(dag_folder=str(DAGS)).get_dag("khipu_snapshot_offsets").test().state == DagRunState.SUCCESS
    store = Store(f"sqlite:///{store_path}")
    snapshots = {
        cluster: {(s.group, s.topic, s.partition): s.committed for s in store.snapshots.latest(cluster)}
        for cluster in ("east", "west")
    }
    assert {key[0] for key in snapshots["east"]} == {proc} and {key[0] for key in snapshots["west"]} == {sink}
    assert sum(v or 0 for v in snapshots["east"].values()) == count
    assert sum(v or 0 for v in snapshots["west"].values()) == count  # committed past every record, one skipped

    job = DetectorJob(
        registry_path=registry,
        trace_connection=east,
        store_url=f"sqlite:///{store_path}",
        checkpoint_dir=tmp_path / "checkpoint",
        archive_dir=tmp_path / "archive",
        verdicts_dir=tmp_path / "verdicts",
        trace_topic=traces,
        lost_topic=None,
        cluster_connections={"east": east, "west": west},
        trigger_seconds=1.0,
        detector=FAST,
    )
    store.close()
    verdicts = run_detector_until(spark, job, 4 * count)
    kinds: dict[str, dict[str, int]] = {}
    for v in verdicts:
        label = v["verdict"] + (f"/{v['cause']}" if v["cause"] else "")
        kinds.setdefault(v["hop"], {}).setdefault(label, 0)
        kinds[v["hop"]][label] += 1
    assert kinds == {
        f"api -> east/{source}": {"DELIVERED": count},
        f"east/{source} -> {proc}": {"DELIVERED": count},
        f"{proc} -> west/{output}": {"DELIVERED": count},
        f"west/{output} -> {sink}": {"DELIVERED": count - 1, "LOST/skipped_by_consumer": 1},
    }
    [lost] = [v for v in verdicts if v["verdict"] == "LOST"]
    assert (lost["partition"], lost["offset"]) == skipped and lost["message_id"] in ids
