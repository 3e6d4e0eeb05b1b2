"""Resent records as the topics hold them: how many copies of each message Khipu's resends put there."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException

from khipu.kafka.admin import Position
from khipu.kafka.connection import KafkaConnection
from khipu.kafka.log_end import read_to_ends
from khipu.tracing.headers import read_headers


def count_resent(connection: KafkaConnection, topics: Iterable[str], timeout_s: float = 60.0) -> Counter[str]:
    """Message id -> resent records of it in these topics, read from each partition's start to where it ended when
    asked (:func:`khipu.kafka.log_end.read_to_ends`, which raises NotReadToEnd past ``timeout_s``)."""
    reader = Consumer(
        {
            **connection.client_config(),
            "group.id": "khipu-resend-census",  # required by the client; never used to commit
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",  # records retention removes while reading: read on from the log's start
        }
    )
    copies: Counter[str] = Counter()
    try:
        starts: dict[Position, int] = {}
        for topic in topics:
            metadata = reader.list_topics(topic, timeout=10).topics.get(topic)
            if metadata is None or metadata.error is not None:
                raise KafkaException(f"topic {topic!r} cannot be read: {metadata.error if metadata else 'no answer'}")
            starts.update(dict.fromkeys(((topic, p) for p in metadata.partitions), OFFSET_BEGINNING))
        for message in read_to_ends(reader, starts, timeout_s):
            raw = message.headers() or []
            headers = list(raw.items()) if isinstance(raw, dict) else list(raw)
            context, mark = read_headers(headers)
            if mark is not None:
                copies[context.message_id if context is not None else "?"] += 1
    finally:
        reader.close()
    return copies
