"""The detector's decoding (:mod:`khipu.detector.parse`), without Spark: every line against the strict codec.

One table of records (the codec's own malformed cases, the marks', valid traces and marks at the edges of every
range, lines in the encoders' template with each value broken, batch records) is decoded by the detector and, line
by line, by the codec: a line is malformed in the detector exactly when the codec refuses it (or it names a stream
the registry does not define), and every column of every trace and mark is what the codec reads. The template
path must also be *taken*: a trace an encoder writes without attributes never reaches the codec.
``tests/integration/detector/test_parse.py`` runs the same decoder in Spark.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from khipu.detector import parse
from khipu.detector.packed import PACKED_FIELDS, RECORD_FIELDS, RECORDS, unpack
from khipu.detector.parse import KAFKA_FIELDS, RecordDecoder
from khipu.detector.records import MALFORMED, MARK, TRACE
from khipu.detector.routes import RoutePlans, trace_hop_key
from khipu.registry import parse_registry
from khipu.trace.codec import TraceDecodeError, decode_record, encode_batch, encode_mark, encode_trace, split_record
from khipu.trace.model import EmitterMark, Trace, TraceType
from tests.unit.trace.test_codec import MALFORMED as MALFORMED_TRACES
from tests.unit.trace.test_codec import MALFORMED_MARKS, record, sent_trace

STREAMS = ("orders",)
PLANS = RoutePlans.of(
    parse_registry(
        "version: 1\nclusters: {local: {}}\nstreams:\n  orders:\n    owner: team-t\n    route:\n"
        "      producers: [{location: api, writes: [local/demo.orders]}]\n"
        "      consumers: [{group: sink, reads: [local/demo.orders]}]\n"
    )
)
WRITTEN_MS = 1_795_000_000_000  # when the records reached the trace topic
VECTORS = Path(__file__).resolve().parents[3] / "vectors"


def decoder(buckets: int = 4) -> RecordDecoder:
    return RecordDecoder(STREAMS, PLANS.hop_keys(), buckets)


def kafka(values: list[bytes | None], first_offset: int = 0) -> pa.Table:
    """Kafka rows as the JVM hands them over: each value at its offset of partition 0."""
    n = len(values)
    return pa.table(
        {
            "value": pa.array(values, pa.binary()),
            "topic": pa.array(["khipu.traces"] * n, pa.string()),
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(first_offset, first_offset + n), pa.int64()),
            "kafka_timestamp_ms": pa.array([WRITTEN_MS] * n, pa.int64()),
        },
        schema=KAFKA_FIELDS,
    )


@pytest.fixture
def codec_lines(monkeypatch: pytest.MonkeyPatch) -> list[bytes | None]:
    """The lines the decoder hands to the codec (the rest took the template path)."""
    seen: list[bytes | None] = []
    real: Callable[[bytes | None], Trace | EmitterMark] = parse.decode_record

    def counting(line: bytes | None) -> Trace | EmitterMark:
        seen.append(line)
        return real(line)

    monkeypatch.setattr(parse, "decode_record", counting)
    return seen


def templated(**raw: str) -> bytes:
    """A trace in the encoder's own template (the detector's cheapest path) with fields replaced by raw JSON text."""
    text = encode_trace(sent_trace(attributes={}, type=TraceType.RECEIVED, group="g", prev_offsets=(3, 2))).decode()
    for name, value in raw.items():
        field = f'"{name}":{value}'
        text = re.sub(rf'"{name}":(\[[^\]]*\]|"(?:[^"\\]|\\.)*"|[^,}}]*)', lambda _, f=field: f, text, count=1)
    return text.encode()


def _mark(**changes: Any) -> bytes:
    return json.dumps(json.loads(encode_mark(EmitterMark("sink-1", "sink", 3, 5))) | changes).encode()


PARITY: list[bytes | None] = [
    *(data for data, _, _ in MALFORMED_TRACES),
    *(_mark(**changes) for changes, _, _ in MALFORMED_MARKS),
    # valid ones, including the edges of every range
    json.dumps(record()).encode(),
    json.dumps(record(v=1)).encode(),
    json.dumps(record(sampling_percent=100, attributes=None)).encode(),
    json.dumps(record(type="RECEIVED", group="g", prev_offsets=list(range(16)))).encode(),
    json.dumps(record(message_id="x" * 256, stream="orders", topic="t" * 249)).encode(),
    encode_mark(EmitterMark("sink-1", "sink", 3, 5, (("local", "orders", 0, 4),))),
    json.dumps(
        {"v": 1, "mark": True, "emitter_id": "e", "location": "l", "emitter_seq": 0, "timestamp_ms": 0}
    ).encode(),
    # malformed in ways the table above does not show
    json.dumps(record(message_id="x" * 257)).encode(),
    json.dumps(record(sampling_percent=100.5)).encode(),
    json.dumps(record(sampling_percent="50")).encode(),
    json.dumps(record(offset="41")).encode(),
    json.dumps(record(timestamp_ms=2**64)).encode(),
    json.dumps(record(partition=2**31)).encode(),  # Kafka partitions are 32-bit
    json.dumps(record(partition=2**31 - 1)).encode(),
    json.dumps(record(v=2.0)).encode(),
    _mark(received=[["local", "orders", 2**31, 4]]),
    json.dumps(record(attributes={f"k{i}": "v" for i in range(33)})).encode(),
    json.dumps(record(attributes=["a"])).encode(),
    json.dumps(record(v=True)).encode(),
    json.dumps(record(mark=False)).encode(),
    _mark(emitter_seq=-1),
    _mark(received=[["local", "orders", 0, 4, 5]]),
    _mark(received=[["local", 7, 0, 4]]),
    _mark(location=""),
    json.dumps(record(type="RECEIVED", group="g", prev_offsets=[None])).encode(),
    json.dumps(record(type="RECEIVED", group="g", prev_offsets=[3, None])).encode(),
    json.dumps(record(prev_offsets=[3])).encode(),  # back-pointers on a SENT trace
    json.dumps(record(type="RECEIVED", group=None)).encode(),
    json.dumps(record(group="g")).encode(),  # a group on a SENT trace
    json.dumps(record(type="SEEN")).encode(),
    json.dumps(record(stream="")).encode(),
    json.dumps(record(emitter_seq=-1)).encode(),
    json.dumps(record(sampling_percent=0)).encode(),
    json.dumps(record(partition=-1)).encode(),
    json.dumps(record(v=1, prev_offsets=[])).encode(),  # a version-1 trace has no back-pointers
    json.dumps({k: v for k, v in record().items() if k != "attributes"}).encode(),
    json.dumps({k: v for k, v in record().items() if k not in ("group", "prev_offsets")}).encode(),
    # in the encoder's own template (the template path): valid ones and every value out of range
    templated(),
    templated(type='"SENT"', group="null", prev_offsets="[]"),
    templated(message_id='"\\u00fc\\"x\\\\y\\/\\u0000"', sampling_percent="1e-07"),
    templated(message_id='"\\ud83d\\ude00 a whole pair"'),  # the codec's business: the template leaves surrogates
    templated(message_id='"\\ud800 half a pair"'),
    templated(message_id='"ü 日本 😀"', cluster='"c"', topic='"t"', location='"l"', emitter_id='"e"'),
    templated(message_id='""'),
    templated(message_id='"' + "x" * 256 + '"'),
    templated(message_id='"' + "x" * 257 + '"'),
    templated(message_id='"' + "ü" * 256 + '"'),  # characters, not bytes
    templated(stream='"nope"'),
    templated(group="null"),
    templated(group='""'),
    templated(type='"SENT"'),  # a group and back-pointers on a SENT trace
    templated(type='"SENT"', group="null"),  # back-pointers on a SENT trace
    templated(partition=str(2**31)),
    templated(partition=str(2**31 - 1)),
    templated(offset="99999999999999999999"),
    templated(offset="9223372036854775808"),  # 19 digits, one beyond a long
    templated(offset="9223372036854775807"),  # the largest long
    templated(timestamp_ms=str(2**63)),
    templated(sampling_percent="0"),
    templated(sampling_percent="-0.0"),
    templated(sampling_percent="100"),
    templated(sampling_percent="100.5"),
    templated(sampling_percent="1e999"),  # beyond a double: Arrow's reader refuses the line, the codec decides
    templated(sampling_percent="1" + "0" * 400),  # an integer beyond a double, as the JSON reader and the codec see it
    templated(sampling_percent="33.333333333333336"),
    templated(prev_offsets="[" + ",".join(map(str, range(16))) + "]"),
    templated(prev_offsets="[" + ",".join(map(str, range(17))) + "]"),
    templated(location='"' + "l" * 250 + '"'),
    templated(location='"l\\tx"'),
    templated(location='"l\tx"'),  # a raw control character: no JSON
    # version 3: valid, with and without its fields, and each of its rules broken
    json.dumps(record(key_hash="0123456789abcdef", tombstone=True, transactional=True)).encode(),
    json.dumps(record(type="RECEIVED", group="g", read_uncommitted=True)).encode(),
    json.dumps(record(key_hash=None, tombstone=False, read_uncommitted=False)).encode(),
    json.dumps(record(type="RECEIVED", group="g", transactional=False)).encode(),
    json.dumps(record(v=2, tombstone=True)).encode(),  # a version-2 trace has no version-3 field
    json.dumps(record(key_hash="ABCDEF0123456789")).encode(),
    json.dumps(record(key_hash="0123456789abcde")).encode(),
    json.dumps(record(key_hash=7)).encode(),
    json.dumps(record(tombstone="true")).encode(),
    json.dumps(record(type="RECEIVED", group="g", key_hash="0123456789abcdef")).encode(),
    json.dumps(record(type="RECEIVED", group="g", transactional=True)).encode(),
    json.dumps(record(read_uncommitted=True)).encode(),
    *(
        encode_trace(trace)  # the encoder's template, its version-3 tail valid and broken
        for trace in (
            sent_trace(attributes={}, key_hash="0123456789abcdef", tombstone=True, transactional=True),
            sent_trace(attributes={}, transactional=True),
            sent_trace(attributes={}, type=TraceType.RECEIVED, group="g", read_uncommitted=True),
            sent_trace(attributes={}, key_hash="ABCDEF0123456789"),
            sent_trace(attributes={}, read_uncommitted=True),
            sent_trace(attributes={}, type=TraceType.RECEIVED, group="g", key_hash="0123456789abcdef"),
            sent_trace(attributes={}, type=TraceType.RECEIVED, group="g", tombstone=True),
            sent_trace(attributes={}, type=TraceType.RECEIVED, group="g", transactional=True),
        )
    ),
    b'"a string"',
    b"",
    # batches: each line read as it would be alone in a record (the template's path, the codec's, a mark)
    encode_batch(
        [
            encode_trace(sent_trace(attributes={})),
            encode_trace(sent_trace(type=TraceType.RECEIVED, group="g", prev_offsets=(40,))),
            encode_mark(EmitterMark("sink-1", "sink", 3, 5, (("local", "orders", 0, 4),))),
        ]
    ),
    encode_batch([encode_trace(sent_trace()), json.dumps(record(offset=-1)).encode(), _mark()]),
    encode_batch([json.dumps(record()).encode(), json.dumps(record(stream="nope")).encode()]),
    encode_batch([templated(), templated(partition=str(2**31))]),
    encode_batch([b"{", b"}"]),  # "{" + line feed + "}": no batch
    encode_batch([b"}", b"{"]),  # two lines, neither JSON
    json.dumps(record(), indent=2).encode(),  # pretty-printed: line feeds, one trace
    json.dumps(record(offset=-1), indent=2).encode(),
    b'{"v": 3,\n "message_id": "\xff"}',  # not UTF-8, with a line feed: one record
]


def expected_columns(line: bytes | None) -> dict[str, Any]:
    """What the codec makes of a line, in the detector's columns."""
    try:
        decoded = decode_record(line)
    except TraceDecodeError:
        return {"kind": MALFORMED, "raw_value": line}
    if isinstance(decoded, EmitterMark):
        return {
            "kind": MARK,
            "emitter_id": decoded.emitter_id,
            "location": decoded.location,
            "emitter_seq": decoded.emitter_seq,
            "timestamp_ms": decoded.timestamp_ms,
            "received": [list(entry) for entry in decoded.received],
        }
    if decoded.stream not in STREAMS:
        return {"kind": MALFORMED, "raw_value": line}
    return {"kind": TRACE, **decoded._asdict(), "type": decoded.type.value, "attributes": dict(decoded.attributes)}


