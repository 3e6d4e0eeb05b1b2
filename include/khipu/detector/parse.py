"""From Kafka-source rows to the detector's records, decoded in Python and packed by bucket; malformed lines kept
for the quarantine.

The JVM only reads the trace topic: each Kafka record's value and position reach :class:`RecordDecoder` (Spark's
``mapInArrow``) as Arrow. There every record is split into its lines (a record may be a batch of traces and marks,
``khipu.trace.codec.split_record``; a record of one trace is its line 0), each line is decoded, and the records are
packed by bucket (:mod:`khipu.detector.packed`) for the one shuffle. Two ways, one meaning:

- **a trace exactly as an encoder writes it** (``khipu.trace.codec.encode_trace``, and the JVM interceptors' byte
  for byte, vectors/): every such line of a batch at once, in Arrow's C++: one regular expression
  (:data:`ENCODER_TEMPLATE`, RE2) checks its shape, Arrow's JSON reader reads its fields with their JSON types, and
  vectorised checks hold each value to the codec's ranges. The path is only ever *stricter* than the codec: a line
  it does not accept whole goes the other way;
- **every other line** (a mark, a trace with attributes, an older format version, anything odd or malformed):
  the strict codec itself (:func:`khipu.trace.codec.decode_record`), line by line.

So "valid" means what it means in every application that decodes traces, and a malformed line's quarantine reason
is the codec's own words (:func:`quarantine_reason`, in the driver). A trace of a stream the registry does not
define is malformed too. ``tests/unit/detector/test_parse.py`` holds the template path to the codec over the
codec's own table of records, and ``tests/integration/detector/test_parse.py`` runs the same table through Spark.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from khipu.detector.packed import PACK_ROWS, RECORD_FIELDS, RECORDS, by_bucket
from khipu.detector.records import MALFORMED, MARK, POSITION, TRACE
from khipu.detector.routes import HOP_KEY_FIELDS, HOP_KEY_SEPARATOR
from khipu.detector.xxhash64 import spark_bucket
from khipu.trace.archive import SCHEMA as ARCHIVED_TRACE
from khipu.trace.codec import (
    MAX_ID_CHARS,
    MAX_PARTITION,
    MAX_PREV_OFFSETS,
    MAX_TRACE_BYTES,
    NAME_FIELDS,
    TraceDecodeError,
    decode_record,
    split_record,
)
from khipu.trace.keys import KEY_HASH_PATTERN
from khipu.trace.model import EmitterMark, trace_columns
from khipu.trace.names import MAX_NAME_CHARS

# What the JVM hands over per Kafka record of the trace topic (Spark's Kafka schema, its time in milliseconds)
KAFKA_FIELDS = pa.schema(
    [
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("kafka_timestamp_ms", pa.int64()),
    ]
)

# -- the commonest case: a trace exactly as khipu's encoders write it ----------------------------------------------

# RE2 (Arrow's) and Python's re read these alike; RE2 never backtracks. A JSON string without control characters;
# its escapes the simple ones, or \uXXXX outside the surrogates (a lone surrogate is no text: the codec decides).
_ESCAPE = r'\\(?:["\\/bfnrt]|u(?:[0-9a-cA-CefEF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}))'
_STRING = rf'"[^"\\\x00-\x1f]*(?:{_ESCAPE}[^"\\\x00-\x1f]*)*"'
_INTEGER = r"(?:0|[1-9][0-9]{0,18})"  # >= 0, up to 19 digits (beyond a long the JSON reader refuses: the codec)
_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
# khipu.trace.codec.encode_trace's template (format version 3, no attributes; the version-3 fields in their order,
# each only when true or set)
ENCODER_TEMPLATE = (
    r'^\{"v":3,"message_id":<S>,"stream":<S>,"location":<S>,"cluster":<S>,"type":"(?:SENT|RECEIVED)",'
    r'"timestamp_ms":<N>,"topic":<S>,"partition":<N>,"offset":<N>,"group":(?:null|<S>),"emitter_id":<S>,'
    r'"emitter_seq":<N>,"sampling_percent":<F>,"attributes":\{\},"prev_offsets":\[(?:<N>(?:,<N>)*)?\]'
    r'(?:,"key_hash":<S>)?(?:,"tombstone":true)?(?:,"transactional":true)?(?:,"read_uncommitted":true)?\}$'
)
for _mark_, _pattern_ in (("<S>", _STRING), ("<N>", _INTEGER), ("<F>", _NUMBER)):
    ENCODER_TEMPLATE = ENCODER_TEMPLATE.replace(_mark_, _pattern_)
# the template's fields as Arrow's JSON reader reads them: a trace's fields as the archive keeps them, each with the
# JSON type the template guarantees (a partition is read as any integer, and checked to fit 32 bits)
_AS_JSON = {"partition": pa.int64(), "attributes": pa.struct([])}  # "attributes": {} only
_TEMPLATE_FIELDS = pa.schema(
    [
        ("v", pa.int64()),
        *((f.name, _AS_JSON.get(f.name, f.type)) for f in ARCHIVED_TRACE if f.name != "kafka_timestamp_ms"),
    ]
)
_FLAGS = ("tombstone", "transactional", "read_uncommitted")
_LINE_FIELDS = ("source_topic", "source_partition", "source_offset", "source_line", "kafka_timestamp_ms")


def kafka_columns(kafka_rows: DataFrame) -> DataFrame:
    """The JVM's whole part: the Kafka source's rows as :data:`KAFKA_FIELDS`."""
    return kafka_rows.select(
        "value", "topic", "partition", "offset", F.expr("unix_millis(timestamp)").alias("kafka_timestamp_ms")
    )


def _between(text: pa.Array, low: int, high: int) -> pa.Array:
    length = pc.utf8_length(text)
    return pc.and_kleene(pc.greater_equal(length, low), pc.less_equal(length, high))


def _template_traces(lines: pa.Array, known_streams: pa.Array) -> tuple[pa.Table, np.ndarray]:
    """The lines the template path accepts whole (their trace columns, as the codec would read them), and which
    of ``lines`` (valid UTF-8 text) they are."""
    shaped = pc.fill_null(
        pc.and_kleene(
            pc.less_equal(pc.binary_length(lines), MAX_TRACE_BYTES), pc.match_substring_regex(lines, ENCODER_TEMPLATE)
        ),
        False,
    )
    rows = np.flatnonzero(np.asarray(shaped, dtype=bool))
    if not len(rows):
        return _TEMPLATE_FIELDS.empty_table(), rows
    read, kept = _read_json(lines.take(pa.array(rows)).cast(pa.binary()))
    rows = rows[kept]
    sent = pc.equal(read.column("type"), "SENT")
    received = pc.equal(read.column("type"), "RECEIVED")
    prev = pc.list_value_length(read.column("prev_offsets"))
    key_hash = read.column("key_hash")
    checks = [
        _between(read.column("message_id"), 1, MAX_ID_CHARS),
        *(_between(read.column(name), 1, MAX_NAME_CHARS) for name in NAME_FIELDS),
        pc.is_in(read.column("stream"), value_set=known_streams),
        pc.or_kleene(
            pc.and_kleene(received, _between(read.column("group"), 1, MAX_NAME_CHARS)),
            pc.and_kleene(sent, pc.is_null(read.column("group"))),
        ),
        pc.less_equal(read.column("partition"), MAX_PARTITION),
        pc.and_kleene(
            pc.greater(read.column("sampling_percent"), 0.0), pc.less_equal(read.column("sampling_percent"), 100.0)
        ),
        pc.or_kleene(pc.equal(prev, 0), pc.and_kleene(received, pc.less_equal(prev, MAX_PREV_OFFSETS))),
        pc.or_kleene(
            pc.is_null(key_hash), pc.and_kleene(sent, pc.match_substring_regex(key_hash, KEY_HASH_PATTERN.pattern))
        ),
        pc.or_kleene(pc.is_null(read.column("tombstone")), sent),
        pc.or_kleene(pc.is_null(read.column("transactional")), sent),
        pc.or_kleene(pc.is_null(read.column("read_uncommitted")), received),
    ]
    ok = checks[0]
    for check in checks[1:]:
        ok = pc.and_kleene(ok, check)
    accepted = np.asarray(pc.fill_null(ok, False), dtype=bool)
    return read.filter(pa.array(accepted)), rows[accepted]


def _read_json(lines: pa.BinaryArray) -> tuple[pa.Table, np.ndarray]:
    """Template-shaped lines read by Arrow's JSON reader (:data:`_TEMPLATE_FIELDS`), and which of them were read.
    The objects are read back to back, as one block; a block the reader refuses (a number beyond a double) is
    halved until the lines it refuses are alone, and those are left to the codec."""
    offsets = np.frombuffer(lines.buffers()[1], np.int32, len(lines) + 1, lines.offset * 4)
    start, end = int(offsets[0]), int(offsets[-1])
    try:
        read = pa_json.read_json(
            io.BytesIO(memoryview(lines.buffers()[2])[start:end]),
            read_options=pa_json.ReadOptions(block_size=max(end - start, 1) + 1, use_threads=False),
            parse_options=pa_json.ParseOptions(explicit_schema=_TEMPLATE_FIELDS, unexpected_field_behavior="error"),
        )
        if read.num_rows == len(lines):
            return read, np.ones(len(lines), dtype=bool)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    if len(lines) == 1:
        return _TEMPLATE_FIELDS.empty_table(), np.zeros(1, dtype=bool)
    half = len(lines) // 2
    first, first_kept = _read_json(lines.slice(0, half))
    second, second_kept = _read_json(lines.slice(half))
    return pa.concat_tables([first, second]), np.concatenate([first_kept, second_kept])


def _lines(kafka: pa.Table) -> tuple[pa.Array, pa.Table]:
    """Each Kafka row's lines (:func:`khipu.trace.codec.split_record`: only a UTF-8 batch record is split), and
    per line where it sat (:data:`_LINE_FIELDS`)."""
    values = kafka.column("value").combine_chunks() if kafka.num_rows else pa.array([], pa.binary())
    batch = np.asarray(pc.fill_null(pc.match_substring(values, "}\n{"), False), dtype=bool)
    if not batch.any():
        lines: pa.Array = values
        counts = np.ones(kafka.num_rows, dtype=np.int64)
        numbers = np.zeros(kafka.num_rows, dtype=np.int32)
    else:  # batch records: split as the codec splits them
        split = [split_record(v) if is_batch else [v] for v, is_batch in zip(values.to_pylist(), batch, strict=True)]
        lines = pa.array([line for parts in split for line in parts], pa.binary())
        counts = np.array([len(parts) for parts in split], dtype=np.int64)
        numbers = np.concatenate([np.arange(n, dtype=np.int32) for n in counts])
    rows = pa.array(np.repeat(np.arange(kafka.num_rows), counts))
    source = pa.table(
        {
            "source_topic": kafka.column("topic").take(rows),
            "source_partition": kafka.column("partition").take(rows),
            "source_offset": kafka.column("offset").take(rows),
            "source_line": pa.array(numbers, pa.int32()),
            "kafka_timestamp_ms": kafka.column("kafka_timestamp_ms").take(rows),
        }
    )
    return lines, source


def _as_text(lines: pa.Array) -> pa.Array:
    """The lines as text; a line that is not valid UTF-8 is null (the codec says why it is malformed)."""
    try:
        return lines.cast(pa.string())
    except pa.ArrowInvalid:
        texts = []
        for line in lines.to_pylist():
            try:
                texts.append(None if line is None else line.decode("utf-8"))
            except UnicodeDecodeError:
                texts.append(None)
        return pa.array(texts, pa.string())


def _joined_offsets(offsets: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Back-pointers as the writer reads them: ``"13,12,10"``; null when there are none."""
    joined = pc.binary_join(pc.cast(offsets, pa.list_(pa.string())), ",")
    return pc.if_else(pc.greater(pc.list_value_length(offsets), 0), joined, pa.scalar(None, pa.string()))


