"""One record at a time: reading it back from its log (how reconciliation names a message no trace identifies,
and where a resend finds its original), finding a record by a header, producing one and learning its offset;
and a log reader that tells what a consumer of either isolation level finds at an offset (:class:`LogReader`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from khipu.kafka.connection import KafkaConnection
from khipu.kafka.log_end import NotReadToEnd, read_to_ends

Headers = list[tuple[str, bytes | None]]


@dataclass(frozen=True, slots=True)
class StoredRecord:
    key: bytes | None
    value: bytes | None
    headers: Headers


def _reader(connection: KafkaConnection) -> Any:
    return Consumer(
        {
            **connection.client_config(),
            "group.id": "khipu-record-reader",  # required by the client; never used to commit
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
        }
    )


def _headers(message: Any) -> Headers:
    headers = message.headers() or []
    pairs = headers.items() if isinstance(headers, dict) else headers
    return [(name, value.encode() if isinstance(value, str) else value) for name, value in pairs]


def read_record(
    connection: KafkaConnection, topic: str, partition: int, offset: int, timeout_s: float = 10.0
) -> tuple[StoredRecord | None, str | None]:
    """The record at (topic, partition, offset): (record, None), or (None, why not) when the log no longer holds
    it (retention, truncation) or the cluster cannot be read. Reads without a group: nothing is committed."""
    consumer = _reader(connection)
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s)
        if not low <= offset < high:
            return None, f"offset {offset} is outside the log ({low} .. {high - 1}): retention or truncation removed it"
        consumer.assign([TopicPartition(topic, partition, offset)])
        message = consumer.poll(timeout_s)
        if message is None or message.error() is not None:
            reason = "no answer" if message is None else str(message.error())
            return None, f"the record at offset {offset} could not be read: {reason}"
        if message.offset() != offset:
            return None, f"offset {offset} holds no record (the next is {message.offset()}: a compacted log)"
        return StoredRecord(message.key(), message.value(), _headers(message)), None
    except KafkaException as exc:
        return None, f"cluster {connection.cluster!r} could not be read: {exc.args[0]}"
    finally:
        consumer.close()


def end_offset(connection: KafkaConnection, topic: str, partition: int, timeout_s: float = 10.0) -> int:
    """The partition's high watermark: the offset the next record written to it gets."""
    consumer = _reader(connection)
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s)[1])
    finally:
        consumer.close()


def log_start_offset(connection: KafkaConnection, topic: str, partition: int, timeout_s: float = 10.0) -> int:
    """The first offset the partition's log still holds (KafkaException when the cluster does not answer: an
    outage must never pass for a record that left the log)."""
    consumer = _reader(connection)
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s)[0])
    finally:
        consumer.close()


def partition_count(connection: KafkaConnection, topic: str, timeout_s: float = 10.0) -> int:
    """How many partitions ``topic`` has (KafkaException when the topic does not exist)."""
    consumer = _reader(connection)
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            reason = "no answer" if metadata is None else str(metadata.error or "no partitions")
            raise KafkaException(f"topic {topic!r} on cluster {connection.cluster!r}: {reason}")
        return len(metadata.partitions)
    finally:
        consumer.close()


def find_by_header(
    connection: KafkaConnection,
    topic: str,
    partition: int,
    from_offset: int,
    header: str,
    value: bytes,
    timeout_s: float = 30.0,
) -> int | None:
    """The offset of the first record at or after ``from_offset`` whose ``header`` is ``value``, reading up to the
    partition's current end; None when there is none."""
    consumer = _reader(connection)
    try:
        for message in read_to_ends(consumer, {(topic, partition): from_offset}, timeout_s):
            if (header, value) in _headers(message):
                return int(message.offset())
        return None
    except NotReadToEnd as exc:  # an outage must never pass for a record that is not there
        raise KafkaException(f"{topic}[{partition}] from {from_offset}: {exc}") from None
    finally:
        consumer.close()


def record_producer(connection: KafkaConnection) -> Any:
    """A producer for :func:`produce_record`: idempotent, acknowledged by every in-sync replica. Reusing one
    saves its start-up (about half a second here) on every record."""
    return Producer({**connection.client_config(), "acks": "all", "enable.idempotence": True, "linger.ms": 0})


