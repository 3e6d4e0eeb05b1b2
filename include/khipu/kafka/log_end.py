"""Reading partitions from where a consumer is assigned to where they ended when asked: a snapshot of a live log.

Where a partition ends is asked for before reading (its last stable offset for a read_committed consumer,
librdkafka's default), and each partition is paused once read to there. End-of-partition alone is not enough:
librdkafka reports it only when a fetch comes back empty, and a partition written more often than a fetch waits
(``fetch.wait.max.ms``, 500 ms by default) may never do that. It still ends a partition whose last records before
its end are aborted records or transaction markers, which no record read from it reaches.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from khipu.kafka.admin import Position


class NotReadToEnd(RuntimeError):
    """Partitions were not read to where they ended within the time given, or their log could not be read."""


def read_to_ends(consumer: Any, starts: Mapping[Position, int], timeout_s: float) -> Iterator[Any]:
    """Each record of these partitions from their start (an offset, or ``OFFSET_BEGINNING``) to where they ended
    when this was called, in order within a partition, as ``consumer`` (assigned here; ``enable.partition.eof`` on)
    finds them; the caller may stop early. Partitions with nothing from their start to their end are not read.
    Raises :class:`NotReadToEnd` naming the partitions left, and the ends asked for, when
    ``timeout_s`` passes first, and naming the error when the log answers with one."""
    deadline = time.monotonic() + timeout_s
    ends: dict[Position, int] = {}
    for (topic, partition), start in sorted(starts.items()):
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=max(deadline - time.monotonic(), 0.1), cached=False
            )
        except KafkaException as exc:
            raise NotReadToEnd(f"where {topic}[{partition}] ends could not be asked: {exc.args[0].str()}") from None
        if high > max(low, start):
            ends[(topic, partition)] = high
    consumer.assign([TopicPartition(topic, partition, starts[(topic, partition)]) for topic, partition in ends])
    at_end: set[Position] = set()

    def reached(position: Position) -> None:
        at_end.add(position)
        consumer.pause([TopicPartition(*position)])

    while len(at_end) < len(ends):
        if time.monotonic() > deadline:
            left = {f"{t}[{p}]": ends[(t, p)] for t, p in sorted(set(ends) - at_end)}
            raise NotReadToEnd(f"partitions {sorted(left)} not read to their end within {timeout_s:g}s (ends: {left})")
        for message in consumer.consume(1000, 0.5):
            error, position, offset = message.error(), (message.topic(), message.partition()), message.offset()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF and position in ends:
                    if offset is None or offset >= ends[position]:  # a replica behind may report an earlier end
                        reached(position)
                    continue
                where = f" {position[0]}[{position[1]}]" if position[1] is not None else ""
                raise NotReadToEnd(f"reading{where}: {error.str()}")
            if position in at_end or position not in ends or offset is None:
                continue  # a partition already read to its end
            if offset >= ends[position]:
                reached(position)  # written after the ends were asked for
                continue
            yield message
            if offset + 1 >= ends[position]:
                reached(position)
