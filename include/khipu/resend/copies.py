"""Resent records as the topics hold them: how many copies of each message Khipu's resends put there."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from khipu.kafka.connection import KafkaConnection
from khipu.tracing.headers import read_headers


def count_resent(connection: KafkaConnection, topics: Iterable[str], timeout_s: float = 60.0) -> Counter[str]:
    """Message id -> resent records of it in these topics, read from each partition's start to its end now."""
    reader = Consumer(
        {
            **connection.client_config(),
            "group.id": "khipu-resend-census",  # required by the client; never used to commit
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    copies: Counter[str] = Counter()
    try:
        wanted: list[TopicPartition] = []
        for topic in topics:
            metadata = reader.list_topics(topic, timeout=10).topics.get(topic)
            if metadata is None or metadata.error is not None:
                raise KafkaException(f"topic {topic!r} cannot be read: {metadata.error if metadata else 'no answer'}")
            for partition in metadata.partitions:
                low, high = reader.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
                if high > low:
                    wanted.append(TopicPartition(topic, partition, OFFSET_BEGINNING))
        reader.assign(wanted)
        open_partitions = {(tp.topic, tp.partition) for tp in wanted}
        deadline = time.monotonic() + timeout_s
        while open_partitions:
            if time.monotonic() > deadline:
                raise KafkaException(f"{len(open_partitions)} partitions not read to their end in {timeout_s:g} s")
            message = reader.poll(1.0)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(error)
                open_partitions.discard((message.topic(), message.partition()))  # read to its end
                continue
            raw = message.headers() or []
            headers = list(raw.items()) if isinstance(raw, dict) else list(raw)
            context, mark = read_headers(headers)
            if mark is not None:
                copies[context.message_id if context is not None else "?"] += 1
    finally:
        reader.close()
    return copies
