"""The time of the oldest record the detector has not read, fetched from the real broker: the first record at or after
an offset, with the broker's append time (a LogAppendTime topic). The truth is what the broker acknowledged to the
test's producer: each record's offset and its timestamp in the delivery report."""

from __future__ import annotations

import secrets

import pytest
from confluent_kafka import Message, Producer

from khipu.detector.trail import with_oldest_unread
from khipu.localstack.broker import BrokerProcess
from khipu.store.heartbeat import PartitionTrail

pytestmark = pytest.mark.integration


def produce(broker: BrokerProcess, topic: str, counts: dict[int, int]) -> dict[tuple[int, int], int]:
    """``counts`` records on each partition; (partition, offset) -> timestamp, as the broker acknowledged them."""
    acknowledged: dict[tuple[int, int], int] = {}

    def delivered(error: object, message: Message) -> None:
        assert error is None, error
        acknowledged[(message.partition(), message.offset())] = message.timestamp()[1]

    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0})
    for partition, count in counts.items():
        for n in range(count):
            producer.produce(topic, value=f"r{n}".encode(), partition=partition, on_delivery=delivered)
            producer.flush(10)  # one at a time: each record its own append time
    return acknowledged


def test_the_first_record_at_or_after_an_offset_comes_with_its_broker_time(broker: BrokerProcess) -> None:
    topic = f"times-{secrets.token_hex(3)}"
    admin = broker.admin()
    admin.ensure_trace_topic(topic, 2)  # LogAppendTime
    truth = produce(broker, topic, {0: 5, 1: 3})
    assert len(set(truth.values())) > 1  # the records were appended at different times: the answer tells them apart

    found = admin.record_times(topic, {0: 2, 1: 0})
    assert found.found == {0: (2, truth[(0, 2)]), 1: (0, truth[(1, 0)])} and found.errors == ()

    admin.delete_records({(topic, 0): 4})  # 2 and 3 removed: the oldest still there is 4
    removed = admin.record_times(topic, {0: 2})
    assert removed.found == {0: (4, truth[(0, 4)])}

    at_end = admin.record_times(topic, {1: 3})  # nothing written there yet
    assert at_end.found == {} and at_end.errors == (f"{topic}[1] at or after offset 3: no record there",)


def test_the_oldest_unread_time_is_fetched_once_per_record_and_again_when_the_record_changes(
    broker: BrokerProcess,
) -> None:
    topic = f"times-{secrets.token_hex(3)}"
    admin = broker.admin()
    admin.ensure_trace_topic(topic, 2)
    truth = produce(broker, topic, {0: 4, 1: 2})
    trails = [PartitionTrail(0, 1, 3, 0, 4, 1_000), PartitionTrail(1, 2, 3, 0, 2, 1_000)]  # partition 1 read to its end
    filled = with_oldest_unread(admin, topic, trails)
    assert [(t.oldest_unread_offset, t.oldest_unread_ms) for t in filled] == [(1, truth[(0, 1)]), (None, None)]

    known = [PartitionTrail(0, 1, 3, 0, 4, 1_000, 1, 123)]  # an earlier answer for the same record is not asked again
    assert with_oldest_unread(admin, topic, trails, known)[0].oldest_unread_ms == 123
    moved = [PartitionTrail(0, 3, 4, 0, 4, 2_000)]  # a batch read on to 3: that record's time is fetched
    assert with_oldest_unread(admin, topic, moved, known)[0].oldest_unread_ms == truth[(0, 3)]