def decoded_columns(row: dict[str, Any]) -> dict[str, Any]:
    """A decoded record read back into the codec's terms."""
    if row["kind"] == MALFORMED:
        return {"kind": MALFORMED, "raw_value": row["raw_value"]}
    if row["kind"] == MARK:
        received = json.loads(row["received"]) if row["received"] else []
        return {
            "kind": MARK,
            **{name: row[name] for name in ("emitter_id", "location", "emitter_seq", "timestamp_ms")},
            "received": [[e["cluster"], e["topic"], e["partition"], e["offset"]] for e in received],
        }
    columns = {name: row[name] for name in Trace._fields}
    columns["attributes"] = json.loads(row["attributes"]) if row["attributes"] else {}
    columns["prev_offsets"] = tuple(int(o) for o in row["prev_offsets"].split(",")) if row["prev_offsets"] else ()
    return {"kind": TRACE, **columns}


def test_every_line_is_decoded_exactly_as_the_codec_decodes_it(codec_lines: list[bytes | None]) -> None:
    table = decoder().decode(kafka(PARITY))
    rows = {(r["source_offset"], r["source_line"]): r for r in table.to_pylist()}
    lines = {(offset, n): line for offset, value in enumerate(PARITY) for n, line in enumerate(split_record(value))}
    assert sorted(rows) == sorted(lines)  # split as split_record splits, every line once
    assert table.schema == RECORD_FIELDS
    disagreements = [
        (position, line, decoded_columns(rows[position]), expected_columns(line))
        for position, line in lines.items()
        if decoded_columns(rows[position]) != expected_columns(line)
    ]
    assert not disagreements, disagreements
    kinds = [rows[p]["kind"] for p in lines]
    assert kinds.count(TRACE) >= 30 and kinds.count(MARK) >= 4 and kinds.count(MALFORMED) >= 60
    assert len(codec_lines) < len(lines) - 15  # the template path read many of them
    assert {r["kafka_timestamp_ms"] for r in rows.values()} == {WRITTEN_MS}  # every line carries its record's time


