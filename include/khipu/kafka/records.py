"""Reading one record back from its log: how reconciliation names a message no trace identifies."""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaException, TopicPartition

from khipu.kafka.connection import KafkaConnection


def record_headers(
    connection: KafkaConnection, topic: str, partition: int, offset: int, timeout_s: float = 10.0
) -> tuple[dict[str, bytes | None] | None, str | None]:
    """The headers of the record at (topic, partition, offset): (headers, None), or (None, why not) when the
    log no longer holds it (retention, truncation) or the cluster cannot be read. Reads without a group:
    nothing is committed anywhere."""
    consumer = Consumer(
        {
            **connection.client_config(),
            "group.id": "khipu-record-reader",  # required by the client; never used to commit
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
        }
    )
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
        headers = message.headers() or []
        pairs = headers.items() if isinstance(headers, dict) else headers
        return {name: value.encode() if isinstance(value, str) else value for name, value in pairs}, None
    except KafkaException as exc:
        return None, f"cluster {connection.cluster!r} could not be read: {exc.args[0]}"
    finally:
        consumer.close()
