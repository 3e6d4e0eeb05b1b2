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
from khipu.detector.job import DETECTOR_QUERY, start_detector
from khipu.detector.model import DetectorConfig
from khipu.localstack.broker import BrokerProcess
from khipu.reconcile.run import reconcile
from khipu.reconcile.window import ReconcileWindow
from khipu.registry import load_registry
from khipu.store import Store
from khipu.tracing import TracedConsumer, TracedProducer, TraceEmitter, TraceEmitterConfig, carry_trace_headers
from khipu.verdicts.book import VerdictBook
from tests.integration.detector.conftest import detector_job, stored_verdicts

pytestmark = pytest.mark.integration
MESSAGES = 20
CONFIG = DetectorConfig(grace_ms=3_000, max_wait_ms=60_000, recheck_ms=1_000)


def read_all(
    broker: BrokerProcess,
    topic: str,
    group: str,
    emitter: TraceEmitter,
    from_start: bool,
    write_on: tuple[TracedProducer, str] | None = None,
) -> int:
    """Read the topic's MESSAGES records as ``group`` (from its committed offset, or from offset 0: a rewind) and
    commit; with ``write_on`` (a producer, a topic), a processor: each record is written on, carrying its trace
    headers, and acknowledged before the commit (at least once)."""
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
            if write_on is not None:
                producer, output = write_on
                producer.produce(output, value=message.value(), headers=carry_trace_headers(message.headers()),
                                 partition=0)  # fmt: skip
    if write_on is not None:
        assert write_on[0].flush(30) == 0, "the processor's writes were not acknowledged"
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
        "version: 1\nclusters: {local: {}}\nstreams:\n  orders:\n    owner: team-t\n    route:\n"
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

    job = detector_job(broker, tmp_path, trace_topic, "late", registry=registry, store_url=store_url, lost_topic=None,
                       detector=CONFIG)  # fmt: skip
    started_ms = int(time.time() * 1000)
    queries = start_detector(spark, job)
    try:
        decided = wait_for(store, job.verdicts_dir, lambda rows: len(rows) == 2 * MESSAGES)
        assert {(r["hop_kind"], r["verdict"]) for r in decided} == {("write", "DELIVERED"), ("read", "DELIVERED")}
        time.sleep(5)  # after decision: every state dropped (state_rows is 0)

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


def test_a_processor_replaying_its_input_after_decision_writes_duplicates_the_detector_names_at_once(
    broker: BrokerProcess, spark: Any, tmp_path: Path
) -> None:
    """An at-least-once processor re-reads its input after its messages were decided (what a rebalance after a
    broker outage does: seen in CI) and writes every one again; the sink reads the copies at their new offsets.
    Before, the fresh states' receipts at other offsets were "judged on less" and the write and the sink kept
    DELIVERED until reconciliation. Now the detector says at once what its rules say of the two together, and
    reconciliation with all the traces says the same."""
    source, output, proc, sink, trace_topic = (
        f"{name}-{secrets.token_hex(3)}" for name in ("orders", "enriched", "proc", "sink", "traces")
    )
    broker.admin().ensure_topics({source: 1, output: 1, trace_topic: 2})
    registry = tmp_path / "registry.yaml"
    registry.write_text(
        "version: 1\nclusters: {local: {}}\nstreams:\n  orders:\n    owner: team-t\n    route:\n"
        f"      producers: [{{location: p, writes: [local/{source}]}}]\n"
        f"      consumers:\n"
        f"        - {{group: {proc}, location: {proc}, reads: [local/{source}], writes: [local/{output}]}}\n"
        f"        - {{group: {sink}, reads: [local/{output}]}}\n"
    )
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    store = Store(store_url)
    store.migrate()

    def emitter(location: str) -> TraceEmitter:
        return TraceEmitter(TraceEmitterConfig(broker.bootstrap_servers, location, "local", trace_topic))

    emitters = {name: emitter(name) for name in ("p", proc, sink)}
    producer = TracedProducer({"bootstrap.servers": broker.bootstrap_servers}, emitter=emitters["p"], stream="orders")
    for n in range(MESSAGES):
        producer.produce(source, value=str(n).encode(), partition=0)
    assert producer.flush(10) == 0
    writer = TracedProducer({"bootstrap.servers": broker.bootstrap_servers, "enable.idempotence": True},
                            emitter=emitters[proc])  # fmt: skip
    assert read_all(broker, source, proc, emitters[proc], from_start=False, write_on=(writer, output)) == MESSAGES
    assert read_all(broker, output, sink, emitters[sink], from_start=False) == MESSAGES

    job = detector_job(broker, tmp_path, trace_topic, "late", registry=registry, store_url=store_url, lost_topic=None,
                       detector=CONFIG)  # fmt: skip
    started_ms = int(time.time() * 1000)
    queries = start_detector(spark, job)
    try:
        decided = wait_for(store, job.verdicts_dir, lambda rows: len(rows) == 4 * MESSAGES)
        assert {r["verdict"] for r in decided} == {"DELIVERED"}
        time.sleep(5)  # after decision: every state dropped (state_rows is 0)

        # the replay: the processor reads its input again from offset 0 and writes every record again
        assert read_all(broker, source, proc, emitters[proc], from_start=True, write_on=(writer, output)) == MESSAGES
        assert read_all(broker, output, sink, emitters[sink], from_start=False) == MESSAGES  # the copies, at 20..39
        rows = wait_for(
            store,
            job.verdicts_dir,
            lambda rows: sum(r["verdict"] == "DUPLICATE" for r in rows) == 3 * MESSAGES,
        )
    finally:
        for query in queries:
            query.stop()
        for each in emitters.values():
            each.close()

    said = {(r["hop"], r["verdict"], r["cause"], r["count"]) for r in rows}
    assert said == {
        (f"p -> local/{source}", "DELIVERED", None, 1),  # the source wrote each once
        (f"local/{source} -> {proc}", "DUPLICATE", "rewind_replay", 2),  # offsets 0..19 of the input read twice
        (f"{proc} -> local/{output}", "DUPLICATE", "rewind_replay", 2),  # written at two offsets, by the replay
        (f"local/{output} -> {sink}", "DUPLICATE", "producer_retry", 2),  # the id read at two offsets, each once
    }, said
    assert len(rows) == 4 * MESSAGES

    # reconciliation with all the traces: the same answers, final, the flag cleared
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    now = int(time.time() * 1000)
    window = ReconcileWindow(started_ms - 600_000, now, horizon_ms=0)
    committed = CommittedOffsets(ClusterClients({"local": broker.connection()}))
    reconcile(
        spark, job.archive_dir, window, load_registry(registry), VerdictBook(store.verdicts), Lookups(committed),
        CONFIG, now, verdict_archive_dir=job.verdicts_dir,
    )  # fmt: skip
    final = stored_verdicts(store, job.verdicts_dir)
    assert not any(r["late_evidence"] for r in final)
    assert {(r["hop"], r["verdict"], r["cause"], r["count"]) for r in final} == said
    store.close()
