"""Late evidence never makes a verdict worse: a consumer group rewinds long after its messages were decided.

Found as a new user would: the re-read RECEIVED traces start fresh detector states (the old
ones were dropped at decision), which used to be judged on those traces alone and overwrite the
stored verdicts: the producer's DELIVERED write hop became a false TRACE_LOST and the duplicate
was never reported. Real broker, the tracing library's clients, the detector in this process.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from khipu.detector.committed import ClusterClients, CommittedOffsets
from khipu.detector.decide import Lookups
from khipu.detector.job import DETECTOR_QUERY, DetectorJob, start_detector
from khipu.detector.model import DetectorConfig
from khipu.localstack.broker import BrokerProcess
from khipu.reconcile.run import reconcile
from khipu.reconcile.window import ReconcileWindow
from khipu.registry import load_registry
from khipu.store import Store
from khipu.tracing import TracedConsumer, TracedProducer, TraceEmitter, TraceEmitterConfig
from khipu.verdicts.book import VerdictBook
from tests.integration.detector.conftest import stored_verdicts

pytestmark = pytest.mark.integration
MESSAGES = 20
CONFIG = DetectorConfig(grace_ms=3_000, max_wait_ms=60_000, recheck_ms=1_000)


def read_all(broker: BrokerProcess, topic: str, group: str, emitter: TraceEmitter, from_start: bool) -> int:
    consumer = TracedConsumer(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": group, "enable.auto.commit": False,
         "auto.offset.reset": "earliest"},
        emitter=emitter,
    )  # fmt: skip
    if from_start:  # the rewind: back to offset 0, whatever the group committed
        consumer.assign([TopicPartition(topic, 0, 0)])
    else:
        consumer.subscribe([topic])
    read, deadline = 0, time.monotonic() + 30
    while read < MESSAGES and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            read += 1
    consumer.commit(asynchronous=False)
    consumer.close()
    return read


def wait_for(store: Store, verdicts_dir: Path, predicate: Any, timeout_s: float = 120) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        rows = stored_verdicts(store, verdicts_dir)
        beat = store.heartbeat.latest(DETECTOR_QUERY)
        if predicate(rows) and beat is not None and beat["state_rows"] == 0:
            return rows
        time.sleep(2)
    raise AssertionError(f"not reached within {timeout_s:.0f}s; verdicts: {[(r['hop'], r['verdict']) for r in rows]}")


def test_a_group_rewinding_after_decision_gets_duplicates_and_no_verdict_gets_worse(
    broker: BrokerProcess, spark: Any, tmp_path: Path
) -> None:
    topic, group, trace_topic = (f"{name}-{secrets.token_hex(3)}" for name in ("orders", "sink", "traces"))
    broker.admin().ensure_topics({topic: 1, trace_topic: 2})
    registry = tmp_path / "registry.yaml"
    registry.write_text(
        "version: 1\nclusters: {local: {}}\nstreams:\n  orders:\n    owner: t\n    route:\n"
        f"      producers: [{{location: p, writes: [local/{topic}]}}]\n"
        f"      consumers: [{{group: {group}, reads: [local/{topic}]}}]\n"
    )
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    store = Store(store_url)
    store.migrate()

    def emitter(location: str) -> TraceEmitter:
        return TraceEmitter(TraceEmitterConfig(broker.bootstrap_servers, location, "local", trace_topic))

    producing, consuming = emitter("p"), emitter(group)
    producer = TracedProducer({"bootstrap.servers": broker.bootstrap_servers}, emitter=producing, stream="orders")
    for n in range(MESSAGES):
        producer.produce(topic, value=str(n).encode(), partition=0)
    producer.flush(10)
    assert read_all(broker, topic, group, consuming, from_start=False) == MESSAGES

    job = DetectorJob(
        registry_path=registry,
        trace_connection=broker.connection(),
        store_url=store_url,
        checkpoint_dir=tmp_path / "checkpoint",
        archive_dir=tmp_path / "archive",
        verdicts_dir=tmp_path / "verdicts",
        trace_topic=trace_topic,
        lost_topic=None,
        trigger_seconds=1.0,
        detector=CONFIG,
    )
    started_ms = int(time.time() * 1000)
    queries = start_detector(spark, job)
    try:
        decided = wait_for(store, job.verdicts_dir, lambda rows: len(rows) == 2 * MESSAGES)
        assert {(r["hop_kind"], r["verdict"]) for r in decided} == {("write", "DELIVERED"), ("read", "DELIVERED")}
        time.sleep(20)  # well after decision: every state long dropped (state_rows is 0)

        assert read_all(broker, topic, group, consuming, from_start=True) == MESSAGES  # the rewind
        rows = wait_for(
            store,
            job.verdicts_dir,
            lambda rows: all(r["verdict"] == "DUPLICATE" for r in rows if r["hop_kind"] == "read"),
        )
    finally:
        for query in queries:
            query.stop()
        producing.close()
        consuming.close()

    reads = [r for r in rows if r["hop_kind"] == "read"]
    writes = [r for r in rows if r["hop_kind"] == "write"]
    assert len(reads) == len(writes) == MESSAGES
    assert {(r["verdict"], r["cause"], r["count"]) for r in reads} == {("DUPLICATE", "rewind_replay", 2)}
    assert {(r["verdict"], r["count"]) for r in writes} == {("DELIVERED", 1)}  # never a false TRACE_LOST
    assert all(r["late_evidence"] for r in rows)  # left for reconciliation to confirm with all the traces
    some = reads[0]["message_id"]
    assert [(h["from_verdict"], h["to_verdict"]) for h in store.verdicts.history(some) if h["hop"].endswith(group)] == [
        (None, "DELIVERED"),
        ("DELIVERED", "DUPLICATE"),
    ]

    # reconciliation re-decides them with all their traces: the same answers, final, the flag cleared
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    now = int(time.time() * 1000)
    window = ReconcileWindow(started_ms - 600_000, now, horizon_ms=0)
    loaded = load_registry(registry)
    committed = CommittedOffsets(ClusterClients({"local": broker.connection()}))
    report = reconcile(
        spark, job.archive_dir, window, loaded, VerdictBook(store.verdicts), Lookups(committed), CONFIG, now,
        verdict_archive_dir=job.verdicts_dir,
    )  # fmt: skip
    assert report.redecided == MESSAGES
    final = stored_verdicts(store, job.verdicts_dir)
    assert not any(r["late_evidence"] for r in final)
    assert {(r["hop_kind"], r["verdict"], r["cause"], r["count"]) for r in final} == {
        ("read", "DUPLICATE", "rewind_replay", 2),
        ("write", "DELIVERED", None, 1),
    }
    store.close()
