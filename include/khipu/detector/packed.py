"""Records and verdicts cross Spark packed: one Arrow IPC blob per bucket, not one Spark row per record.

Every Spark row costs the JVM twice (into its row format, then into Arrow for Python or the driver), and PySpark
4.2's ``transformWithStateInPandas`` builds each key's input frame from row tuples, one Python object per value.
So the detector packs: where it decodes them (:class:`khipu.detector.parse.RecordDecoder`, Spark's
``mapInArrow``), each task's records are cut by bucket (:func:`by_bucket`) and each bucket's rows written as one
blob (:data:`PACKED_SCHEMA`). The shuffle, the processor's input, the processor's verdicts and the writer's collect
then move a few rows a bucket and batch, and both ends read them with :func:`unpack` as the Arrow tables they were.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from khipu.trace.archive import SCHEMA as ARCHIVED_TRACE
from khipu.trace.archive import spark_ddl

RECORDS, JUDGED = "records", "judged"  # a packed row's kind: a bucket's records, or one evaluation of a bucket

# every decoded line of the trace topic (khipu.detector.parse.RecordDecoder): its bucket and kind, a trace's
# columns as the archive keeps them, its hop, and where the record came from; lists as text, as the writer reads them
RECORD_FIELDS = pa.schema(
    [
        ("bucket", pa.int32()),
        ("kind", pa.string()),
        *(field for field in ARCHIVED_TRACE if field.name not in ("prev_offsets", "kafka_timestamp_ms")),
        ("hop", pa.int32()),
        ("prev_offsets", pa.string()),
        ("received", pa.string()),
        ("raw_value", pa.binary()),
        ("source_topic", pa.string()),
        ("source_partition", pa.int32()),
        ("source_offset", pa.int64()),
        ("source_line", pa.int32()),
        ("kafka_timestamp_ms", pa.int64()),
    ]
)
# a packed row: records of one bucket (kind ``records``: RECORD_FIELDS in ``blob``), or one evaluation of a bucket
# (kind ``judged``: its verdicts in ``blob``, khipu.detector.bucket.VERDICT_FIELDS, null when none; its messages in
# flight and state bytes; the asks its lookups made that a cluster did not answer, :func:`unanswered_text`)
PACKED_FIELDS = pa.schema(
    [
        ("bucket", pa.int32()),
        ("kind", pa.string()),
        ("blob", pa.binary()),
        ("in_flight", pa.int64()),
        ("state_bytes", pa.int64()),
        ("unanswered", pa.string()),
    ]
)
PACKED_SCHEMA = spark_ddl(PACKED_FIELDS)
PACK_ROWS = 65_536  # records a task gathers before it packs them: fewer, larger blobs, a bounded memory


def ipc_bytes(table: pa.Table) -> bytes:
    """The table as one Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def unpack(blobs: Iterable[bytes | None] | pa.ChunkedArray, schema: pa.Schema) -> pa.Table:
    """The rows of these blobs (bytes, or a binary column: read in place) as one table of ``schema`` (empty:
    none), a chunk per blob."""
    if isinstance(blobs, pa.ChunkedArray):
        buffers = [scalar.as_buffer() for scalar in blobs if scalar.is_valid]
    else:
        buffers = [pa.py_buffer(b) for b in blobs if b]
    tables = [ipc.open_stream(buffer).read_all() for buffer in buffers]
    if not tables:
        return schema.empty_table()
    return pa.concat_tables(tables).cast(schema)  # a chunk per blob: the reader combines what it keeps


def by_bucket(table: pa.Table, kind: str) -> pa.RecordBatch:
    """The table cut by its ``bucket`` column: one row of :data:`PACKED_FIELDS` per bucket, its rows one blob."""
    ordered = table.sort_by("bucket")
    column = ordered.column("bucket").to_numpy()
    starts = np.flatnonzero(np.r_[True, column[1:] != column[:-1]]) if len(column) else np.array([], np.int64)
    ends = np.r_[starts[1:], len(column)]
    blobs = [ipc_bytes(ordered.slice(int(start), int(end - start))) for start, end in zip(starts, ends, strict=True)]
    n = len(blobs)
    columns = [pa.array(column[starts], pa.int32()), pa.array([kind] * n), pa.array(blobs, pa.binary())]
    return pa.RecordBatch.from_arrays(
        [*columns, pa.nulls(n, pa.int64()), pa.nulls(n, pa.int64()), pa.nulls(n, pa.string())], schema=PACKED_FIELDS
    )


def unanswered_text(asks: Mapping[str, int]) -> str | None:
    """An evaluation's unanswered asks per cluster as its judged row carries them (JSON); None: every ask answered."""
    return json.dumps(dict(sorted(asks.items()))) if asks else None


def unanswered_asks(texts: Iterable[str | None]) -> dict[str, int]:
    """The unanswered asks per cluster of judged rows (:func:`unanswered_text`), summed."""
    total: dict[str, int] = {}
    for text in texts:
        for cluster, count in json.loads(text).items() if text else ():
            total[cluster] = total.get(cluster, 0) + int(count)
    return total
