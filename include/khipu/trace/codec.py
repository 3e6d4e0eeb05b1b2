"""Wire format of a trace record: versioned JSON, strictly decoded.

Versions 1 to 3 are documented in docs/trace-format.md; emitters write version 3 (version 2 plus
what Kafka's transactions and compaction need: ``key_hash``, ``tombstone`` and ``transactional`` on
SENT traces, ``read_uncommitted`` on RECEIVED ones, each written only when it says something);
readers accept all three. Marks stay version 2. Decoding never
guesses: a record that is not valid UTF-8 JSON, lacks a field, carries a field its version does
not define, or has a value of the wrong type or range raises :class:`TraceDecodeError` naming
the field and what was expected.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping
from typing import Any

from khipu.trace.keys import KEY_HASH_PATTERN, KEY_HASH_RULE
from khipu.trace.model import EmitterMark, Trace, TraceType
from khipu.trace.names import MAX_NAME_CHARS

TRACE_FORMAT_VERSION = 3
MARK_FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2, 3)
MAX_TRACE_BYTES = 16_384
MAX_MARK_BYTES = 262_144  # a mark lists the partitions its emitter received from lately
MAX_MARK_ENTRIES = 4_096
MAX_PREV_OFFSETS = 16
MAX_ID_CHARS = 256
MAX_ATTRIBUTES = 32
MAX_ATTRIBUTE_CHARS = 1024
# An emitter packs the traces it has ready into one trace-topic record: a batch, its traces (and marks) joined by a
# line feed (JSON Lines). A record of one trace, as every emitter wrote before, is a batch of one.
BATCH_MAX_TRACES = 500
BATCH_MAX_BYTES = 65_536  # of traces; a batch that closes with the emitter's mark may be larger by that mark
# Where a record is split: a line feed between "}" and "{". Compact JSON never has one (a line feed in a string
# is escaped), and no single JSON object, however written, has "}" + line feed + "{": a pretty-printed trace stays
# whole. The same regular expression in Python's and Java's dialect.
BATCH_SPLIT_PATTERN = r"(?<=\})\n(?=\{)"
_BATCH_SPLIT = re.compile(BATCH_SPLIT_PATTERN.encode())
MAX_COUNT = 2**63 - 1  # offsets, times and sequence numbers are Kafka's and Java's 64-bit longs
MAX_PARTITION = 2**31 - 1  # partitions are 32-bit ints

NAME_FIELDS = ("stream", "location", "cluster", "topic", "emitter_id")  # names: 1 to MAX_NAME_CHARS characters
_FIELDS = frozenset(
    {
        "v",
        "message_id",
        "stream",
        "location",
        "cluster",
        "type",
        "timestamp_ms",
        "topic",
        "partition",
        "offset",
        "group",
        "emitter_id",
        "emitter_seq",
        "sampling_percent",
        "attributes",
    }
)
V3_FIELDS = ("key_hash", "tombstone", "transactional", "read_uncommitted")  # optional, each only when it says something
_FIELDS_BY_VERSION = {1: _FIELDS, 2: _FIELDS | {"prev_offsets"}, 3: _FIELDS | {"prev_offsets", *V3_FIELDS}}


class TraceDecodeError(ValueError):
    """A trace record could not be decoded; ``field`` names the offending field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"malformed trace: field '{field}': {problem}")
        self.field = field
        self.problem = problem


_quote = json.encoder.encode_basestring  # type: ignore[attr-defined]  # the C string escaper json.dumps uses
_PREV_FORMATS = ("", "%d", "%d,%d", "%d,%d,%d", "%d,%d,%d,%d")  # back-pointers: an emitter writes up to 3
_NAMES: dict[tuple[Any, ...], tuple[str, str, str, str]] = {}  # the quoted names of a hop, formatted once
_MAX_NAMES = 4096


