"""The trace wire format: round-trips exactly and rejects malformed records naming the field."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from khipu.trace import MAX_TRACE_BYTES, Trace, TraceDecodeError, TraceType, decode_trace, encode_trace
from khipu.trace.codec import (
    TRACE_FORMAT_VERSION,
    decode_record,
    encode_batch,
    encode_mark,
    split_record,
)
from khipu.trace.keys import key_hash
from khipu.trace.model import EmitterMark


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
        sent_trace(type=TraceType.RECEIVED, group="enricher", prev_offsets=(40, 39, 37)),
        sent_trace(message_id="ünïcode-✓", sampling_percent=100.0, offset=0, partition=0),
    ],
)
def test_encoded_trace_decodes_to_an_equal_trace(trace: Trace) -> None:
    assert decode_trace(encode_trace(trace)) == trace


def test_encoding_carries_the_format_version() -> None:
    assert json.loads(encode_trace(sent_trace()))["v"] == TRACE_FORMAT_VERSION == 3


def test_version_3_fields_round_trip_and_are_written_only_when_they_say_something() -> None:
    traced = sent_trace(key_hash=key_hash(b"customer-42"), tombstone=True, transactional=True)
    assert decode_trace(encode_trace(traced)) == traced
    received = sent_trace(type=TraceType.RECEIVED, group="sink", attributes={}, read_uncommitted=True)
    assert decode_trace(encode_trace(received)) == received
    plain = json.loads(encode_trace(sent_trace()))
    assert not set(plain) & {"key_hash", "tombstone", "transactional", "read_uncommitted"}
    written = json.loads(encode_trace(traced))
    assert (written["key_hash"], written["tombstone"], written["transactional"]) == (
        hashlib.sha256(b"customer-42").hexdigest()[:16],
        True,
        True,
    )


def test_a_key_hash_is_the_first_8_bytes_of_the_keys_sha256() -> None:
    assert key_hash(b"customer-42") == hashlib.sha256(b"customer-42").hexdigest()[:16]
    assert key_hash("customer-42") == key_hash(b"customer-42")  # a str key is its UTF-8 bytes
    assert key_hash(None) is None and key_hash(b"") == hashlib.sha256(b"").hexdigest()[:16]


def test_a_version_2_trace_still_decodes_with_no_version_3_fields() -> None:
    version_2 = {**record(), "v": 2}
    assert decode_trace(raw(version_2)) == sent_trace()
    explicit_false = record(tombstone=False, transactional=False)
    assert decode_trace(raw(explicit_false)) == sent_trace()


def test_a_version_1_trace_still_decodes_without_a_back_pointer() -> None:
    version_1 = {k: v for k, v in record(v=1).items() if k != "prev_offsets"}
    assert decode_trace(raw(version_1)) == sent_trace()


def test_marks_round_trip_with_the_partitions_received_lately() -> None:
    mark = EmitterMark("sink-1a2b3c4d", "sink", 12, 1_700_000_000_000, (("local", "orders", 0, 41), ("b", "t", 3, 0)))
    assert decode_record(encode_mark(mark)) == mark
    version_1 = {"v": 1, "mark": True, "emitter_id": "sink-1", "location": "sink", "emitter_seq": 3, "timestamp_ms": 5}
    assert decode_record(raw(version_1)) == EmitterMark("sink-1", "sink", 3, 5)


def test_marks_may_be_larger_than_a_trace_but_an_oversized_trace_or_blob_is_named_by_its_size() -> None:
    many = tuple(("local", f"topic-{i:04d}", i % 7, i) for i in range(900))
    mark = EmitterMark("sink-1", "sink", 3, 5, many)
    assert len(encode_mark(mark)) > MAX_TRACE_BYTES and decode_record(encode_mark(mark)) == mark
    big_trace = encode_trace(sent_trace(attributes={f"k{i}": "v" * 1000 for i in range(20)}))
    for blob in (b"x" * 20_000, big_trace):
        with pytest.raises(TraceDecodeError) as caught:
            decode_record(blob)
        assert caught.value.field == "<record>" and f"at most {MAX_TRACE_BYTES} allowed" in str(caught.value)


def test_a_batch_is_its_encoded_traces_and_marks_joined_by_line_feeds_and_splits_back_into_them() -> None:
    received = sent_trace(type=TraceType.RECEIVED, group="sink", attributes={"note": "a}\n{b"}, prev_offsets=(40,))
    mark = EmitterMark("sink-1", "sink", 9, 1_700_000_000_500, (("local", "orders", 2, 41),))
    lines = [encode_trace(sent_trace()), encode_trace(received), encode_mark(mark)]
    batch = encode_batch(lines)
    assert batch.count(b"\n") == 2 and not batch.endswith(b"\n")  # JSON Lines, none after the last
    assert split_record(batch) == lines  # a line feed inside a string is escaped: "a}\\n{b" does not split
    assert [decode_record(line) for line in split_record(batch)] == [sent_trace(), received, mark]
    assert split_record(memoryview(batch)) == lines and split_record(bytearray(batch)) == lines


def test_a_record_that_is_no_batch_is_read_whole() -> None:
    one = encode_trace(sent_trace())
    assert split_record(encode_batch([one])) == [one]  # a record of one trace is a batch of one
    pretty = json.dumps(record(), indent=2).encode()  # line feeds, but never "}" + line feed + "{" in one object
    assert b"\n" in pretty and split_record(pretty) == [pretty] and decode_record(pretty) == sent_trace()
    nested = json.dumps({**record(), "attributes": {"a": "b"}}, indent=1).encode()  # an object inside the object
    assert split_record(nested) == [nested]
    assert split_record(None) == [None] and split_record(b"") == [b""]
    assert split_record(b"}\r\n{") == [b"}\r\n{"]  # only a bare line feed between the two braces splits


def test_a_batch_splits_only_between_a_closing_and_an_opening_brace_and_keeps_every_byte() -> None:
    assert split_record(b'{"a":1}\n{"b":2}\n\n{"c":3}') == [b'{"a":1}', b'{"b":2}\n\n{"c":3}']
    assert split_record(b"{}\n{}\n{}") == [b"{}", b"{}", b"{}"]
    assert split_record(b"x}\n{y") == [b"x}", b"{y"]  # not JSON on either side: each line is malformed on its own
    # a malformed line is that line's problem only
    lines = split_record(
        encode_batch([encode_trace(sent_trace()), b'{"v": 3}', encode_mark(EmitterMark("e", "l", 1, 2))])
    )
    with pytest.raises(TraceDecodeError) as caught:
        decode_record(lines[1])
    assert caught.value.field == "message_id"
    assert decode_record(lines[0]) == sent_trace() and isinstance(decode_record(lines[2]), EmitterMark)


MALFORMED_MARKS = [
    ({"received": [["local", "orders", 0]]}, "received[0]", "expected [cluster, topic, partition, offset]"),
    ({"received": [["local", "orders", -1, 4]]}, "received[0]", "partition: expected an integer >= 0"),
    ({"received": [["", "orders", 0, 4]]}, "received[0]", "cluster: expected a name"),
    ({"received": {"orders": 4}}, "received", "expected a list"),
    ({"v": 1, "received": []}, "received", "unknown field in a version-1 emitter mark"),
]


@pytest.mark.parametrize(("changes", "field", "explanation"), MALFORMED_MARKS)
def test_a_malformed_mark_is_rejected_naming_the_field(changes: dict[str, Any], field: str, explanation: str) -> None:
    mark = json.loads(encode_mark(EmitterMark("sink-1", "sink", 3, 5)))
    with pytest.raises(TraceDecodeError) as caught:
        decode_record(raw(mark | changes))
    assert caught.value.field == field
    assert explanation in str(caught.value)


# Each case: the bad record, the field the error must name, and a fragment of the explanation.
MALFORMED = [
    # 1. not JSON at all
    (b"\x00\x01 not json", "<record>", "not JSON"),
    # 2. invalid UTF-8
    (b'{"v": 1, "message_id": "\xff"}', "<record>", "not UTF-8"),
    # 3. JSON, but an array rather than an object
    (b"[1, 2]", "<record>", "expected a JSON object"),
    # 4. a future format version this decoder does not know
    (raw(record(v=4)), "v", "unsupported format version 4"),
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
    # 19. a back-pointer is for RECEIVED traces only
    (raw(record(prev_offsets=[3])), "prev_offsets", "must be empty for SENT"),
    # 20. ... and are offsets
    (raw(record(type="RECEIVED", group="g", prev_offsets=[4, -2])), "prev_offsets", "integers >= 0, got -2"),
    # 21. ... in a list
    (raw(record(type="RECEIVED", group="g", prev_offsets=4)), "prev_offsets", "expected a list of offsets"),
    # 22. ... a short one
    (raw(record(type="RECEIVED", group="g", prev_offsets=list(range(17)))), "prev_offsets", "at most 16"),
    # 23. version 1 has no back-pointers
    (raw(record(v=1, prev_offsets=[])), "prev_offsets", "unknown field in format version 1"),
    # 24. a field given twice: which one counts would be a guess
    (raw(record())[:-1] + b', "offset": 42}', "offset", "appears more than once"),
    # 25. NaN is not a JSON number (Python's json would read it)
    (raw(record()).replace(b"12.5", b"NaN"), "<record>", "NaN is not a JSON number"),
    # 26. version 2 has no key hash (nor any version-3 field)
    (raw(record(v=2, key_hash="0123456789abcdef")), "key_hash", "unknown field in format version 2"),
    # 27. a key hash is 16 lowercase hex digits, never the key
    (raw(record(key_hash="customer-42")), "key_hash", "16 lowercase hex digits"),
    # 28. ... and only a SENT trace has one (the record's key is the writer's)
    (raw(record(type="RECEIVED", group="g", key_hash="0123456789abcdef")), "key_hash", "only SENT traces"),
    # 29. flags are JSON booleans
    (raw(record(transactional="yes")), "transactional", "expected true or false"),
    # 30. a consumer does not write a tombstone
    (raw(record(type="RECEIVED", group="g", tombstone=True)), "tombstone", "only SENT traces"),
    # 31. ... nor write transactionally
    (raw(record(type="RECEIVED", group="g", transactional=True)), "transactional", "only SENT traces"),
    # 32. a producer has no isolation level
    (raw(record(read_uncommitted=True)), "read_uncommitted", "only RECEIVED traces"),
    # 33. half a surrogate pair is no text: json reads it, no UTF-8 store could keep it (a whole pair is text)
    (raw(record(message_id="m-\ud800")), "<record>", "lone UTF-16 surrogate"),
    # 34. what Python's json cannot read is malformed, never another exception: nesting past its recursion limit,
    (b"[" * 3000, "<record>", "nested too deeply"),
    # 35. ... an integer of more digits than Python converts
    (b'{"v":3,"offset":' + b"1" * 4301 + b"}", "<record>", "a number longer than the decoder reads"),
    # 36. an integer too large for a float is a number, out of range
    (raw(record(sampling_percent=10**400)), "sampling_percent", "expected a number in (0, 100]"),
    # 37. a key hash is exactly its 16 digits: no line feed after them
    (raw(record(key_hash="0123456789abcdef\n")), "key_hash", "16 lowercase hex digits"),
]


@pytest.mark.parametrize(("data", "field", "explanation"), MALFORMED)
def test_malformed_record_is_rejected_naming_the_field(data: bytes | None, field: str, explanation: str) -> None:
    with pytest.raises(TraceDecodeError) as caught:
        decode_trace(data)
    assert caught.value.field == field
    assert explanation in str(caught.value)
