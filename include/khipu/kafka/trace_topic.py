"""Reading the trace topic from the beginning to its current end, and tallying what is there.

A record may be a batch of traces (and marks), one per line (:func:`khipu.trace.codec.split_record`): what is read
and tallied is each line, so the counts are of traces, not of records.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException

from khipu.kafka.log_end import NotReadToEnd, read_to_ends
from khipu.registry.model import Hop
from khipu.trace.codec import TraceDecodeError, decode_record, split_record
from khipu.trace.model import EmitterMark, Trace


class TraceTopicError(RuntimeError):
    """The trace topic could not be read."""


@dataclass(frozen=True, slots=True)
class TraceTally:
    """Traces per (hop id, type), emitter marks, and malformed records (lines of a batch record) per field."""

    by_hop: Counter[tuple[str, str]] = field(default_factory=Counter)
    malformed: Counter[str] = field(default_factory=Counter)
    marks: int = 0

    @property
    def total(self) -> int:
        return sum(self.by_hop.values())


def tally_traces(records: Iterable[Trace | EmitterMark | TraceDecodeError]) -> TraceTally:
    """Count decoded traces per hop and type, emitter marks, and decode errors per field."""
    by_hop: Counter[tuple[str, str]] = Counter()
    malformed: Counter[str] = Counter()
    marks = 0
    for item in records:
        if isinstance(item, TraceDecodeError):
            malformed[item.field] += 1
        elif isinstance(item, EmitterMark):
            marks += 1
        else:
            by_hop[(Hop.of_trace(item).id, item.type.value)] += 1
    return TraceTally(by_hop, malformed, marks)


def read_trace_topic(
    bootstrap_servers: str, topic: str, timeout_s: float = 30.0
) -> list[Trace | EmitterMark | TraceDecodeError]:
    """Every trace and mark of ``topic`` from its beginning to where it ended when asked, decoded (or the decode
    error): each line of a batch record in order, a record of one trace as itself. A live topic is read to an end
    too (:func:`khipu.kafka.log_end.read_to_ends`)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"khipu-reader-{secrets.token_hex(4)}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s)
        topic_meta = metadata.topics.get(topic)
        if topic_meta is None or topic_meta.error is not None or not topic_meta.partitions:
            reason = topic_meta.error.str() if topic_meta is not None and topic_meta.error else "no partitions"
            raise TraceTopicError(f"trace topic {topic!r} on {bootstrap_servers} cannot be read: {reason}")
        records: list[Trace | EmitterMark | TraceDecodeError] = []
        starts = dict.fromkeys(((topic, p) for p in topic_meta.partitions), OFFSET_BEGINNING)
        for message in read_to_ends(consumer, starts, timeout_s):
            for line in split_record(message.value()):
                try:
                    records.append(decode_record(line))
                except TraceDecodeError as exc:
                    records.append(exc)
        return records
    except NotReadToEnd as exc:
        raise TraceTopicError(f"reading {topic!r} on {bootstrap_servers}: {exc}") from None
    except KafkaException as exc:
        raise TraceTopicError(f"reading {topic!r} on {bootstrap_servers}: {exc.args[0].str()}") from None
    finally:
        consumer.close()
