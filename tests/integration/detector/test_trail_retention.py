"""The trace topic's retention outrunning a stopped detector, on the real broker and real Spark.

A trace topic keeps its records 20 s (``retention.ms``, segments rolled every second, the broker's retention check
every second). The detector reads it to its end and stops; the test writes on while it is stopped. The trace_trail
alert must fire while the broker still has every record the detector has not read, say so again once the broker has
removed them, and once the detector runs again (Spark skips what is gone: ``failOnDataLoss=false``) the trace_skip
alert must name the partition and exactly the offsets written while it was stopped. The truth is what the test wrote
(each record's offset and broker time, from the broker's acknowledgements) and the log's bounds asked of the broker,
never Khipu's figures.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Message, Producer

from khipu.alerting.trail import SKIP_ALERT_KIND, TRAIL_ALERT_KIND, TrailCheck, check_trail
from khipu.detector.job import DETECTOR_QUERY, DetectorJob, start_detector
from khipu.kafka.admin import TRACE_TOPIC_CONFIG
from khipu.localstack.broker import BrokerProcess
from khipu.report.exporter import ExportWindows, metric_families, read_store
from khipu.store import Store
from khipu.trace.codec import encode_trace
from khipu.trace.model import Trace, TraceType
from tests.integration.detector.conftest import detector_job
from tests.integration.helpers import until

pytestmark = pytest.mark.integration
RETENTION_MS = 20_000
FLOOR_MS = 1_000  # KHIPU_EXPIRY_MARGIN_S as this test sets it: the margin is half the retention, 10 s


class Writer:
    """Writes SENT traces of ``trail.orders`` to the trace topic, a record each, and keeps what the broker acknowledged:
    each record's offset and its broker time (the topic is LogAppendTime)."""

    def __init__(self, broker: BrokerProcess, topic: str) -> None:
        self.topic, self.seq = topic, 0
        self.producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0})
        self.appended: dict[int, int] = {}  # offset -> broker time (ms)

    def write(self, records: int = 1) -> None:
        def acknowledged(error: object, message: Message) -> None:
            assert error is None, error
            self.appended[message.offset()] = message.timestamp()[1]

        for _ in range(records):
            self.seq += 1
            trace = Trace(
                f"m{self.seq}", "trail.orders", "writer", "local", TraceType.SENT, int(time.time() * 1000),
                "trail-orders", 0, self.seq, None, "writer-e1", self.seq, 100.0,
            )  # fmt: skip
            self.producer.produce(self.topic, value=encode_trace(trace), partition=0, on_delivery=acknowledged)
        assert self.producer.flush(10) == 0


def log_bounds(broker: BrokerProcess, topic: str) -> tuple[int, int]:
    """(log start, log end) of partition 0, asked of the broker."""
    return broker.admin().watermarks([(topic, 0)]).found[(topic, 0)]


def spark_read_to(queries: list[Any], topic: str) -> int | None:
    """Where the detector's query last ended on partition 0, as Spark's own progress reports it."""
    (query,) = [q for q in queries if q.name == DETECTOR_QUERY]
    progress = query.lastProgress
    if progress is None:
        return None
    sources = progress["sources"] if isinstance(progress, dict) else progress.sources
    end = sources[0]["endOffset"] if isinstance(sources[0], dict) else sources[0].endOffset
    offsets = json.loads(end) if isinstance(end, str) else end
    return int(offsets[topic]["0"])


def run_until_read(
    spark: Any,
    job: DetectorJob,
    broker: BrokerProcess,
    then: Callable[[], object] = lambda: None,
    timeout_s: float = 180,
) -> None:
    """Run the detector, call ``then`` once it is started, and wait until Spark says it read partition 0 to the log
    end the broker has then; then stop it."""
    topic = job.trace_topic
    queries = start_detector(spark, job)
    then()
    _, log_end = log_bounds(broker, topic)
    try:
        until(lambda: spark_read_to(queries, topic) == log_end, timeout_s, f"the detector reading {topic} to {log_end}")
        time.sleep(2)  # the batch's writer records its trail after Spark's progress says where it ended
    finally:
        for query in queries:
            query.stop()


def exported(store: Store, now_ms: int) -> dict[str, float]:
    """The exporter's detector trail figures, as a scrape at ``now_ms`` would serve them."""
    reading = read_store(store, "local", now_ms, ExportWindows(), (DETECTOR_QUERY,))
    figures = {}
    for family in metric_families(reading, now_ms, ExportWindows()):
        if family.name.startswith(("khipu_detector_trail", "khipu_detector_skipped")):
            for sample in family.samples:
                figures[sample.name] = sample.value
    return figures


