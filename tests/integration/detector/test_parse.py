"""Decoding in Spark: the Kafka source's rows through :class:`khipu.detector.parse.RecordDecoder` (``mapInArrow``),
as the detector runs it.

Line by line, the decoder is held to the strict codec in ``tests/unit/detector/test_parse.py`` (the same table runs
through Spark here); these tests add what only Spark shows: the Kafka source's rows as they arrive, batch records
split into lines, and buckets equal to Spark's own ``pmod(xxhash64(message_id), buckets)``, which kept every
checkpoint's state before the decoding moved to Python.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import functions as F

from khipu.detector import records
from khipu.detector.packed import PACKED_SCHEMA, RECORD_FIELDS, unpack
from khipu.detector.parse import RecordDecoder, kafka_columns, quarantine_reason
from khipu.detector.routes import trace_hop_key
from khipu.detector.xxhash64 import spark_bucket
from khipu.trace.codec import TraceDecodeError, decode_record, encode_batch, encode_mark, encode_trace, split_record
from khipu.trace.model import EmitterMark, Trace, TraceType
from tests.unit.detector.test_parse import PARITY, PLANS, STREAMS, decoded_columns, expected_columns
from tests.unit.trace.test_codec import record, sent_trace

pytestmark = pytest.mark.integration
AT = datetime(2026, 11, 23, tzinfo=UTC)
KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int"
)


def kafka_rows(spark: Any, values: list[bytes | None]) -> Any:
    rows = [(None, value, "khipu.traces", 0, offset, AT, 0) for offset, value in enumerate(values)]
    return spark.createDataFrame(rows, KAFKA_SCHEMA)


def decoded(spark: Any, values: list[bytes | None], buckets: int = 4) -> pa.Table:
    """The records as the detector's shuffle gets them: decoded and packed in Spark, unpacked, in line order."""
    packed = kafka_columns(kafka_rows(spark, values)).mapInArrow(
        RecordDecoder(tuple(STREAMS), PLANS.hop_keys(), buckets), PACKED_SCHEMA
    )
    table = unpack(packed.toArrow().column("blob"), RECORD_FIELDS)
    return table.sort_by([("source_offset", "ascending"), ("source_line", "ascending")])


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
    batch = decoded(spark, values)  # the records, as the writer collects them
    traces = batch.filter(pc.equal(batch.column("kind"), records.TRACE)).to_pylist()
    assert sorted((r["message_id"], r["type"], r["offset"]) for r in traces) == [
        ("m10", "RECEIVED", 10),
        ("m13", "RECEIVED", 13),
        ("m14", "RECEIVED", 14),
        ("m9", "SENT", 9),
    ]
    assert {r["message_id"]: r["prev_offsets"] for r in traces} == {  # as the writer reads them
        "m9": None,
        "m10": None,
        "m13": "10",
        "m14": "13,12,10",
    }
    # each trace's hop is found by the hop key spelt in khipu.detector.routes
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
    batch = decoded(spark, values)  # the records, as the writer collects them
    read = [
        (
            r["source_offset"],
            r["source_line"],
            "malformed" if r["kind"] == records.MALFORMED else (r["type"], r["message_id"] or r["emitter_id"]),
        )
        for r in batch.to_pylist()
    ]
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
    assert set(batch.column("kafka_timestamp_ms").to_pylist()) == {int(AT.timestamp() * 1000)}  # its record's time
    bad = sorted(((r["source_offset"], r["source_line"]), r["raw_value"]) for r in records.malformed(batch))
    assert bad == [((1, 1), bad_line), ((3, 0), values[3]), ((5, 0), None)]
    with pytest.raises(TraceDecodeError) as caught:
        decode_record(bad_line)
    assert quarantine_reason(bad_line, STREAMS) == str(caught.value) and caught.value.field == "offset"
    assert "not UTF-8" in quarantine_reason(values[3], STREAMS)  # the whole record, as the codec finds it


def test_the_parity_table_decoded_in_spark_is_what_the_codec_reads(spark: Any) -> None:
    batch = decoded(spark, PARITY)
    rows = {(r["source_offset"], r["source_line"]): r for r in batch.to_pylist()}
    lines = {(offset, n): line for offset, value in enumerate(PARITY) for n, line in enumerate(split_record(value))}
    assert sorted(rows) == sorted(lines)
    wrong = [p for p, line in lines.items() if decoded_columns(rows[p]) != expected_columns(line)]
    assert not wrong, [(p, lines[p]) for p in wrong]
    reasons = [quarantine_reason(lines[p], STREAMS) for p, r in rows.items() if r["kind"] == records.MALFORMED]
    assert len(reasons) > 60 and not [reason for reason in reasons if "report this as a bug" in reason]


def test_every_trace_keeps_the_bucket_sparks_own_hash_gave_it(spark: Any) -> None:
    """A checkpoint's state is kept by bucket: the decoder, in Python, must give each message id the bucket Spark's
    ``pmod(xxhash64(message_id), buckets)`` gave it when Spark decoded (ids of every length and alphabet)."""
    chance = random.Random(20)
    alphabet = 'abcXYZ0189-_.:/ üé日本😀\\"'
    ids = [f"m-{n}" for n in range(200)] + [
        "".join(chance.choice(alphabet) for _ in range(chance.randint(1, 90))) for _ in range(800)
    ]
    values = [encode_trace(sent_trace(message_id=message_id, attributes={})) for message_id in ids]
    batch = decoded(spark, values, buckets=32)
    assert batch.column("message_id").to_pylist() == ids  # every one decoded
    ours = batch.column("bucket").to_pylist()
    frame = spark.createDataFrame([(message_id,) for message_id in ids], "message_id string")
    sparks = [r[0] for r in frame.select(F.pmod(F.xxhash64("message_id"), F.lit(32)).cast("int")).collect()]
    assert ours == sparks
    assert spark_bucket(pa.array(ids), 32).tolist() == sparks
    assert len(set(sparks)) == 32
