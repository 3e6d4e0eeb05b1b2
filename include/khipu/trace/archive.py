"""The raw-trace archive: Parquet by UTC hour and micro-batch, written by the detector, read outside Spark too.

Layout: ``<archive>/hour=YYYY-MM-DD-HH/batch_id=N/part-0.parquet`` (hour: when the trace reached the trace topic,
the broker's time on Khipu's LogAppendTime trace topic, never an application's: a SENT trace's own time is its
record's timestamp, which an application may set to any event time; archives written before the column existed
used the trace's own time), the
columns of :data:`SCHEMA`; reconciliation reads it with Spark (partition discovery gives ``hour`` and
``batch_id``). The view, the API and ``khipu trace`` ask for the traces of a few messages; they know roughly
when (from the verdicts' first-seen and decision times), so only those hours' folders are opened.

Once an hour is closed, the retention DAG compacts it (:mod:`khipu.storage.compaction`): its micro-batch folders
become ``hour=…/batch_id=-2/part-<generation>-<b>-of-<P>.parquet``, files of about ``KHIPU_ARCHIVE_FILE_MIB``
bucketed by message id, in the order :data:`COMPACTION` says; a read of a few messages opens only their buckets'.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from khipu.storage import compaction
from khipu.storage.batches import write_batch_files
from khipu.storage.location import Location
from khipu.storage.parquet import parquet_bytes

HOUR_MS = 3_600_000
COLUMNS = (
    "message_id",
    "stream",
    "type",
    "location",
    "cluster",
    "topic",
    "partition",
    "offset",
    "group",
    "timestamp_ms",
    "emitter_id",
    "emitter_seq",
    "attributes",
)


# an archived trace: the decoded trace columns and its back-pointers (as Spark wrote them before: same types)
SCHEMA = pa.schema(
    [
        ("message_id", pa.string()),
        ("stream", pa.string()),
        ("location", pa.string()),
        ("cluster", pa.string()),
        ("type", pa.string()),
        ("timestamp_ms", pa.int64()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("group", pa.string()),
        ("emitter_id", pa.string()),
        ("emitter_seq", pa.int64()),
        ("sampling_percent", pa.float64()),
        ("attributes", pa.string()),
        ("prev_offsets", pa.list_(pa.int64())),
        # format version 3 (null in what was archived before it: no key hash, every flag false)
        ("key_hash", pa.string()),
        ("tombstone", pa.bool_()),
        ("transactional", pa.bool_()),
        ("read_uncommitted", pa.bool_()),
        # when the trace record reached the trace topic (its Kafka timestamp: the broker's, on Khipu's trace topic);
        # null in what was archived before it
        ("kafka_timestamp_ms", pa.int64()),
    ]
)

# When a trace arrived: the first of these columns that is set (the trace topic's timestamp; older archives: its own)
ARRIVED = ("kafka_timestamp_ms", "timestamp_ms")

# A compacted hour (khipu.storage.compaction): its traces as the micro-batches held them, batch after batch, as they
# were read (sorted by message id, neighbouring rows' positions and times are unrelated: 20-45 % more bytes,
# bench/compaction.py), in the Parquet writer's default row groups; a few messages' traces (read_traces) are in one
# file of the hour
COMPACTION = compaction.CompactionSpec(
    "trace archive",
    SCHEMA,
    sort_by=(),
    row_group_rows=1_048_576,
    probe=("message_id", "emitter_seq", "offset", "timestamp_ms"),
)


_SPARK_TYPES = {
    "string": "string",
    "int32": "int",
    "int64": "bigint",
    "bool": "boolean",
    "double": "double",
    "binary": "binary",
    "list<item: int64>": "array<bigint>",
}


def spark_ddl(schema: pa.Schema) -> str:
    """An Arrow schema as Spark DDL: the Spark types whose Arrow conversion gives exactly these back."""
    return ", ".join(f"`{field.name}` {_SPARK_TYPES[str(field.type)]}" for field in schema)


def spark_schema() -> str:
    """:data:`SCHEMA` as a Spark DDL schema: the archive read with it whatever its older files hold (a column a
    file lacks reads as null)."""
    return spark_ddl(SCHEMA)


def write_batch(archive: Location | Path, batch_id: int, traces: pa.Table) -> list[str]:
    """Archive a micro-batch's traces (:data:`SCHEMA`'s columns): one file per UTC hour of their times, committed
    by :func:`khipu.storage.batches.write_batch_files` (a replayed batch replaces its earlier attempt's files, on
    a local folder or an object store). Returns the hours written."""
    root = Location.of(archive, "archive")
    files: dict[str, bytes] = {}
    written = []
    if traces.num_rows:
        traces = traces.select(SCHEMA.names).cast(SCHEMA)
        arrived = pc.coalesce(*(traces.column(name) for name in ARRIVED))
        hours = pc.divide(arrived, HOUR_MS)  # whole hours since the epoch
        for hour in sorted(pc.unique(hours).to_pylist()):
            name = f"{hour_folder(int(hour) * HOUR_MS)}/batch_id={batch_id}/part-0.parquet"
            files[name] = parquet_bytes(traces.filter(pc.equal(hours, hour)))
            written.append(hour_of(int(hour) * HOUR_MS))
    write_batch_files(root, batch_id, files)
    return written


@dataclass(frozen=True, slots=True)
class ArchivedTrace:
    message_id: str
    stream: str
    type: str  # SENT | RECEIVED
    location: str
    cluster: str
    topic: str
    partition: int | None
    offset: int | None
    group: str | None
    timestamp_ms: int
    emitter_id: str
    emitter_seq: int | None
    attributes: dict[str, str]


def hour_of(ms: int) -> str:
    """The archive's hour partition of a time (UTC): ``2026-11-23-10``."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d-%H")