def test_the_trail_alert_fires_before_retention_outruns_a_stopped_detector_and_the_skip_is_told_exactly(
    broker: BrokerProcess, spark: Any, tmp_path: Path
) -> None:
    tag = secrets.token_hex(3)
    topic = f"traces-trail-{tag}"
    admin = broker.admin()
    config = {**TRACE_TOPIC_CONFIG, "retention.ms": str(RETENTION_MS), "segment.ms": "1000"}
    admin.ensure_topics({topic: 1, "trail-orders": 1}, configs={topic: config})
    registry = tmp_path / "registry.yaml"
    registry.write_text("""
version: 1
clusters: {local: {connection_id: khipu_kafka}}
streams:
  trail.orders:
    owner: tests
    route:
      producers: [{location: writer, writes: [local/trail-orders]}]
      consumers: [{group: trail-sink, reads: [local/trail-orders]}]
""")
    job = detector_job(broker, tmp_path, topic, "trail", registry=registry, lost_topic=None)
    store = Store(job.store_url)
    writer = Writer(broker, topic)

    def check() -> TrailCheck:
        return check_trail(store, admin, DETECTOR_QUERY, topic, FLOOR_MS, time.time_ns() // 1_000_000)

    # 1. the detector reads what there is, and stops: nothing behind
    writer.write(3)
    run_until_read(spark, job, broker)
    _, read_end = log_bounds(broker, topic)  # every offset the detector read: all the test wrote
    assert [t.read_end for t in store.heartbeat.trail(DETECTOR_QUERY)] == [read_end]
    first = check()
    assert (first.status, first.records_behind, first.seconds_behind) == ("OK", 0, 0.0)

    # 2. stopped, the test writes on (a record every half second rolls the one-second segments): the alert fires
    # while the broker still has every record the detector has not read
    fired = None
    while fired is None:
        writer.write()
        now = time.time_ns() // 1_000_000
        checked = check_trail(store, admin, DETECTOR_QUERY, topic, FLOOR_MS, now)
        log_start, log_end = log_bounds(broker, topic)
        assert log_start <= read_end, "retention removed records the detector had not read before the alert fired"
        oldest_age_ms = now - writer.appended[read_end]  # the first record written while it was stopped
        assert checked.records_behind == log_end - read_end  # nothing was written between the check and the ask
        assert checked.seconds_behind == pytest.approx(oldest_age_ms / 1000)
        if checked.status != "OK":
            fired = (checked, oldest_age_ms, now)
        else:
            assert oldest_age_ms < RETENTION_MS // 2  # not firing only while younger than retention less the margin
        time.sleep(0.5)
    checked, oldest_age_ms, fired_ms = fired
    assert checked.status == "RETENTION_MS_NEAR" and checked.alerts == 1
    assert oldest_age_ms >= RETENTION_MS // 2  # fired at the margin: the oldest record not read half the retention old
    (alert,) = store.alerts.firing(TRAIL_ALERT_KIND)
    assert alert.details["partitions"][0]["read_end"] == read_end
    assert alert.details["retention_ms"] == RETENTION_MS and alert.details["margin_ms"] == RETENTION_MS // 2
    figures = exported(store, fired_ms)
    assert figures["khipu_detector_trail_records"] == checked.records_behind
    assert figures["khipu_detector_trail_seconds"] == pytest.approx(oldest_age_ms / 1000)

    # 3. nothing more is written: the broker removes every record, the one-second segments as they age out, those the
    # detector has not read among them (Khipu is asked nothing meanwhile, so that it is told the whole removal at once)
    assert check().alerts == 0  # firing already: no second alert for the same risk
    written_to = max(writer.appended) + 1
    until(lambda: log_bounds(broker, topic) == (written_to, written_to), 90, "every record aged out")
    assert time.time_ns() // 1_000_000 - max(writer.appended.values()) >= RETENTION_MS  # retention did it, in time
    removed = check()
    assert removed.status == "REMOVED" and removed.alerts == 1
    (update,) = store.alerts.firing(TRAIL_ALERT_KIND)
    unread = written_to - read_end  # every record written while the detector was stopped
    assert update.title.startswith(f"updated: the broker removed {unread} offsets of trace topic {topic}")
    assert f"partition 0 offsets {read_end}..{written_to - 1} ({unread})" in update.title
    assert exported(store, time.time_ns() // 1_000_000)["khipu_detector_trail_removed_offsets"] == unread

    # 4. the detector runs again: Spark skips what is gone; the skip alert names it, the trail alert resolves
    run_until_read(spark, job, broker, then=lambda: writer.write(2))  # new traces, read well within their retention
    after = check()
    assert (after.status, after.records_behind) == ("OK", 0) and after.alerts == 2  # the resolve and the skip
    resolved = [a for a in store.alerts.read() if a.kind == TRAIL_ALERT_KIND]
    assert [a.state for a in resolved] == ["firing", "firing", "resolved"]
    (skip,) = [a for a in store.alerts.read() if a.kind == SKIP_ALERT_KIND]
    assert [(p["partition"], p["from_offset"], p["to_offset"], p["skipped"]) for p in skip.details["partitions"]] == [
        (0, read_end, written_to, unread)
    ]
    assert f"skipped {unread} offsets of trace topic {topic}" in skip.title
    assert exported(store, time.time_ns() // 1_000_000)["khipu_detector_skipped_offsets"] == unread
    assert check().alerts == 0  # told once
    writer.producer.close()
    store.close()