def _names_fragments(names: tuple[Any, ...], trace_type: TraceType) -> tuple[str, str, str, str]:
    stream, location, cluster, _, topic, group, emitter_id, sampling_percent = names
    fragments = (
        f',"stream":{_quote(stream)},"location":{_quote(location)},"cluster":{_quote(cluster)},'
        f'"type":"{TraceType(trace_type).value}","timestamp_ms":',
        f',"topic":{_quote(topic)},"partition":',
        f',"group":{"null" if group is None else _quote(group)},"emitter_id":{_quote(emitter_id)},"emitter_seq":',
        f',"sampling_percent":{float(sampling_percent)!r}',
    )
    if len(_NAMES) >= _MAX_NAMES:
        _NAMES.clear()
    _NAMES[names] = fragments
    return fragments


def _tail(
    attributes: Mapping[str, str],
    prev: str,
    key_hash: str | None,
    tombstone: bool,
    transactional: bool,
    read_uncommitted: bool,
) -> str:
    """The fields after ``prev_offsets`` (its numbers joined in ``prev``), to the closing brace, for a trace with
    attributes or version-3 fields."""
    extra = "" if key_hash is None else ',"key_hash":' + _quote(key_hash)
    if tombstone:
        extra += ',"tombstone":true'
    if transactional:
        extra += ',"transactional":true'
    if read_uncommitted:
        extra += ',"read_uncommitted":true'
    encoded = json.dumps(dict(attributes), separators=(",", ":"), ensure_ascii=False) if attributes else "{}"
    return f',"attributes":{encoded},"prev_offsets":[{prev}]{extra}}}'


def encode_trace(trace: Trace) -> bytes:
    """Serialize a trace to its version-3 JSON bytes (one JSON object, UTF-8); the version-3 fields follow
    ``prev_offsets``, in the order of :data:`V3_FIELDS`, each only when it says something.

    Formatted directly rather than through ``json.dumps`` of a dict: this runs once per traced message in the
    application's process. What a hop's traces share (stream, location, cluster, type, topic, group, emitter,
    sampling rate) is quoted and formatted once, and reused (vectors/ hold the exact bytes).
    """
    (
        message_id, stream, location, cluster, trace_type, timestamp_ms, topic, partition, offset, group, emitter_id,
        emitter_seq, sampling_percent, attributes, prev_offsets, key_hash, tombstone, transactional, read_uncommitted,
    ) = trace  # one unpacking: a NamedTuple's field lookups cost more than the formatting  # fmt: skip
    names = (stream, location, cluster, trace_type == "SENT", topic, group, emitter_id, sampling_percent)
    fragments = _NAMES.get(names) or _names_fragments(names, trace_type)  # (an enum hashes slowly: a bool stands in)
    prev = (
        _PREV_FORMATS[len(prev_offsets)] % tuple(prev_offsets)  # %d: integers only, as the decoder reads them
        if len(prev_offsets) < len(_PREV_FORMATS)
        else ",".join(map(str, map(int, prev_offsets)))
    )
    if attributes or key_hash is not None or tombstone or transactional or read_uncommitted:
        tail = _tail(attributes, prev, key_hash, tombstone, transactional, read_uncommitted)
    else:  # a SENT trace without a key, a RECEIVED trace: most traces
        tail = f',"attributes":{{}},"prev_offsets":[{prev}]}}'
    return (
        f'{{"v":3,"message_id":{_quote(message_id)}{fragments[0]}{int(timestamp_ms)}{fragments[1]}'
        f'{int(partition)},"offset":{int(offset)}{fragments[2]}{int(emitter_seq)}{fragments[3]}{tail}'
    ).encode()


_MARK_FIELDS = frozenset({"v", "mark", "emitter_id", "location", "emitter_seq", "timestamp_ms"})
_MARK_FIELDS_BY_VERSION = {1: _MARK_FIELDS, 2: _MARK_FIELDS | {"received"}, 3: _MARK_FIELDS | {"received"}}


def encode_mark(mark: EmitterMark) -> bytes:
    """Serialize an emitter mark: ``{"v":2,"mark":true,"emitter_id":...,"location":...,"emitter_seq":...,
    "timestamp_ms":...,"received":[[cluster, topic, partition, offset], ...]}``."""
    received = ",".join(
        f"[{_quote(cluster)},{_quote(topic)},{int(partition)},{int(offset)}]"
        for cluster, topic, partition, offset in mark.received
    )
    return (
        f'{{"v":{MARK_FORMAT_VERSION},"mark":true,"emitter_id":{_quote(mark.emitter_id)},"location":{_quote(mark.location)},'
        f'"emitter_seq":{mark.emitter_seq},"timestamp_ms":{mark.timestamp_ms},"received":[{received}]}}'
    ).encode()


