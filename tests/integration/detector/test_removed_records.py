"""Records that leave the log before their group reads them, on the real broker: expired by a real retention of
seconds (seed 002) and truncated with DeleteRecords (seed 000). Consumer health warns of the expiry before it
happens; the detector gives the read hops LOST with cause expired / truncated, telling the two apart from the
topic's retention and the offset history in the snapshot store.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from khipu.alerting.cluster import evaluate_cluster
from khipu.health.evaluate import HealthConfig
from khipu.health.rules import PartitionStatus
from khipu.localstack.broker import BrokerProcess
from khipu.offsets.collect import collect_snapshot
from khipu.offsets.model import PartitionKey
from khipu.store import Store
from khipu.tracing import TracedProducer, TraceEmitter, TraceEmitterConfig
from tests.integration.detector.conftest import detector_job, run_detector_until
from tests.integration.helpers import consumer_config

pytestmark = pytest.mark.integration
RETENTION_MS = 12_000
MESSAGES = 5


def test_expiry_is_warned_of_before_it_happens_and_expired_and_truncated_records_are_lost_with_their_cause(
    broker: BrokerProcess, spark: Any, tmp_path: Path
) -> None:
    tag = secrets.token_hex(3)
    short, kept, traces = f"short-{tag}", f"kept-{tag}", f"traces-{tag}"
    slow, idle = f"slow-{tag}", f"idle-{tag}"
    broker.admin().ensure_topics(
        {short: 1, kept: 1, traces: 2},
        configs={short: {"retention.ms": str(RETENTION_MS), "segment.ms": "1000"}},
    )
    registry = tmp_path / "registry.yaml"
    registry.write_text(f"""
version: 1
clusters: {{local: {{connection_id: khipu_kafka}}}}
streams:
  short.lived:
    owner: tests
    route:
      producers: [{{location: writer, writes: [local/{short}]}}]
      consumers: [{{group: {slow}, reads: [local/{short}]}}]
  kept.forever:
    owner: tests
    route:
      producers: [{{location: writer, writes: [local/{kept}]}}]
      consumers: [{{group: {idle}, reads: [local/{kept}]}}]
""")
    store_url = f"sqlite:///{tmp_path / 'khipu.db'}"
    store = Store(store_url)
    store.migrate()
    watched = {slow: frozenset({short}), idle: frozenset({kept})}
    health = HealthConfig(window_size=3, min_window=2, expiry_margin_ms=RETENTION_MS - 4_000)

    # the groups exist and sit at offset 0: they will fall behind and never read these records
    for group, topic in ((slow, short), (idle, kept)):
        setter = Consumer(consumer_config(broker, group))
        setter.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
        setter.close()

    emitter = TraceEmitter(TraceEmitterConfig(broker.bootstrap_servers, "writer", "local", topic=traces))
    with emitter:
        for stream, topic in (("short.lived", short), ("kept.forever", kept)):
            producer = TracedProducer({"bootstrap.servers": broker.bootstrap_servers}, emitter=emitter, stream=stream)
            for n in range(MESSAGES):
                producer.produce(topic, value=f"{stream}-{n}".encode())
            assert producer.flush(10) == 0
    written_at = time.time()
    truncated_to = broker.admin().delete_records({(kept, 0): MESSAGES})  # seed 000: the log truncated at the broker
    assert truncated_to == {(kept, 0): MESSAGES}

    # snapshot every 2 s while the short-lived records age; a filler record a second rolls the segments
    filler = Producer({"bootstrap.servers": broker.bootstrap_servers})
    key = PartitionKey("local", slow, short, 0)
    first_risk_ms = first_gone_ms = None
    deadline = time.monotonic() + 90
    while first_gone_ms is None and time.monotonic() < deadline:
        filler.produce(short, value=b"filler")
        filler.flush(5)
        run, rows = collect_snapshot(broker.connection(), watched, time.time_ns() // 1_000_000)
        store.snapshots.write(run, rows)
        evaluate_cluster(store, "local", health)
        row = next(r for r in rows if r.key == key)
        if (
            first_risk_ms is None
            and store.health.current_statuses("local")[key].status_name == PartitionStatus.EXPIRY_RISK.name
        ):
            first_risk_ms = row.snapshot_ms
            risk_log_start = row.log_start
        if row.log_start is not None and row.log_start >= MESSAGES:
            first_gone_ms = row.snapshot_ms
        time.sleep(2)
    assert first_gone_ms is not None, "retention never deleted the short-lived records"
    assert first_risk_ms is not None and first_risk_ms < first_gone_ms  # warned before it happened ...
    assert risk_log_start == 0  # ... while every record was still in the log
    assert first_gone_ms / 1000 - written_at >= RETENTION_MS / 1000  # retention acted, not before its time
    alerts = [a.details for a in store.alerts.read() if a.kind == "group_status"]
    assert any(d["group"] == slow and d["to_status"] == "EXPIRY_RISK" for d in alerts)

    # the slow group comes back: its offset is out of range, it resets to the log start and commits past
    resumed = Consumer({**consumer_config(broker, slow), "auto.offset.reset": "earliest"})
    resumed.subscribe([short])
    got = []
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        msg = resumed.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append(msg.offset())
    resumed.commit(asynchronous=False)
    resumed.close()
    assert got and min(got) >= MESSAGES  # it could not read any of them
    run, rows = collect_snapshot(broker.connection(), watched, time.time_ns() // 1_000_000)
    store.snapshots.write(run, rows)

    job = detector_job(broker, tmp_path, traces, "removed", registry=registry, store_url=store_url, lost_topic=None)
    store.close()
    verdicts = run_detector_until(spark, job, 4 * MESSAGES)

    by_hop: dict[str, set[tuple[str, str | None]]] = {}
    for v in verdicts:
        by_hop.setdefault(v["hop"], set()).add((v["verdict"], v["cause"]))
    assert by_hop == {
        f"writer -> local/{short}": {("DELIVERED", None)},
        f"local/{short} -> {slow}": {("LOST", "expired")},
        f"writer -> local/{kept}": {("DELIVERED", None)},
        f"local/{kept} -> {idle}": {("LOST", "truncated")},  # decided though idle never moved: it never can read them
    }
    assert len(verdicts) == 4 * MESSAGES
    details = {v["cause"]: v["detail"] for v in verdicts if v["verdict"] == "LOST"}
    assert f"past retention.ms {RETENTION_MS}" in details["expired"]
    assert "younger than retention.ms 604800000" in details["truncated"]