def test_every_trace_an_encoder_writes_without_attributes_takes_the_template_path(
    codec_lines: list[bytes | None],
) -> None:
    """The shared vectors (the Python encoder's bytes, and the JVM interceptors'): only a trace with attributes (a
    resent record's RECEIVED trace) is read by the codec."""
    vectors = json.loads((VECTORS / "trace-records.json").read_text(encoding="utf-8"))["traces"]
    values = [v["bytes"].encode("utf-8") for v in vectors]
    with_attributes = [value for v, value in zip(vectors, values, strict=True) if v["trace"]["attributes"]]
    assert 0 < len(with_attributes) < len(values)
    table = RecordDecoder(("orders",), {}, 4).decode(kafka(values))
    assert codec_lines == with_attributes
    assert [decoded_columns(r) for r in table.to_pylist()] == [expected_columns(v) for v in values]


def test_a_line_the_json_reader_refuses_is_left_to_the_codec_and_its_neighbours_are_not(
    codec_lines: list[bytes | None],
) -> None:
    values = [templated(offset=str(n)) for n in range(40)]
    values[17] = templated(offset="17", sampling_percent="1e999")
    values[30] = b'{"v":3,"message_id":"\xff"}'
    table = decoder().decode(kafka(values))
    assert codec_lines == [values[17], values[30]]
    assert [r["kind"] for r in table.to_pylist()] == [MALFORMED if n in (17, 30) else TRACE for n in range(40)]
    assert table.column("offset").to_pylist() == [None if n in (17, 30) else n for n in range(40)]  # in line order


