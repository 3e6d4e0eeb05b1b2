"""Small helpers shared by integration tests."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Message

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
