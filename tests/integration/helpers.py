"""Small helpers shared by integration tests."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from khipu.kafka.trace_topic import read_trace_topic
from khipu.localstack.broker import BrokerProcess
from khipu.trace import Trace

# The broker's minimum: a test consumer that goes away without leaving its group hands its partitions
# on within seconds, not librdkafka's default 45 s.
TEST_SESSION_TIMEOUT_MS = 6000


def consumer_config(broker: BrokerProcess, group: str) -> dict[str, object]:
    """A group consumer reading from the beginning, committing only when told."""
    return {
        "bootstrap.servers": broker.bootstrap_servers,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": TEST_SESSION_TIMEOUT_MS,
    }


def traces_of(broker: BrokerProcess, topic: str) -> list[Trace]:
    """Every trace on ``topic`` (emitter marks left out); fails the test if any record on it is malformed."""
    records = read_trace_topic(broker.bootstrap_servers, topic)
    malformed = [r for r in records if isinstance(r, Exception)]
    assert not malformed, malformed
    return [r for r in records if isinstance(r, Trace)]


def consume_all(consumer: Consumer, expected: int, timeout_s: float = 30.0) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < expected and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            got.append(msg)
    return got


def until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Wait for ``check`` to hold; fails the test naming ``what`` did not happen within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} within {timeout_s:.0f} s"
        time.sleep(0.2)


def log_offsets(broker: BrokerProcess, topic: str) -> list[int]:
    """The offsets partition 0 of ``topic`` holds now, start to end, as a plain read_uncommitted consumer finds
    them: aborted records included; transaction markers, and what compaction or retention removed, not."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": f"peek-{secrets.token_hex(3)}",
                         "enable.partition.eof": True, "isolation.level": "read_uncommitted"})  # fmt: skip
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        found: list[int] = []
        while True:
            message = consumer.poll(10)
            assert message is not None, f"no answer reading {topic}"
            if message.error() is not None:
                return found
            found.append(message.offset())
    finally:
        consumer.close()


def stream_yaml(name: str, owner: str, producer: str, topic: str, consumers: list[str]) -> str:
    """One stream of a registry, at 100 % sampling: ``producer`` writes local/``topic``; ``consumers`` are the route's
    consumer entries as YAML flow mappings."""
    listed = "".join(f"\n        - {c}" for c in consumers)
    return (
        f"  {name}:\n    owner: {owner}\n    sampling_percent: 100\n    route:\n"
        f"      producers: [{{location: {producer}, writes: [local/{topic}]}}]\n      consumers:{listed}\n"
    )