def encode_batch(encoded: list[bytes]) -> bytes:
    """One trace-topic record holding several encoded traces and marks, in order: their bytes joined by a line feed,
    none after the last (vectors/batch-records.json holds the exact bytes)."""
    return b"\n".join(encoded)


def split_record(raw: bytes | bytearray | memoryview | None) -> list[bytes | None]:
    """The encoded traces and marks a trace-topic record holds, in order: a batch's lines, or the record whole (a
    record of one trace, a null value, a value that is not UTF-8, anything that is no batch). Each is decoded by
    :func:`decode_record`."""
    if raw is None:
        return [None]
    data = bytes(raw)
    if b"}\n{" not in data:
        return [data]
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:  # not text: no lines to tell apart
        return [data]
    return _BATCH_SPLIT.split(data)


def decode_record(raw: bytes | bytearray | memoryview | None) -> Trace | EmitterMark:
    """Parse a trace-topic record: a trace, or an emitter mark (``"mark": true``, allowed to be larger)."""
    size = 0 if raw is None else len(raw)
    too_big_for_a_trace = TraceDecodeError("<record>", f"record is {size} bytes; at most {MAX_TRACE_BYTES} allowed")
    try:
        record = _load(raw, MAX_MARK_BYTES)
    except TraceDecodeError:
        if size > MAX_TRACE_BYTES:  # an oversized blob: its size is the first thing wrong with it
            raise too_big_for_a_trace from None
        raise
    if record.get("mark") is True:
        version = _version(record)
        allowed = _MARK_FIELDS_BY_VERSION[version]
        unknown = sorted(set(record) - allowed)
        if unknown:
            raise TraceDecodeError(
                unknown[0], f"unknown field in a version-{version} emitter mark; allowed: " + ", ".join(sorted(allowed))
            )
        return EmitterMark(
            _text(record, "emitter_id", MAX_NAME_CHARS),
            _text(record, "location", MAX_NAME_CHARS),
            _non_negative_int(record, "emitter_seq"),
            _non_negative_int(record, "timestamp_ms"),
            _received(record),
        )
    if size > MAX_TRACE_BYTES:
        raise too_big_for_a_trace
    return trace_from_mapping(record)


def decode_trace(raw: bytes | bytearray | memoryview | None) -> Trace:
    """Parse and validate one trace record; raise :class:`TraceDecodeError` when malformed."""
    return trace_from_mapping(_load(raw))


