"""The local Apache Kafka broker: formatted once, and its topics, records and committed offsets survive a restart
(what lets the detector's checkpoint stay valid across `make down` / `make up`)."""

from __future__ import annotations

import secrets
import stat
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from khipu.kafka.admin import one_group_per_coordinator
from khipu.localstack.broker import BrokerProcess, BrokerSpec, formatted, start_broker
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


def test_each_group_commits_to_the_partition_of_consumer_offsets_that_group_partition_names(
    broker: BrokerProcess,
) -> None:
    """start_broker waits for every group coordinator by asking one group of each partition of __consumer_offsets
    (one_group_per_coordinator), so that a commit straight after it does not meet "Coordinator load in progress" (a
    fresh-clone CI run met it in a fixture's first commit; the restart test above commits straight after a first
    start). That holds only if group_partition says where Kafka puts a group: read back from __consumer_offsets."""
    partitions = int(broker.spec.properties()["offsets.topic.num.partitions"])
    topic = f"committed-{secrets.token_hex(3)}"
    broker.admin().ensure_topics({topic: 1})
    groups = one_group_per_coordinator(partitions, prefix=f"landing-{secrets.token_hex(3)}-")
    for group in groups:
        committer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
        committer.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
        committer.close()
    reader = Consumer(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": "reader", "enable.auto.commit": False}
    )
    landed: dict[str, int] = {}
    try:
        marks = {
            p: reader.get_watermark_offsets(TopicPartition("__consumer_offsets", p), timeout=10)
            for p in range(partitions)
        }
        assigned = [TopicPartition("__consumer_offsets", p, low) for p, (low, _) in marks.items()]
        reader.assign(assigned)
        deadline = time.monotonic() + 30
        while True:  # the consumer's position, not the last record's offset: it also passes transaction markers
            at = {tp.partition: tp.offset for tp in reader.position(assigned)}
            if all(at[p] >= high for p, (_, high) in marks.items()):
                break
            assert time.monotonic() < deadline, f"__consumer_offsets not read to its end: {at} of {marks}"
            record = reader.poll(1)
            if record is not None and record.error() is None:
                landed.update({g: record.partition() for g in groups if g.encode() in (record.key() or b"")})
    finally:
        reader.close()
    assert landed == {g: p for p, g in enumerate(groups)}