def produce_record(
    connection: KafkaConnection,
    topic: str,
    partition: int,
    record: StoredRecord,
    timeout_s: float = 30.0,
    producer: Any = None,
) -> int:
    """Write ``record`` to (topic, partition), acknowledged by every in-sync replica; its offset. Waits for the
    acknowledgement (``producer``: one from :func:`record_producer` to reuse; default: a new one)."""
    producer = producer or record_producer(connection)
    landed: list[Any] = []
    headers: list[tuple[str, str | bytes | None]] = list(record.headers)
    producer.produce(
        topic,
        value=record.value,
        key=record.key,
        partition=partition,
        headers=headers,
        on_delivery=lambda error, message: landed.append(error or message),
    )
    producer.flush(timeout_s)
    if not landed:
        raise KafkaException(f"no delivery report for {topic}[{partition}] within {timeout_s:g} s")
    if not hasattr(landed[0], "offset"):
        raise KafkaException(landed[0])
    return int(landed[0].offset())


def record_headers(
    connection: KafkaConnection, topic: str, partition: int, offset: int, timeout_s: float = 10.0
) -> tuple[dict[str, bytes | None] | None, str | None]:
    """The headers of the record at (topic, partition, offset), or (None, why not): see :func:`read_record`."""
    record, why = read_record(connection, topic, partition, offset, timeout_s)
    return (None, why) if record is None else (dict(record.headers), None)


class Isolation(StrEnum):
    """A consumer's ``isolation.level``: read_committed skips records of aborted transactions and stops at the last
    stable offset; read_uncommitted returns every data record."""

    COMMITTED = "read_committed"
    UNCOMMITTED = "read_uncommitted"


@dataclass(frozen=True, slots=True)
class ReadRecord:
    offset: int
    key: bytes | None


class LogReader:
    """Reads a partition's records as a consumer of each isolation level would, without a group (nothing is
    committed): one long-lived consumer per level, assigned per read and tuned to answer in milliseconds
    (a fetch waits 10 ms, not 500). Not thread-safe; one per cluster and worker."""

    def __init__(self, connection: KafkaConnection, timeout_s: float = 10.0) -> None:
        self.connection, self.timeout_s = connection, timeout_s
        self._consumers: dict[Isolation, Any] = {}

    def _consumer(self, isolation: Isolation) -> Any:
        if isolation not in self._consumers:
            self._consumers[isolation] = Consumer(
                {
                    **self.connection.client_config(),
                    "group.id": "khipu-log-reader",  # required by the client; never used to commit
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    "auto.offset.reset": "earliest",
                    "isolation.level": isolation.value,
                    "fetch.wait.max.ms": 10,
                    "fetch.queue.backoff.ms": 0,
                    "queued.min.messages": 1,
                }
            )
        return self._consumers[isolation]

    def read(
        self, topic: str, partition: int, start: int, end: int, isolation: Isolation, limit: int = 500
    ) -> list[ReadRecord]:
        """The records of ``[start, end)`` (``end``: where the caller knows the log ends for this level: the high
        watermark, or the last stable offset for read_committed), at most ``limit`` of them, in order: the
        offsets the log holds there and that this isolation level sees. Raises KafkaException when the cluster
        does not answer within the timeout (an outage must never pass for a missing record)."""
        if start >= end:
            return []
        consumer = self._consumer(isolation)
        consumer.assign([TopicPartition(topic, partition, start)])
        found: list[ReadRecord] = []
        deadline = time.monotonic() + self.timeout_s
        try:
            while len(found) < limit:  # poll, not consume: consume waits for its count, past the partition's end
                remaining = deadline - time.monotonic()
                message = consumer.poll(min(remaining, 1.0)) if remaining > 0 else None
                if message is None:
                    if time.monotonic() < deadline:
                        continue
                    raise KafkaException(
                        f"no answer reading {topic}[{partition}] from {start} on {self.connection.describe()}"
                    )
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return found
                    raise KafkaException(error)
                if message.offset() >= end:
                    return found
                found.append(ReadRecord(int(message.offset()), message.key()))
                if message.offset() + 1 >= end:
                    return found
            return found
        finally:
            consumer.unassign()

    def close(self) -> None:
        for consumer in self._consumers.values():
            consumer.close()
        self._consumers.clear()