def _load(raw: bytes | bytearray | memoryview | None, max_bytes: int = MAX_TRACE_BYTES) -> dict[str, Any]:
    if raw is None:
        raise TraceDecodeError("<record>", "record value is empty (null); expected a JSON object")
    data = bytes(raw)
    if len(data) > max_bytes:
        raise TraceDecodeError("<record>", f"record is {len(data)} bytes; at most {max_bytes} allowed")
    try:
        record = json.loads(data.decode("utf-8"), object_pairs_hook=_no_repeated_keys, parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise TraceDecodeError("<record>", f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise TraceDecodeError("<record>", f"not JSON ({exc.msg} at char {exc.pos})") from None
    except RecursionError:
        raise TraceDecodeError("<record>", "nested too deeply to be a trace or a mark") from None
    except TraceDecodeError:  # a key given twice (itself a ValueError)
        raise
    except ValueError:  # the one other ValueError json raises: an integer of more digits than Python converts
        longest = f"at most {sys.get_int_max_str_digits():,} digits"
        raise TraceDecodeError("<record>", f"a number longer than the decoder reads ({longest})") from None
    if not isinstance(record, dict):
        raise TraceDecodeError("<record>", f"expected a JSON object, got {type(record).__name__}")
    if b"\\u" in data:  # an escape may name half a surrogate pair: no text, and no UTF-8 store could keep it
        try:
            json.dumps(record, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise TraceDecodeError("<record>", "not text: a \\u escape names a lone UTF-16 surrogate") from None
    return record


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        repeated = sorted({key for key in keys if keys.count(key) > 1})
        raise TraceDecodeError(repeated[0], "appears more than once in one JSON object")
    return dict(pairs)


def _no_constant(name: str) -> Any:
    raise TraceDecodeError("<record>", f"not JSON ({name} is not a JSON number)")


def trace_from_mapping(record: Mapping[str, Any]) -> Trace:
    """Validate an already-parsed record (e.g. a Spark row as a dict) into a :class:`Trace`."""
    version = _version(record)
    allowed = _FIELDS_BY_VERSION[version]
    unknown = sorted(set(record) - allowed)
    if unknown:
        raise TraceDecodeError(
            unknown[0], f"unknown field in format version {version}; allowed: {', '.join(sorted(allowed))}"
        )

    message_id = _text(record, "message_id", MAX_ID_CHARS)
    names = {name: _text(record, name, MAX_NAME_CHARS) for name in NAME_FIELDS}
    trace_type = _trace_type(record)
    group = record.get("group")
    if trace_type is TraceType.RECEIVED:
        group = _text(record, "group", MAX_NAME_CHARS)
    elif group is not None:
        raise TraceDecodeError("group", f"must be null for SENT traces, got {group!r}")
    prev_offsets = _prev_offsets(record, trace_type)
    sent = trace_type is TraceType.SENT

    return Trace(
        message_id=message_id,
        stream=names["stream"],
        location=names["location"],
        cluster=names["cluster"],
        type=trace_type,
        timestamp_ms=_non_negative_int(record, "timestamp_ms"),
        topic=names["topic"],
        partition=_non_negative_int(record, "partition", MAX_PARTITION),
        offset=_non_negative_int(record, "offset"),
        group=group,
        emitter_id=names["emitter_id"],
        emitter_seq=_non_negative_int(record, "emitter_seq"),
        sampling_percent=_sampling_percent(record),
        attributes=_attributes(record),
        prev_offsets=prev_offsets,
        key_hash=_key_hash(record, sent),
        tombstone=_flag(record, "tombstone", sent, "SENT"),
        transactional=_flag(record, "transactional", sent, "SENT"),
        read_uncommitted=_flag(record, "read_uncommitted", not sent, "RECEIVED"),
    )


def _key_hash(record: Mapping[str, Any], sent: bool) -> str | None:
    value = record.get("key_hash")
    if value is None:
        return None
    if not sent:
        raise TraceDecodeError("key_hash", f"only SENT traces carry a key hash, got {value!r}")
    if not isinstance(value, str) or not KEY_HASH_PATTERN.fullmatch(value):  # fullmatch: no line feed after it
        raise TraceDecodeError("key_hash", f"expected {KEY_HASH_RULE}, got {value!r}")
    return value


def _flag(record: Mapping[str, Any], field: str, allowed: bool, trace_type: str) -> bool:
    """An optional boolean; ``true`` only on the type of trace it is about."""
    value = record.get(field)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise TraceDecodeError(field, f"expected true or false, got {type(value).__name__} {value!r}")
    if value and not allowed:
        raise TraceDecodeError(field, f"only {trace_type} traces may say true")
    return value


def _version(record: Mapping[str, Any]) -> int:
    version = record.get("v")
    if type(version) is not int or version not in READABLE_VERSIONS:  # not True, not 2.0
        raise TraceDecodeError(
            "v", f"unsupported format version {version!r}; expected one of {', '.join(map(str, READABLE_VERSIONS))}"
        )
    return int(version)


def _prev_offsets(record: Mapping[str, Any], trace_type: TraceType) -> tuple[int, ...]:
    value = record.get("prev_offsets")
    if value is None or value == []:
        return ()
    if trace_type is TraceType.SENT:
        raise TraceDecodeError("prev_offsets", f"must be empty for SENT traces, got {value!r}")
    if not isinstance(value, list):
        raise TraceDecodeError("prev_offsets", f"expected a list of offsets, got {type(value).__name__} {value!r}")
    if len(value) > MAX_PREV_OFFSETS:
        raise TraceDecodeError("prev_offsets", f"{len(value)} offsets; at most {MAX_PREV_OFFSETS} allowed")
    for offset in value:
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= MAX_COUNT:
            raise TraceDecodeError("prev_offsets", f"expected integers >= 0, got {offset!r}")
    return tuple(value)


def _received(record: Mapping[str, Any]) -> tuple[tuple[str, str, int, int], ...]:
    value = record.get("received")
    if value is None:
        return ()
    if not isinstance(value, list):
        raise TraceDecodeError("received", f"expected a list of [cluster, topic, partition, offset], got {value!r}")
    if len(value) > MAX_MARK_ENTRIES:
        raise TraceDecodeError("received", f"{len(value)} entries; at most {MAX_MARK_ENTRIES} allowed")
    entries = []
    for index, entry in enumerate(value):
        field = f"received[{index}]"
        if not isinstance(entry, list) or len(entry) != 4:
            raise TraceDecodeError(field, f"expected [cluster, topic, partition, offset], got {entry!r}")
        cluster, topic, partition, offset = entry
        named = {"cluster": cluster, "topic": topic}
        for name, text in named.items():
            if not isinstance(text, str) or not 0 < len(text) <= MAX_NAME_CHARS:
                raise TraceDecodeError(field, f"{name}: expected a name of 1-{MAX_NAME_CHARS} characters, got {text!r}")
        for name, number, largest in (("partition", partition, MAX_PARTITION), ("offset", offset, MAX_COUNT)):
            if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number <= largest:
                raise TraceDecodeError(field, f"{name}: expected an integer >= 0, got {number!r}")
        entries.append((cluster, topic, partition, offset))
    return tuple(entries)


def _present(record: Mapping[str, Any], field: str) -> Any:
    if field not in record or record[field] is None:
        raise TraceDecodeError(field, "missing; this field is required")
    return record[field]


def _text(record: Mapping[str, Any], field: str, max_chars: int) -> str:
    value = _present(record, field)
    if not isinstance(value, str):
        raise TraceDecodeError(field, f"expected a string, got {type(value).__name__} {value!r}")
    if not value:
        raise TraceDecodeError(field, "expected a non-empty string")
    if len(value) > max_chars:
        raise TraceDecodeError(field, f"{len(value)} characters; at most {max_chars} allowed")
    return value


def _non_negative_int(record: Mapping[str, Any], field: str, largest: int = MAX_COUNT) -> int:
    value = _present(record, field)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceDecodeError(field, f"expected an integer >= 0, got {type(value).__name__} {value!r}")
    if value < 0:
        raise TraceDecodeError(field, f"expected an integer >= 0, got {value}")
    if value > largest:
        bits = 32 if largest == MAX_PARTITION else 64
        raise TraceDecodeError(field, f"expected an integer that fits {bits} bits (at most {largest}), got {value}")
    return value


def _trace_type(record: Mapping[str, Any]) -> TraceType:
    value = _present(record, "type")
    try:
        return TraceType(value)
    except ValueError:
        raise TraceDecodeError("type", f"expected 'SENT' or 'RECEIVED', got {value!r}") from None


def _sampling_percent(record: Mapping[str, Any]) -> float:
    value = _present(record, "sampling_percent")
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (
            isinstance(value, float)
            and not math.isfinite(value)  # an int is finite, however long (too long for a float)
        )
    ):
        raise TraceDecodeError("sampling_percent", f"expected a number in (0, 100], got {value!r}")
    if not 0 < value <= 100:
        raise TraceDecodeError("sampling_percent", f"expected a number in (0, 100], got {value}")
    return float(value)


def _attributes(record: Mapping[str, Any]) -> dict[str, str]:
    value = record.get("attributes")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TraceDecodeError("attributes", f"expected an object of string values, got {type(value).__name__}")
    if len(value) > MAX_ATTRIBUTES:
        raise TraceDecodeError("attributes", f"{len(value)} entries; at most {MAX_ATTRIBUTES} allowed")
    for key, item in value.items():
        if not isinstance(item, str):
            raise TraceDecodeError(f"attributes.{key}", f"expected a string, got {type(item).__name__} {item!r}")
        if len(item) > MAX_ATTRIBUTE_CHARS:
            raise TraceDecodeError(
                f"attributes.{key}", f"{len(item)} characters; at most {MAX_ATTRIBUTE_CHARS} allowed"
            )
    return dict(value)
