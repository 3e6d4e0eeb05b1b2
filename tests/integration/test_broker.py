"""The local Apache Kafka broker: formatted once, and its topics, records and committed offsets survive a restart
(what lets the detector's checkpoint stay valid across `make down` / `make up`)."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from khipu.kafka.admin import one_group_per_coordinator
from khipu.localstack.broker import BrokerSpec, formatted, start_broker
from khipu.localstack.processes import port_open, stop_process_group

pytestmark = pytest.mark.integration


def test_topics_records_and_committed_offsets_survive_a_restart(tmp_path: Path) -> None:
    spec = BrokerSpec.scratch(tmp_path / "kafka", sasl_users={"u": "broker-secret"})
    started = time.monotonic()
    first = start_broker(spec, tmp_path / "broker.log")
    first_start_s = time.monotonic() - started
    try:
        assert formatted(spec)
        assert stat.S_IMODE((spec.directory / "server.properties").stat().st_mode) == 0o600  # it holds SASL users
        first.admin().ensure_topics({"kept": 2})
        producer = Producer({"bootstrap.servers": spec.bootstrap_servers})
        for n in range(10):
            producer.produce("kept", value=str(n).encode(), partition=n % 2)
        assert producer.flush(10) == 0
        del producer
        committer = Consumer(
            {"bootstrap.servers": spec.bootstrap_servers, "group.id": "g", "enable.auto.commit": False}
        )
        committer.commit(offsets=[TopicPartition("kept", 0, 3), TopicPartition("kept", 1, 4)], asynchronous=False)
        committer.close()
    finally:
        stop_process_group(first.pid)
    assert not port_open(spec.host, spec.port)

    started = time.monotonic()
    second = start_broker(spec, tmp_path / "broker.log")
    restart_s = time.monotonic() - started
    try:
        admin = second.admin()
        assert admin.partitions()["kept"] == [0, 1]
        assert admin.watermarks([("kept", 0), ("kept", 1)]).found == {("kept", 0): (0, 5), ("kept", 1): (0, 5)}
        assert admin.committed_offsets("g") == {("kept", 0): 3, ("kept", 1): 4}
    finally:
        stop_process_group(second.pid)
    print(f"broker: first start (format + start) {first_start_s:.1f} s, restart {restart_s:.1f} s")


def test_a_started_broker_takes_commits_at_once_and_each_group_lands_on_the_coordinator_partition_named(
    tmp_path: Path,
) -> None:
    """start_broker returns only once every group coordinator has loaded, so a commit straight after it does not
    meet "Coordinator load in progress" (a fresh-clone CI run met it in a fixture's first commit). The partition
    each group's commit is written to is read back from __consumer_offsets itself."""
    spec = BrokerSpec.scratch(tmp_path / "kafka")
    broker = start_broker(spec, tmp_path / "broker.log")
    try:
        partitions = int(spec.properties()["offsets.topic.num.partitions"])
        broker.admin().ensure_topics({"committed": 1})
        groups = one_group_per_coordinator(partitions, prefix="landing-")
        for group in groups:  # no retry here: each must succeed on the first try
            committer = Consumer({"bootstrap.servers": spec.bootstrap_servers, "group.id": group})
            committer.commit(offsets=[TopicPartition("committed", 0, 1)], asynchronous=False)
            committer.close()
        reader = Consumer(
            {"bootstrap.servers": spec.bootstrap_servers, "group.id": "reader", "enable.auto.commit": False}
        )
        landed: dict[str, int] = {}
        for p in range(partitions):
            low, high = reader.get_watermark_offsets(TopicPartition("__consumer_offsets", p), timeout=10)
            reader.assign([TopicPartition("__consumer_offsets", p, low)])
            position = low
            while position < high:
                record = reader.poll(5)
                assert record is not None, f"__consumer_offsets[{p}] gave nothing before its end {high}"
                if record.error() is None:
                    position = record.offset() + 1
                    landed.update({g: p for g in groups if g.encode() in (record.key() or b"")})
        reader.close()
    finally:
        stop_process_group(broker.pid)
    assert landed == {g: p for p, g in enumerate(groups)}