def hour_start_ms(hour: str) -> int:
    """When an archive hour (``2026-11-23-10``, UTC) starts, in ms since the epoch."""
    return int(datetime.strptime(hour, "%Y-%m-%d-%H").replace(tzinfo=UTC).timestamp() * 1000)


def hour_folder(at_ms: int) -> str:
    """The archive's partition folder name of the UTC hour holding ``at_ms`` (``hour=2026-11-23-16``)."""
    return f"hour={hour_of(at_ms)}"


def hours_between(from_ms: int, to_ms: int) -> range:
    """The hours (ms // HOUR_MS) from the one holding ``from_ms`` to the one holding ``to_ms``, both included."""
    return range(from_ms // HOUR_MS, to_ms // HOUR_MS + 1)


def read_traces(
    archive: Location | Path, message_ids: Collection[str], from_ms: int, to_ms: int
) -> list[ArchivedTrace]:
    """Every archived trace of these messages in the hours from ``from_ms`` to ``to_ms`` (both included),
    oldest first. An archive or hour that does not exist holds nothing."""
    return read_traces_in_hours(archive, message_ids, hours_between(from_ms, to_ms))


def read_traces_in_hours(
    archive: Location | Path, message_ids: Collection[str], hours: Iterable[int]
) -> list[ArchivedTrace]:
    """Every archived trace of these messages in these hours (ms // HOUR_MS), oldest first."""
    if not message_ids:
        return []
    root = Location.of(archive, "archive")
    wanted = {hour_folder(hour * HOUR_MS) for hour in hours}
    files = compaction.select_parts(
        (path for folder in root.child_folders("hour=") if folder in wanted for path in (root / folder).files(True)),
        message_ids,
    )  # of a compacted hour, only the files of these messages' buckets
    if not files:
        return []
    dataset = ds.dataset(files, schema=SCHEMA, format="parquet", filesystem=root.filesystem())
    table = dataset.to_table(columns=list(COLUMNS), filter=ds.field("message_id").isin(sorted(set(message_ids))))
    rows = sorted(table.to_pylist(), key=lambda r: (r["timestamp_ms"], r["emitter_id"], r["emitter_seq"] or 0))
    seen: set[tuple[Any, ...]] = set()
    traces: list[ArchivedTrace] = []
    for row in rows:
        key = (row["emitter_id"], row["emitter_seq"], row["message_id"], row["type"], row["offset"])
        if key in seen:  # a replayed batch archived twice under two batch ids: one trace
            continue
        seen.add(key)
        traces.append(
            ArchivedTrace(
                message_id=row["message_id"],
                stream=row["stream"],
                type=row["type"],
                location=row["location"],
                cluster=row["cluster"],
                topic=row["topic"],
                partition=row["partition"],
                offset=row["offset"],
                group=row["group"],
                timestamp_ms=int(row["timestamp_ms"]),
                emitter_id=row["emitter_id"],
                emitter_seq=row["emitter_seq"],
                attributes=_attributes(row["attributes"]),
            )
        )
    return traces


def _attributes(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}
