"""The trace record as an immutable value."""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any, NamedTuple


class TraceType(StrEnum):
    """SENT is emitted after the broker acknowledged a write; RECEIVED when a consumer got a record."""

    SENT = "SENT"
    RECEIVED = "RECEIVED"


NO_ATTRIBUTES: Mapping[str, str] = MappingProxyType({})


class EmitterMark(NamedTuple):
    """An emitter's "I am at sequence number N, and this is where I last received" (the number is
    taken from the same sequence as its traces).

    Emitters publish one every few seconds while they have traffic and for ``mark_memory_s``
    after, and on close. ``received`` lists, per partition received from within that memory,
    the offset of its newest RECEIVED trace: a trace lost just before a quiet spell is still
    pointed at (see :attr:`Trace.prev_offsets`)."""

    emitter_id: str
    location: str
    emitter_seq: int
    timestamp_ms: int
    received: tuple[tuple[str, str, int, int], ...] = ()  # (cluster, topic, partition, offset), a few per partition


class Trace(NamedTuple):
    """One knot on the cord: a traced message seen at one hop.

    ``group`` is the consumer group for RECEIVED traces and ``None`` for SENT traces. ``timestamp_ms`` is,
    for a SENT trace, the record's own timestamp from the broker's acknowledgement (CreateTime or
    LogAppendTime, as the topic keeps it), and for a RECEIVED trace when the consumer got the record.
    ``emitter_id`` + ``emitter_seq`` number every trace an emitter produced, so a gap in the
    sequence tells a lost trace apart from a lost message. A RECEIVED trace points back, with
    ``prev_offsets``, to the emitter's previous few RECEIVED traces on the same partition (newest
    first): a record pointed at whose trace never arrived was received, and only its trace was
    lost; a record no trace points at was never received. (A few, not one: so that a run of lost
    traces is still pointed at by the next trace that arrives.) (A NamedTuple rather than a frozen
    dataclass: traces are built on the application's hot path, where this is 4x cheaper.)
    """

    message_id: str
    stream: str
    location: str
    cluster: str
    type: TraceType
    timestamp_ms: int
    topic: str
    partition: int
    offset: int
    group: str | None
    emitter_id: str
    emitter_seq: int
    sampling_percent: float
    attributes: Mapping[str, str] = NO_ATTRIBUTES
    prev_offsets: tuple[int, ...] = ()  # RECEIVED: offsets of this emitter's previous RECEIVED traces here
    # version 3: what Kafka's own semantics need of the record (docs/trace-format.md)
    key_hash: str | None = None  # SENT: the short hash of the record's key (trace.keys.key_hash), None: no key
    tombstone: bool = False  # SENT: the record's value is null (a delete marker on a compacted topic)
    transactional: bool = False  # SENT: written by a transactional producer (its transaction may abort)
    read_uncommitted: bool = False  # RECEIVED: the group reads with isolation.level=read_uncommitted


def trace_columns(trace: Trace) -> dict[str, Any]:
    """A trace as decoded columns, as :func:`trace_from_columns` reads them: ``type`` as text, ``attributes`` as
    JSON text (its keys sorted; null when there are none)."""
    columns = trace._asdict()
    columns["type"] = trace.type.value
    attributes = dict(trace.attributes)
    columns["attributes"] = (
        json.dumps(attributes, separators=(",", ":"), ensure_ascii=False, sort_keys=True) if attributes else None
    )
    return columns


def trace_from_columns(values: Mapping[str, Any]) -> Trace:
    """A trace from decoded columns (a Spark row, an Arrow or pandas row as a mapping; ``attributes`` as JSON
    text; the version-3 columns may be absent or null, as in what was archived before them)."""
    raw = values.get("attributes")
    attributes = json.loads(raw) if isinstance(raw, str) and raw else NO_ATTRIBUTES
    group = values.get("group")
    key_hash = values.get("key_hash")
    return Trace(
        str(values["message_id"]),
        str(values["stream"]),
        str(values["location"]),
        str(values["cluster"]),
        TraceType(values["type"]),
        int(values["timestamp_ms"]),
        str(values["topic"]),
        int(values["partition"]),
        int(values["offset"]),
        group if isinstance(group, str) else None,  # None, or pandas' NaN for a missing group
        str(values["emitter_id"]),
        int(values["emitter_seq"]),
        float(values["sampling_percent"]),
        attributes,
        key_hash=key_hash if isinstance(key_hash, str) else None,
        tombstone=values.get("tombstone") is True,
        transactional=values.get("transactional") is True,
        read_uncommitted=values.get("read_uncommitted") is True,
    )
