"""From Kafka-source rows (Spark's Kafka schema) to trace rows, and malformed records to quarantine.

Shared by both sources (``khipu_kafka`` here, Spark's ``kafka`` where a cluster has the JVM
connector): each record's value is decoded by the same strict codec applications use
(:func:`khipu.trace.decode_trace`), so "valid" means the same everywhere. A record that is not a
valid trace, or names a stream the registry does not define, goes to the quarantine with the
reason and its raw bytes; the query keeps running.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from khipu.trace.codec import TraceDecodeError, decode_record
from khipu.trace.model import EmitterMark

TRACE_COLUMNS = (
    "message_id string, stream string, location string, cluster string, type string, timestamp_ms long, "
    "topic string, partition int, offset long, `group` string, emitter_id string, emitter_seq long, "
    "sampling_percent double, attributes string"
)
POINTER_COLUMNS = "prev_offsets array<long>, received string"  # back-pointers; a mark's list, as JSON
PARSED_SCHEMA = (
    f"{TRACE_COLUMNS}, {POINTER_COLUMNS}, quarantine_reason string, raw_value binary, source_topic string, "
    "source_partition int, source_offset long, kafka_timestamp_ms long"
)
_TRACE_FIELDS = [part.split()[0].strip("`") for part in TRACE_COLUMNS.split(", ")]
_POINTER_FIELDS = [part.split()[0] for part in POINTER_COLUMNS.split(", ")]
_POSITION = ["location", "cluster", "topic", "partition", "offset"]
_RECEIVED_KEYS = ("cluster", "topic", "partition", "offset")
_RECEIVED_SCHEMA = "array<struct<cluster:string, topic:string, partition:int, offset:long>>"


def decode_rows(frames: Iterable[pd.DataFrame], known_streams: frozenset[str]) -> Iterator[pd.DataFrame]:
    """mapInPandas body: decode every value; fill the trace columns or the quarantine reason."""
    known = ", ".join(sorted(known_streams)) or "none"
    for frame in frames:
        rows: list[dict[str, Any]] = []
        for value, topic, partition, offset, timestamp in zip(
            frame["value"], frame["topic"], frame["partition"], frame["offset"], frame["timestamp"], strict=True
        ):
            row: dict[str, Any] = dict.fromkeys([*_TRACE_FIELDS, *_POINTER_FIELDS, "quarantine_reason"])
            raw = bytes(value) if value is not None else None
            try:
                record = decode_record(raw)
            except TraceDecodeError as exc:
                row["quarantine_reason"] = str(exc)
            else:
                if isinstance(record, EmitterMark):
                    row.update(
                        type="MARK",
                        location=record.location,
                        emitter_id=record.emitter_id,
                        emitter_seq=record.emitter_seq,
                        timestamp_ms=record.timestamp_ms,
                        received=_received_json(record),
                    )
                elif record.stream not in known_streams:
                    row["quarantine_reason"] = f"unknown stream {record.stream!r}; the registry defines: {known}"
                else:
                    row.update(
                        message_id=record.message_id,
                        stream=record.stream,
                        location=record.location,
                        cluster=record.cluster,
                        type=record.type.value,
                        timestamp_ms=record.timestamp_ms,
                        topic=record.topic,
                        partition=record.partition,
                        offset=record.offset,
                        group=record.group,
                        emitter_id=record.emitter_id,
                        emitter_seq=record.emitter_seq,
                        sampling_percent=record.sampling_percent,
                        attributes=json.dumps(dict(record.attributes)) if record.attributes else None,
                        prev_offsets=list(record.prev_offsets) if record.prev_offsets else None,
                    )
            row.update(
                raw_value=raw if row.get("quarantine_reason") else None,
                source_topic=topic,
                source_partition=int(partition),
                source_offset=int(offset),
                kafka_timestamp_ms=int(pd.Timestamp(timestamp).value // 1_000_000)
                if timestamp is not None and not pd.isna(timestamp)
                else None,
            )
            rows.append(row)
        yield pd.DataFrame(
            rows,
            columns=[
                *_TRACE_FIELDS,
                *_POINTER_FIELDS,
                "quarantine_reason",
                "raw_value",
                "source_topic",
                "source_partition",
                "source_offset",
                "kafka_timestamp_ms",
            ],
        )


def _received_json(mark: EmitterMark) -> str | None:
    if not mark.received:
        return None
    return json.dumps([dict(zip(_RECEIVED_KEYS, entry, strict=True)) for entry in mark.received])


def parse_traces(kafka_rows: DataFrame, known_streams: Iterable[str]) -> DataFrame:
    """Decode a DataFrame of Spark's Kafka schema; split it with :func:`valid` / :func:`quarantined`."""
    streams = frozenset(known_streams)
    return kafka_rows.select("value", "topic", "partition", "offset", "timestamp").mapInPandas(
        lambda frames: decode_rows(frames, streams), PARSED_SCHEMA
    )


def valid(parsed: DataFrame) -> DataFrame:
    """The traces (emitter marks left out)."""
    return parsed.where("quarantine_reason IS NULL AND type <> 'MARK'").select(*[f"`{name}`" for name in _TRACE_FIELDS])


def archived(parsed: DataFrame) -> DataFrame:
    """The traces with their back-pointers: what the raw-trace archive keeps."""
    return parsed.where("quarantine_reason IS NULL AND type <> 'MARK'").select(
        *[f"`{name}`" for name in _TRACE_FIELDS], "prev_offsets"
    )


def sequences(parsed: DataFrame) -> DataFrame:
    """Every emitter sequence number seen, from traces and marks: (emitter id, location, number, time)."""
    return parsed.where("quarantine_reason IS NULL").select("emitter_id", "location", "emitter_seq", "timestamp_ms")


def pointers(parsed: DataFrame) -> DataFrame:
    """Positions an emitter says it received whose RECEIVED trace is not in this batch.

    (location, cluster, topic, partition, offset), from the back-pointers of RECEIVED traces and
    the ``received`` lists of emitter marks. A position pointed at whose trace never arrives was
    received, and only its trace was lost.
    """
    ok = parsed.where("quarantine_reason IS NULL")
    back = ok.where("type = 'RECEIVED' AND prev_offsets IS NOT NULL").select(
        "location", "cluster", "topic", "partition", F.explode("prev_offsets").alias("offset")
    )
    marked = (
        ok.where("type = 'MARK' AND received IS NOT NULL")
        .select("location", F.explode(F.from_json("received", _RECEIVED_SCHEMA)).alias("entry"))
        .select("location", "entry.cluster", "entry.topic", "entry.partition", "entry.offset")
    )
    traced = ok.where("type = 'RECEIVED'").select(*_POSITION)
    return back.unionByName(marked).distinct().join(traced, on=_POSITION, how="left_anti")


def quarantined(parsed: DataFrame) -> DataFrame:
    return parsed.where("quarantine_reason IS NOT NULL").select(
        "quarantine_reason", "raw_value", "source_topic", "source_partition", "source_offset", "kafka_timestamp_ms"
    )
