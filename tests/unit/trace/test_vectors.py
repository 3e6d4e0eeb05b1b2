"""The shared test vectors (vectors/): the Python codec writes and reads exactly their bytes and fields.

The Java interceptors' tests (jvm/tracing, run by Surefire in ``make test``) hold the Java encoder to the same
files, so a trace, a header set, a sampling decision or a key hash is the same in both languages. The vectors are
data, written once and checked by hand; a change to the format changes them on purpose, never by regenerating.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from khipu.detector.parse import ENCODER_TEMPLATE
from khipu.trace.codec import decode_record, encode_batch, encode_mark, encode_trace, split_record
from khipu.trace.keys import key_hash
from khipu.trace.model import EmitterMark, Trace, TraceType
from khipu.trace.sampling import MessageIds, sampling_bucket, sampling_threshold
from khipu.tracing.headers import HeaderValue, TraceContext, resend_mark, trace_context

VECTORS = Path(__file__).resolve().parents[3] / "vectors"


def load(name: str) -> Any:
    return json.loads((VECTORS / name).read_text(encoding="utf-8"))


RECORDS = load("trace-records.json")
HEADERS = load("headers.json")
SAMPLING = load("sampling.json")
BATCHES = load("batch-records.json")
LINE_BYTES = {v["name"]: v["bytes"].encode("utf-8") for v in RECORDS["traces"] + RECORDS["marks"]}


def as_trace(fields: dict[str, Any]) -> Trace:
    return Trace(
        **{**fields, "type": TraceType(fields["type"]), "prev_offsets": tuple(fields["prev_offsets"])},
    )


def header_value(header: dict[str, Any]) -> bytes | None:
    if "value_hex" in header:  # bytes that are not UTF-8
        return bytes.fromhex(header["value_hex"])
    return None if header["value"] is None else str(header["value"]).encode()


def header_pairs(headers: list[dict[str, Any]]) -> list[tuple[str, HeaderValue]]:
    return [(h["name"], header_value(h)) for h in headers]


@pytest.mark.parametrize("vector", RECORDS["traces"], ids=lambda v: v["name"])
def test_each_trace_vector_is_written_byte_for_byte_and_read_back(vector: dict[str, Any]) -> None:
    trace = as_trace(vector["trace"])
    raw = vector["bytes"].encode("utf-8")
    assert encode_trace(trace) == raw
    assert decode_record(raw) == trace


@pytest.mark.parametrize("vector", BATCHES["batches"], ids=lambda v: v["name"])
def test_a_batch_vector_is_its_lines_joined_and_splits_back_into_them(vector: dict[str, Any]) -> None:
    lines = [LINE_BYTES[name] for name in vector["lines"]]
    raw = vector["bytes"].encode("utf-8")
    assert encode_batch(lines) == raw
    assert split_record(raw) == lines
    assert [decode_record(line) for line in split_record(raw)] == [decode_record(line) for line in lines]


@pytest.mark.parametrize("vector", BATCHES["whole"], ids=lambda v: v["name"])
def test_a_record_that_is_no_batch_is_read_whole_however_it_is_written(vector: dict[str, Any]) -> None:
    raw = vector["bytes"].encode("utf-8")
    assert b"\n" in raw or b"\\n" in raw
    assert split_record(raw) == [raw]


@pytest.mark.parametrize("vector", RECORDS["traces"], ids=lambda v: v["name"])
def test_the_detector_reads_a_vector_by_its_cheapest_path_unless_it_has_attributes(vector: dict[str, Any]) -> None:
    """The parity table of docs/trace-format.md: any encoder writing these bytes (Python's, the JVM interceptors')
    takes the detector's template path, except a trace with attributes (a resent record's RECEIVED trace), which
    is read by the codec. ENCODER_TEMPLATE is read alike by RE2 (Arrow's, where the detector matches it) and by
    Python's re; tests/unit/detector/test_parse.py checks the detector takes that path for these same vectors."""
    templated = re.fullmatch(ENCODER_TEMPLATE, vector["bytes"]) is not None
    assert templated == (not vector["trace"]["attributes"])


@pytest.mark.parametrize("vector", RECORDS["marks"], ids=lambda v: v["name"])
def test_the_encoder_writes_each_mark_vector_byte_for_byte(vector: dict[str, Any]) -> None:
    fields = vector["mark"]
    mark = EmitterMark(
        fields["emitter_id"], fields["location"], fields["emitter_seq"], fields["timestamp_ms"],
        tuple(tuple(entry) for entry in fields["received"]),
    )  # fmt: skip
    raw = vector["bytes"].encode("utf-8")
    assert encode_mark(mark) == raw
    assert decode_record(raw) == mark


@pytest.mark.parametrize("vector", SAMPLING["buckets"], ids=lambda v: v["id"][:24])
def test_sampling_buckets(vector: dict[str, Any]) -> None:
    assert sampling_bucket(vector["id"]) == vector["bucket"]


@pytest.mark.parametrize("vector", SAMPLING["thresholds"], ids=lambda v: str(v["percent"]))
def test_sampling_thresholds(vector: dict[str, Any]) -> None:
    assert sampling_threshold(vector["percent"]) == vector["threshold"]


def test_generated_ids_have_the_shape_the_vectors_give_and_carry_their_bucket() -> None:
    ids = MessageIds()
    for bucket in (0, 42, 9999):
        generated = ids.with_bucket(bucket)
        assert re.fullmatch(SAMPLING["generated_id_pattern"], generated), generated
        assert sampling_bucket(generated) == bucket


@pytest.mark.parametrize("vector", load("key-hashes.json"), ids=lambda v: v["key_hex"] or "empty")
def test_key_hashes(vector: dict[str, Any]) -> None:
    assert key_hash(bytes.fromhex(vector["key_hex"])) == vector["key_hash"]


@pytest.mark.parametrize("vector", HEADERS["read"], ids=lambda v: v["name"])
def test_header_sets_are_read_as_the_vectors_say(vector: dict[str, Any]) -> None:
    pairs = header_pairs(vector["headers"])
    context = trace_context(pairs)
    assert (None if context is None else context._asdict()) == vector["context"]
    mark = resend_mark(pairs)
    assert (None if mark is None else mark._asdict()) == vector["resend"]


@pytest.mark.parametrize("vector", HEADERS["written"], ids=lambda v: repr(v["context"]["sampling_percent"]))
def test_trace_headers_are_written_as_the_vectors_say(vector: dict[str, Any]) -> None:
    written = TraceContext(**vector["context"]).as_headers()
    assert written == header_pairs(vector["headers"])
