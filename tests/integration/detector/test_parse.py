"""The parsing after the source, on a DataFrame of Spark's Kafka schema (what either source yields)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from khipu.detector.parse import archived, parse_traces, pointers, quarantined, sequences, valid
from khipu.spark.kafka_source import KAFKA_SCHEMA
from khipu.trace.codec import encode_mark, encode_trace
from khipu.trace.model import EmitterMark, Trace, TraceType

pytestmark = pytest.mark.integration
AT = datetime(2026, 11, 23, tzinfo=UTC)


def received(offset: int, seq: int, prev: tuple[int, ...], partition: int = 0, location: str = "sink") -> Trace:
    return Trace(
        f"m{offset}", "orders", location, "local", TraceType.RECEIVED, 1_000 + seq, "demo.orders", partition,
        offset, location, f"{location}-e1", seq, 100.0, prev_offsets=prev,
    )  # fmt: skip


def test_traces_marks_pointers_and_quarantine_from_kafka_rows(spark: Any) -> None:
    sent = Trace("m9", "orders", "api", "local", TraceType.SENT, 900, "demo.orders", 0, 9, None, "api-e1", 0, 100.0)
    values = [
        encode_trace(sent),
        encode_trace(received(10, 0, ())),
        encode_trace(received(13, 1, (10,))),  # 11 and 12 never traced here: they were skipped, or their trace lost
        encode_trace(received(14, 3, (13, 12, 10))),  # ... 12 was received (seq 2 lost); 11 was not
        encode_mark(EmitterMark("sink-e1", "sink", 4, 1_004, (("local", "demo.orders", 0, 14), ("local", "x", 2, 7)))),
        b"\xff not json",
        json.dumps({**json.loads(encode_trace(sent)), "stream": "nope"}).encode(),
    ]
    rows = [(None, value, "khipu.traces", 0, offset, AT, 0) for offset, value in enumerate(values)]
    parsed = parse_traces(spark.createDataFrame(rows, KAFKA_SCHEMA), ["orders"]).cache()

    assert sorted((r.message_id, r.type, r.offset) for r in valid(parsed).collect()) == [
        ("m10", "RECEIVED", 10),
        ("m13", "RECEIVED", 13),
        ("m14", "RECEIVED", 14),
        ("m9", "SENT", 9),
    ]
    assert {r.message_id: r.prev_offsets for r in archived(parsed).collect()} == {
        "m9": None,
        "m10": None,
        "m13": [10],
        "m14": [13, 12, 10],
    }
    assert sorted(tuple(r) for r in sequences(parsed).collect()) == [
        ("api-e1", "api", 0, 900),
        ("sink-e1", "sink", 0, 1_000),
        ("sink-e1", "sink", 1, 1_001),
        ("sink-e1", "sink", 3, 1_003),
        ("sink-e1", "sink", 4, 1_004),
    ]
    # every pointer whose trace is in the batch is left out: 12 (trace lost) and the mark's x[2]@7 remain
    assert sorted(tuple(r) for r in pointers(parsed).collect()) == [
        ("sink", "local", "demo.orders", 0, 12),
        ("sink", "local", "x", 2, 7),
    ]
    bad = sorted((r.source_offset, r.quarantine_reason, bytes(r.raw_value)) for r in quarantined(parsed).collect())
    assert [(offset, raw) for offset, _, raw in bad] == [(5, values[5]), (6, values[6])]
    assert "not UTF-8" in bad[0][1]
    assert "unknown stream 'nope'" in bad[1][1] and "orders" in bad[1][1]
