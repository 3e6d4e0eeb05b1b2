"""What a micro-batch's records say of the trace channel, computed on the driver over the batch as one Arrow table.

Every record of the trace topic reaches the writer beside the processor's verdicts, packed by bucket
(:func:`khipu.detector.job.judged_and_records`); the writer collects and unpacks them once, and this module
reads them with pyarrow (no Python per record):

- :func:`pointers`: positions an emitter says it received — the back-pointers of RECEIVED traces and the
  ``received`` lists of emitter marks — whose own RECEIVED trace is not in the batch (what tells a lost
  trace from a lost message; :meth:`khipu.store.channel.TraceChannelRepository.record_pointers`);
- :func:`sequence_numbers`: every emitter sequence number seen (its gaps are traces the emitter lost);
- :func:`newest_read`: per trace-topic partition, the newest record time read (:mod:`khipu.detector.clock`);
- :func:`malformed`: the records (lines of batch records) the detector's decoder rejected, with where they sat.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from khipu.detector.gaps import EmitterBatch, batches_of_columns

TRACE, MARK, MALFORMED = "trace", "mark", "malformed"  # a record's kind

POSITION = ("location", "cluster", "topic", "partition", "offset")
POSITION_SCHEMA = pa.schema(
    [("location", pa.string()), ("cluster", pa.string()), ("topic", pa.string()), ("partition", pa.int32()),
     ("offset", pa.int64())]
)  # fmt: skip


def _of_kind(records: pa.Table, kind: str) -> pa.Table:
    return records.filter(pc.equal(records.column("kind"), kind))


def pointers(records: pa.Table) -> list[tuple[str, str, str, int, int]]:
    """(location, cluster, topic, partition, offset) an emitter says it received, whose RECEIVED trace is not in
    the batch; each once."""
    traces = _of_kind(records, TRACE)
    received = traces.filter(pc.equal(traces.column("type"), "RECEIVED"))
    back = received.filter(pc.is_valid(received.column("prev_offsets")))
    lists = pc.split_pattern(back.column("prev_offsets"), ",")
    parents = pc.list_parent_indices(lists)
    flat = pc.list_flatten(lists)
    kept = pc.not_equal(flat, "")
    pointed = [
        pa.table(
            {
                "location": pc.take(back.column("location"), parents).filter(kept),
                "cluster": pc.take(back.column("cluster"), parents).filter(kept),
                "topic": pc.take(back.column("topic"), parents).filter(kept),
                "partition": pc.take(back.column("partition"), parents).filter(kept).cast(pa.int32()),
                "offset": flat.filter(kept).cast(pa.int64()),
            },
            schema=POSITION_SCHEMA,
        )
    ]
    marks = _of_kind(records, MARK)
    marked: list[dict[str, Any]] = []
    for location, entries in zip(
        marks.column("location").to_pylist(), marks.column("received").to_pylist(), strict=True
    ):
        for entry in json.loads(entries) if entries else []:  # few: an emitter's mark every few seconds
            marked.append({"location": location, **{name: entry[name] for name in POSITION[1:]}})
    if marked:
        pointed.append(pa.Table.from_pylist(marked, schema=POSITION_SCHEMA))
    everything = pa.concat_tables(pointed)
    if not everything.num_rows:
        return []
    distinct = everything.group_by(list(POSITION)).aggregate([])
    traced = received.select(list(POSITION)).cast(POSITION_SCHEMA)
    missing = distinct.join(traced, keys=list(POSITION), join_type="left anti")
    return [tuple(row.values()) for row in missing.to_pylist()]  # type: ignore[misc]


def sequence_numbers(records: pa.Table) -> dict[str, EmitterBatch]:
    """Every emitter's sequence numbers in the batch, from its traces and marks, each with the time its record
    was written to the trace topic (the clock :mod:`khipu.detector.clock` reads the topic by, which tells when
    a gap is settled; the trace's own time where the record has none)."""
    numbered = records.filter(pc.not_equal(records.column("kind"), MALFORMED))
    written = pc.coalesce(numbered.column("kafka_timestamp_ms"), numbered.column("timestamp_ms"))
    return batches_of_columns(
        numbered.column("emitter_id").to_numpy(zero_copy_only=False),
        numbered.column("location").to_numpy(zero_copy_only=False),
        numbered.column("emitter_seq").to_numpy(),
        written.to_numpy(zero_copy_only=False),
    )


def newest_read(records: pa.Table) -> dict[int, int]:
    """Per trace-topic partition, the newest record time (Kafka timestamp) in the batch."""
    rows = records.select(["source_partition", "kafka_timestamp_ms"]).filter(
        pc.is_valid(records.column("source_partition"))
    )
    if not rows.num_rows:
        return {}
    newest = rows.group_by("source_partition").aggregate([("kafka_timestamp_ms", "max")])
    return {
        int(p): int(t)
        for p, t in zip(
            newest.column("source_partition").to_pylist(),
            newest.column("kafka_timestamp_ms_max").to_pylist(),
            strict=True,
        )
        if t is not None
    }


def malformed(records: pa.Table) -> list[dict[str, Any]]:
    """The malformed records: raw bytes and where they sat (topic, partition, offset, and line of a batch record)."""
    bad = _of_kind(records, MALFORMED)
    columns = ["raw_value", "source_topic", "source_partition", "source_offset", "source_line", "kafka_timestamp_ms"]
    found: list[dict[str, Any]] = bad.select(columns).to_pylist()
    return found
