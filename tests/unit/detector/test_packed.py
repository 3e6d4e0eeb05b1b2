"""Records packed by bucket for the shuffle, and unpacked as they were (:mod:`khipu.detector.packed`); a task's
records packed as they are decoded: ``test_parse.py``."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from khipu.detector.bucket import VERDICT_FIELDS
from khipu.detector.packed import (
    PACKED_FIELDS,
    RECORD_FIELDS,
    RECORDS,
    by_bucket,
    ipc_bytes,
    unanswered_asks,
    unanswered_text,
    unpack,
)
from khipu.detector.records import TRACE
from khipu.trace.archive import spark_ddl


def test_a_table_is_cut_one_packed_row_per_bucket_each_blob_holding_exactly_that_buckets_rows() -> None:
    rows: list[dict[str, Any]] = [{"bucket": b, "kind": TRACE, "offset": n} for n, b in enumerate([3, 0, 3, 1, 0])]
    out = by_bucket(pa.Table.from_pylist(rows, schema=RECORD_FIELDS), RECORDS)
    assert out.schema == PACKED_FIELDS
    assert [(row["bucket"], row["kind"]) for row in out.to_pylist()] == [(0, RECORDS), (1, RECORDS), (3, RECORDS)]
    held = {row["bucket"]: unpack([row["blob"]], RECORD_FIELDS).column("offset").to_pylist() for row in out.to_pylist()}
    assert {bucket: sorted(offsets) for bucket, offsets in held.items()} == {0: [1, 4], 1: [3], 3: [0, 2]}


def test_unpacking_no_blobs_gives_an_empty_table_of_the_schema_and_skips_a_bucket_without_verdicts() -> None:
    assert unpack([], VERDICT_FIELDS).schema == VERDICT_FIELDS
    verdict = {"message_id": "m1", "hop": 2, "verdict": "LOST", "decided_ms": 7}
    one = ipc_bytes(pa.Table.from_pylist([verdict], schema=VERDICT_FIELDS))
    expected = [{name: verdict.get(name) for name in VERDICT_FIELDS.names}]
    assert unpack([None, one], VERDICT_FIELDS).to_pylist() == expected
    column = pa.chunked_array([pa.array([None, one], pa.binary()), pa.array([one], pa.binary())])  # as collected
    assert unpack(column, VERDICT_FIELDS).to_pylist() == expected * 2


def test_the_spark_ddl_names_every_field_with_the_type_spark_gives_back() -> None:
    ddl = spark_ddl(pa.schema([("bucket", pa.int32()), ("blob", pa.binary()), ("ok", pa.bool_())]))
    assert ddl == "`bucket` int, `blob` binary, `ok` boolean"


def test_the_asks_each_evaluation_left_unanswered_are_summed_per_cluster_for_the_batch() -> None:
    rows = [unanswered_text({"west": 2, "local": 1}), None, unanswered_text({}), unanswered_text({"local": 3})]
    assert rows[2] is None  # every ask answered: nothing on the row
    assert unanswered_asks(rows) == {"local": 4, "west": 2}
    assert unanswered_asks([None, None]) == {}