def _codec_row(line: bytes | None, known_streams: frozenset[str]) -> dict[str, Any]:
    """One line the codec decides: a trace's, a mark's or a malformed line's columns."""
    try:
        record = decode_record(line)
    except TraceDecodeError:
        return {"kind": MALFORMED, "raw_value": line}
    if isinstance(record, EmitterMark):
        # cluster, topic, partition, offset: as khipu.detector.records.pointers reads them
        entries = [dict(zip(POSITION[1:], entry, strict=True)) for entry in record.received]
        return {
            "kind": MARK,
            "type": "MARK",
            "location": record.location,
            "emitter_id": record.emitter_id,
            "emitter_seq": record.emitter_seq,
            "timestamp_ms": record.timestamp_ms,
            "received": json.dumps(entries, separators=(",", ":"), ensure_ascii=False) if entries else None,
        }
    if record.stream not in known_streams:
        return {"kind": MALFORMED, "raw_value": line}
    columns = trace_columns(record)
    columns["prev_offsets"] = ",".join(map(str, record.prev_offsets)) if record.prev_offsets else None
    return {"kind": TRACE, **columns}


@dataclass(frozen=True, slots=True)
class RecordDecoder:
    """Spark's ``mapInArrow`` over a task's Kafka rows (:data:`KAFKA_FIELDS`): every line decoded to a record of
    :data:`khipu.detector.packed.RECORD_FIELDS` (its bucket, kind and hop found here), packed by bucket every
    :data:`khipu.detector.packed.PACK_ROWS` records and at the task's end."""

    known_streams: tuple[str, ...]
    hop_keys: Mapping[str, int]  # khipu.detector.routes.RoutePlans.hop_keys
    buckets: int
    _streams: pa.Array = field(init=False, repr=False)
    _stream_names: frozenset[str] = field(init=False, repr=False)
    _keys: pa.Array = field(init=False, repr=False)
    _hops: pa.Array = field(init=False, repr=False)

    def __post_init__(self) -> None:
        keys = sorted(self.hop_keys.items())
        object.__setattr__(self, "_streams", pa.array(sorted(set(self.known_streams)), pa.string()))
        object.__setattr__(self, "_stream_names", frozenset(self.known_streams))
        object.__setattr__(self, "_keys", pa.array([key for key, _ in keys], pa.string()))
        object.__setattr__(self, "_hops", pa.array([hop for _, hop in keys], pa.int32()))

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        gathered: list[pa.Table] = []
        rows = 0
        for batch in batches:
            if batch.num_rows:
                decoded = self.decode(batch)
                gathered.append(decoded)
                rows += decoded.num_rows
            if rows >= PACK_ROWS:
                yield by_bucket(pa.concat_tables(gathered), RECORDS)
                gathered, rows = [], 0
        if rows:
            yield by_bucket(pa.concat_tables(gathered), RECORDS)

    def decode(self, kafka: pa.RecordBatch | pa.Table) -> pa.Table:
        """The records of these Kafka rows (:data:`KAFKA_FIELDS`), a line each and in order, as
        :data:`khipu.detector.packed.RECORD_FIELDS`."""
        lines, source = _lines(pa.Table.from_batches([kafka]) if isinstance(kafka, pa.RecordBatch) else kafka)
        templated, at = _template_traces(_as_text(lines), self._streams)
        others = np.ones(len(lines), dtype=bool)
        others[at] = False
        decided = [_codec_row(line, self._stream_names) for line in lines.filter(pa.array(others)).to_pylist()]
        template_part = {
            name: templated.column(name) for name in templated.column_names if name not in ("v", "attributes")
        }
        template_part["prev_offsets"] = _joined_offsets(templated.column("prev_offsets"))
        for flag in _FLAGS:
            template_part[flag] = pc.fill_null(templated.column(flag), False)
        template_part["kind"] = pa.array([TRACE] * templated.num_rows, pa.string())
        fields = pa.schema([f for f in RECORD_FIELDS if f.name not in ("bucket", "hop", *_LINE_FIELDS)])
        both = pa.concat_tables(
            [
                pa.table(
                    [
                        template_part[f.name].cast(f.type) if f.name in template_part else pa.nulls(len(at), f.type)
                        for f in fields
                    ],
                    schema=fields,
                ),
                pa.Table.from_pylist(decided, schema=fields),
            ]
        )
        order = np.concatenate([at, np.flatnonzero(others)])
        both = both.take(pa.array(np.argsort(order, kind="stable")))  # back in line order
        for name in _LINE_FIELDS:
            both = both.append_column(name, source.column(name))
        return self._numbered(both)

    def _numbered(self, records: pa.Table) -> pa.Table:
        """The records with their bucket and, for a trace, its hop (-1: none of the registry's)."""
        kind = records.column("kind")
        is_trace = pc.equal(kind, TRACE)
        identity = pc.coalesce(
            records.column("message_id"),
            records.column("emitter_id"),
            pc.cast(records.column("source_offset"), pa.string()),
        )
        bucket = pa.array(spark_bucket(identity, self.buckets), pa.int32())
        actor = pc.coalesce(  # khipu.detector.routes.trace_actor, a column at a time
            pc.if_else(pc.equal(records.column("type"), "SENT"), records.column("location"), records.column("group")),
            "",
        )
        fields = [actor if name == "actor" else records.column(name) for name in HOP_KEY_FIELDS]
        key = pc.binary_join_element_wise(*fields, HOP_KEY_SEPARATOR, null_handling="skip")
        found = pc.take(self._hops, pc.index_in(key, value_set=self._keys))
        hop = pc.if_else(is_trace, pc.coalesce(found, pa.scalar(-1, pa.int32())), pa.scalar(None, pa.int32()))
        columns = {"bucket": bucket, "hop": hop}
        return pa.table(
            [columns[f.name] if f.name in columns else records.column(f.name) for f in RECORD_FIELDS],
            schema=RECORD_FIELDS,
        )


def quarantine_reason(raw: bytes | None, known_streams: Iterable[str]) -> str:
    """Why a line is malformed, in the codec's words (the codec is the specification)."""
    try:
        record = decode_record(raw)
    except TraceDecodeError as exc:
        return str(exc)
    if isinstance(record, EmitterMark):
        return "an emitter mark the detector rejected though the codec accepts it (report this as a bug)"
    known = sorted(set(known_streams))
    if record.stream not in known:
        return f"unknown stream {record.stream!r}; the registry defines: {', '.join(known) or 'none'}"
    return "a trace the detector rejected though the codec accepts it (report this as a bug)"
