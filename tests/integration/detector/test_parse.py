"""Decoding after the source, in the JVM, on a DataFrame of Spark's Kafka schema.

The JVM's checks and the strict codec are held to the same table of records: the codec's own
malformed cases, the marks' malformed cases, valid traces and marks, and batch records. For each
line (``split_record``'s; a record of one trace is its line 0), "malformed in the JVM" equals "the
codec raises", and the quarantine's reason is the codec's.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import pyarrow.compute as pc
import pytest

from khipu.detector import records
from khipu.detector.job import prepare
from khipu.detector.parse import parse_traces, quarantine_reason, valid
from khipu.detector.routes import RoutePlans, trace_hop_key
from khipu.registry import parse_registry
from khipu.trace.codec import TraceDecodeError, decode_record, encode_batch, encode_mark, encode_trace, split_record
from khipu.trace.model import EmitterMark, Trace, TraceType
from tests.unit.trace.test_codec import MALFORMED, MALFORMED_MARKS, record, sent_trace

pytestmark = pytest.mark.integration
AT = datetime(2026, 11, 23, tzinfo=UTC)
KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int"
)
STREAMS = ["orders"]
PLANS = RoutePlans.of(
    parse_registry(
        "version: 1\nclusters: {local: {}}\nstreams:\n  orders:\n    owner: t\n    route:\n"
        "      producers: [{location: api, writes: [local/demo.orders]}]\n"
        "      consumers: [{group: sink, reads: [local/demo.orders]}]\n"
    )
)


def kafka_rows(spark: Any, values: list[bytes | None]) -> Any:
    rows = [(None, value, "khipu.traces", 0, offset, AT, 0) for offset, value in enumerate(values)]
    return spark.createDataFrame(rows, KAFKA_SCHEMA)


def received(offset: int, seq: int, prev: tuple[int, ...], partition: int = 0, location: str = "sink") -> Trace:
    return Trace(
        f"m{offset}", "orders", location, "local", TraceType.RECEIVED, 1_000 + seq, "demo.orders", partition,
        offset, location, f"{location}-e1", seq, 100.0, prev_offsets=prev,
    )  # fmt: skip


def test_traces_marks_pointers_and_quarantine_from_kafka_rows(spark: Any) -> None:
    sent = Trace("m9", "orders", "api", "local", TraceType.SENT, 900, "demo.orders", 0, 9, None, "api-e1", 0, 100.0)
    values: list[bytes | None] = [
        encode_trace(sent),
        encode_trace(received(10, 0, ())),
        encode_trace(received(13, 1, (10,))),  # 11 and 12 never traced here: they were skipped, or their trace lost
        encode_trace(received(14, 3, (13, 12, 10))),  # ... 12 was received (seq 2 lost); 11 was not
        encode_mark(EmitterMark("sink-e1", "sink", 4, 1_004, (("local", "demo.orders", 0, 14), ("local", "x", 2, 7)))),
        b"\xff not json",
        json.dumps({**json.loads(encode_trace(sent)), "stream": "nope"}).encode(),
    ]
    parsed = parse_traces(kafka_rows(spark, values), STREAMS).cache()
    batch = prepare(parsed, PLANS, 4).toArrow()  # the records, as the writer collects them

    assert sorted((r.message_id, r.type, r.offset) for r in valid(parsed).collect()) == [
        ("m10", "RECEIVED", 10),
        ("m13", "RECEIVED", 13),
        ("m14", "RECEIVED", 14),
        ("m9", "SENT", 9),
    ]
    assert {r.message_id: r.prev_offsets for r in valid(parsed, with_pointers=True).collect()} == {
        "m9": None,
        "m10": None,
        "m13": [10],
        "m14": [13, 12, 10],
    }
    # Spark numbers each trace's hop by the hop key spelt in khipu.detector.routes, as Python does
    traces = batch.filter(pc.equal(batch.column("kind"), "trace")).to_pylist()
    keys = PLANS.hop_keys()
    assert [row["hop"] for row in traces] == [keys.get(trace_hop_key(row), -1) for row in traces]
    assert sorted(row["hop"] for row in traces) == [0, 1, 1, 1]  # api -> demo.orders, then sink's reads
    numbered = records.sequence_numbers(batch)
    written = int(AT.timestamp() * 1000)  # each number with the time its record was written to the trace topic
    assert sorted((e, b.location, int(n), int(t)) for e, b in numbered.items() for n, t in b.seen) == [
        ("api-e1", "api", 0, written),
        ("sink-e1", "sink", 0, written),
        ("sink-e1", "sink", 1, written),
        ("sink-e1", "sink", 3, written),
        ("sink-e1", "sink", 4, written),
    ]
    # every pointer whose trace is in the batch is left out: 12 (trace lost) and the mark's x[2]@7 remain
    assert sorted(records.pointers(batch)) == [
        ("sink", "local", "demo.orders", 0, 12),
        ("sink", "local", "x", 2, 7),
    ]
    bad = sorted((r["source_offset"], bytes(r["raw_value"])) for r in records.malformed(batch))
    assert bad == [(5, values[5]), (6, values[6])]
    assert "not UTF-8" in quarantine_reason(bad[0][1], STREAMS)
    reason = quarantine_reason(bad[1][1], STREAMS)
    assert "unknown stream 'nope'" in reason and "orders" in reason


def test_every_trace_field_comes_out_of_the_jvm_as_the_codec_reads_it(spark: Any) -> None:
    traces = [
        sent_trace(),
        sent_trace(type=TraceType.RECEIVED, group="enricher", attributes={}, prev_offsets=(40, 39, 37)),
        sent_trace(message_id="ünïcode-✓", sampling_percent=100.0, offset=0, partition=0, attributes={"a": "é"}),
        sent_trace(message_id="v3", attributes={}, key_hash="0123456789abcdef", tombstone=True, transactional=True),
        sent_trace(message_id="v3", type=TraceType.RECEIVED, group="g", attributes={}, read_uncommitted=True),
        sent_trace(message_id="v3a", key_hash="fedcba9876543210", attributes={"a": "b"}),  # the variant's way
    ]
    parsed = parse_traces(kafka_rows(spark, [encode_trace(t) for t in traces]), STREAMS)
    rows = {(r.message_id, r.type): r for r in valid(parsed, with_pointers=True).collect()}
    assert len(rows) == len(traces)
    for trace in traces:
        row = rows[(trace.message_id, trace.type.value)]
        decoded = decode_record(encode_trace(trace))
        assert isinstance(decoded, Trace)
        assert (row.stream, row.location, row.cluster, row.type, row.timestamp_ms) == (
            decoded.stream,
            decoded.location,
            decoded.cluster,
            decoded.type.value,
            decoded.timestamp_ms,
        )
        assert (row.topic, row.partition, row.offset, row.group, row.emitter_id, row.emitter_seq) == (
            decoded.topic,
            decoded.partition,
            decoded.offset,
            decoded.group,
            decoded.emitter_id,
            decoded.emitter_seq,
        )
        assert row.sampling_percent == decoded.sampling_percent
        assert (json.loads(row.attributes) if row.attributes else {}) == dict(decoded.attributes)
        assert tuple(row.prev_offsets or ()) == decoded.prev_offsets
        assert (row.key_hash, row.tombstone, row.transactional, row.read_uncommitted) == (
            decoded.key_hash,
            decoded.tombstone,
            decoded.transactional,
            decoded.read_uncommitted,
        )


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
    *(data for data, _, _ in MALFORMED),
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
    # the plain shape checked on its values only: each of these must still be refused
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
    # in the encoder's own template, read without the variant: valid ones and every value out of range
    templated(),
    templated(type='"SENT"', group="null", prev_offsets="[]"),
    templated(message_id='"\\u00fc\\"x\\\\y"', sampling_percent="1e-07"),
    templated(message_id='""'),
    templated(message_id='"' + "x" * 257 + '"'),
    templated(stream='"nope"'),
    templated(group="null"),
    templated(type='"SENT"'),  # a group and back-pointers on a SENT trace
    templated(type='"SENT"', group="null"),  # back-pointers on a SENT trace
    templated(partition=str(2**31)),
    templated(offset="99999999999999999999"),
    templated(timestamp_ms=str(2**63)),
    templated(sampling_percent="0"),
    templated(sampling_percent="100.5"),
    templated(prev_offsets="[" + ",".join(map(str, range(17))) + "]"),
    templated(location='"' + "l" * 250 + '"'),
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
    # batches: each line read as it would be alone in a record (the template's path, the variant's, a mark)
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


def test_the_jvm_and_the_codec_agree_on_what_is_malformed_and_the_reason_is_the_codecs(spark: Any) -> None:
    parsed = parse_traces(kafka_rows(spark, PARITY), STREAMS)
    jvm_malformed = {
        (r.source_offset, r.source_line): (r.malformed, r.raw_value)
        for r in parsed.select("source_offset", "source_line", "malformed", "raw_value").collect()
    }
    lines = {(offset, n): line for offset, value in enumerate(PARITY) for n, line in enumerate(split_record(value))}
    assert sorted(jvm_malformed) == sorted(lines)  # the JVM splits each record as split_record does
    assert len(lines) > len(PARITY)
    disagreements = []
    for position, line in lines.items():
        try:
            decoded = decode_record(line)
            codec_malformed = isinstance(decoded, Trace) and decoded.stream not in STREAMS
        except TraceDecodeError:
            codec_malformed = True
        malformed, raw_value = jvm_malformed[position]
        if malformed != codec_malformed:
            disagreements.append((position, line, "JVM", malformed, "codec", codec_malformed))
        elif malformed and raw_value != line:  # what is quarantined is the line, byte for byte
            disagreements.append((position, line, "quarantined", raw_value))
    assert not disagreements, disagreements
    reasons = [quarantine_reason(line, STREAMS) for position, line in lines.items() if jvm_malformed[position][0]]
    assert not [reason for reason in reasons if "report this as a bug" in reason]


def test_a_batch_record_is_read_line_by_line_and_only_its_malformed_lines_are_quarantined(spark: Any) -> None:
    sent = encode_trace(sent_trace(message_id="b-sent", attributes={}))
    received = encode_trace(sent_trace(message_id="b-received", type=TraceType.RECEIVED, group="g"))
    mark = encode_mark(EmitterMark("sink-1", "sink", 3, 5, (("local", "orders", 0, 4),)))
    bad_line = json.dumps(record(message_id="b-bad", offset=-1)).encode()
    not_utf8 = b'{"v": 3, "message_id": "\xff"}'
    values: list[bytes | None] = [
        encode_batch([sent, received, mark]),  # 0: two traces and a mark
        encode_batch(
            [encode_trace(sent_trace(message_id="b-1")), bad_line, encode_trace(sent_trace(message_id="b-3"))]
        ),
        json.dumps(record(message_id="b-pretty"), indent=2).encode(),  # 2: pretty-printed, its line feeds kept
        encode_batch([encode_trace(sent_trace(message_id="b-hidden")), not_utf8]),  # 3: not UTF-8: never split
        encode_trace(sent_trace(message_id="b-one")),  # 4: a record of one trace
        None,  # 5: a tombstone
    ]
    parsed = parse_traces(kafka_rows(spark, values), STREAMS).cache()
    read = sorted(
        (r.source_offset, r.source_line, "malformed" if r.malformed else (r.type, r.message_id or r.emitter_id))
        for r in parsed.collect()
    )
    assert read == [
        (0, 0, ("SENT", "b-sent")),
        (0, 1, ("RECEIVED", "b-received")),
        (0, 2, ("MARK", "sink-1")),
        (1, 0, ("SENT", "b-1")),
        (1, 1, "malformed"),  # only the malformed line; the lines around it are read
        (1, 2, ("SENT", "b-3")),
        (2, 0, ("SENT", "b-pretty")),
        (3, 0, "malformed"),  # the whole record
        (4, 0, ("SENT", "b-one")),
        (5, 0, "malformed"),
    ]
    assert {r.kafka_timestamp_ms for r in parsed.select("kafka_timestamp_ms").collect()} == {
        int(AT.timestamp() * 1000)
    }  # every line carries its record's time
    batch = prepare(parsed, PLANS, 4).toArrow()  # the records, as the writer collects them
    bad = sorted(((r["source_offset"], r["source_line"]), r["raw_value"]) for r in records.malformed(batch))
    assert bad == [((1, 1), bad_line), ((3, 0), values[3]), ((5, 0), None)]
    with pytest.raises(TraceDecodeError) as caught:
        decode_record(bad_line)
    assert quarantine_reason(bad_line, STREAMS) == str(caught.value) and caught.value.field == "offset"
    assert "not UTF-8" in quarantine_reason(values[3], STREAMS)  # the whole record, as the codec finds it