def test_each_trace_is_numbered_by_its_hop_key_as_the_routes_spell_it() -> None:
    sent = Trace("m9", "orders", "api", "local", TraceType.SENT, 900, "demo.orders", 0, 9, None, "api-e1", 0, 100.0)
    got = Trace("m9", "orders", "sink", "local", TraceType.RECEIVED, 901, "demo.orders", 0, 9, "sink", "s-e1", 0, 1.0)
    elsewhere = sent._replace(topic="other")
    values = [encode_trace(t) for t in (sent, got, elsewhere, got._replace(attributes={"a": "b"}))]
    table = decoder().decode(kafka(values))
    keys = PLANS.hop_keys()
    assert table.column("hop").to_pylist() == [keys[trace_hop_key(sent)], keys[trace_hop_key(got)], -1, 1]
    assert table.column("hop").to_pylist()[:2] == [0, 1]  # api -> demo.orders, then sink's read


def test_a_tasks_records_are_packed_one_row_per_bucket_each_holding_exactly_that_buckets_records() -> None:
    values = [encode_trace(sent_trace(message_id=f"m{n}", attributes={})) for n in range(60)]
    batches = [*kafka(values[:25]).to_batches(), *kafka([]).to_batches(), *kafka(values[25:], 25).to_batches()]
    out = list(decoder(buckets=8)(iter(batches)))
    assert len(out) == 1
    assert out[0].schema == PACKED_FIELDS
    rows = out[0].to_pylist()
    assert {row["kind"] for row in rows} == {RECORDS}
    assert [row["bucket"] for row in rows] == sorted({row["bucket"] for row in rows})  # each bucket once
    held = {row["bucket"]: unpack([row["blob"]], RECORD_FIELDS) for row in rows}
    assert sorted(o for t in held.values() for o in t.column("source_offset").to_pylist()) == list(range(60))
    assert all(set(t.column("bucket").to_pylist()) == {b} for b, t in held.items())
    assert len(held) > 4  # 60 ids spread over the 8 buckets


def test_a_large_task_is_packed_as_it_goes_and_nothing_is_lost_or_doubled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parse, "PACK_ROWS", 5)
    values = [encode_trace(sent_trace(message_id=f"m{n}", attributes={})) for n in range(20)]
    batches = [kafka(values[4 * k : 4 * k + 4], 4 * k).to_batches()[0] for k in range(5)]  # 20 records, 4 at a time
    out = list(decoder(buckets=3)(iter(batches)))
    assert len(out) == 3  # after 8 records, after 16, and the 4 left at the end
    table = unpack([b for batch in out for b in batch.column("blob").to_pylist()], RECORD_FIELDS)
    assert sorted(table.column("source_offset").to_pylist()) == list(range(20))
    assert table.schema == RECORD_FIELDS
