"""The trace wire format: round-trips exactly and rejects malformed records naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from khipu.trace import MAX_TRACE_BYTES, Trace, TraceDecodeError, TraceType, decode_trace, encode_trace


def sent_trace(**changes: Any) -> Trace:
    fields: dict[str, Any] = dict(
        message_id="m-1",
        stream="orders",
        location="orders-api",
        cluster="local",
        type=TraceType.SENT,
        timestamp_ms=1_700_000_000_123,
        topic="orders",
        partition=2,
        offset=41,
        group=None,
        emitter_id="orders-api-1a2b3c4d",
        emitter_seq=7,
        sampling_percent=12.5,
        attributes={"row_id": "991"},
    )
    fields.update(changes)
    return Trace(**fields)


def record(**changes: Any) -> dict[str, Any]:
    base = json.loads(encode_trace(sent_trace()))
    base.update(changes)
    return base


def raw(data: dict[str, Any]) -> bytes:
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    "trace",
    [
        sent_trace(),
        sent_trace(type=TraceType.RECEIVED, group="enricher", attributes={}),
        sent_trace(message_id="ünïcode-✓", sampling_percent=100.0, offset=0, partition=0),
    ],
)
def test_encoded_trace_decodes_to_an_equal_trace(trace: Trace) -> None:
    assert decode_trace(encode_trace(trace)) == trace


def test_encoding_carries_the_format_version() -> None:
    assert json.loads(encode_trace(sent_trace()))["v"] == 1


# Each case: the bad record, the field the error must name, and a fragment of the explanation.
MALFORMED = [
    # 1. not JSON at all
    (b"\x00\x01 not json", "<record>", "not JSON"),
    # 2. invalid UTF-8
    (b'{"v": 1, "message_id": "\xff"}', "<record>", "not UTF-8"),
    # 3. JSON, but an array rather than an object
    (b"[1, 2]", "<record>", "expected a JSON object"),
    # 4. a future format version this decoder does not know
    (raw(record(v=2)), "v", "unsupported format version 2"),
    # 5. a field the version does not define
    (raw(record(colour="red")), "colour", "unknown field"),
    # 6. required field missing
    (raw({k: v for k, v in record().items() if k != "topic"}), "topic", "missing"),
    # 7. wrong type for a string field
    (raw(record(stream=42)), "stream", "expected a string, got int"),
    # 8. empty id
    (raw(record(message_id="")), "message_id", "non-empty"),
    # 9. negative offset
    (raw(record(offset=-1)), "offset", "integer >= 0, got -1"),
    # 10. boolean is not an integer, even though Python says True == 1
    (raw(record(partition=True)), "partition", "expected an integer"),
    # 11. float offset
    (raw(record(offset=1.5)), "offset", "expected an integer"),
    # 12. unknown trace type
    (raw(record(type="ACKED")), "type", "'SENT' or 'RECEIVED'"),
    # 13. RECEIVED must name its consumer group
    (raw(record(type="RECEIVED", group=None)), "group", "missing"),
    # 14. SENT must not carry a group
    (raw(record(group="enricher")), "group", "must be null for SENT"),
    # 15. sampling outside (0, 100]
    (raw(record(sampling_percent=0)), "sampling_percent", "(0, 100]"),
    # 16. attribute values are strings
    (raw(record(attributes={"row_id": 991})), "attributes.row_id", "expected a string"),
    # 17. oversized record
    (
        raw(record(attributes={"blob": "x" * 1000} | {f"k{i}": "y" for i in range(20)})) + b" " * MAX_TRACE_BYTES,
        "<record>",
        f"at most {MAX_TRACE_BYTES}",
    ),
    # 18. null value (a tombstone on the trace topic)
    (None, "<record>", "empty"),
]


@pytest.mark.parametrize(("data", "field", "explanation"), MALFORMED)
def test_malformed_record_is_rejected_naming_the_field(data: bytes | None, field: str, explanation: str) -> None:
    with pytest.raises(TraceDecodeError) as caught:
        decode_trace(data)
    assert caught.value.field == field
    assert explanation in str(caught.value)
