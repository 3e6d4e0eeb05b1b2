"""Records packed by bucket for the shuffle, and unpacked as they were (:mod:`khipu.detector.packed`)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from khipu.detector import packed
from khipu.detector.bucket import VERDICT_FIELDS
from khipu.detector.packed import PACKED_FIELDS, RECORD_FIELDS, RECORDS, ipc_bytes, pack_records, unpack
from khipu.detector.records import TRACE
from khipu.trace.archive import spark_ddl


def records(buckets: list[int], first: int = 0) -> pa.RecordBatch:
    rows: list[dict[str, Any]] = [
        {"bucket": b, "kind": TRACE, "message_id": f"m{first + n}", "offset": first + n, "raw_value": b"{}"}
        for n, b in enumerate(buckets)
    ]
    return pa.RecordBatch.from_pylist(rows, schema=RECORD_FIELDS)


def test_a_tasks_records_are_packed_one_row_per_bucket_each_holding_exactly_that_buckets_records() -> None:
    out = list(pack_records(iter([records([3, 0, 3, 1]), records([], 4), records([0, 3], 4)])))
    assert len(out) == 1 and out[0].schema == PACKED_FIELDS
    rows = out[0].to_pylist()
    assert [(row["bucket"], row["kind"]) for row in rows] == [(0, RECORDS), (1, RECORDS), (3, RECORDS)]
    held = {row["bucket"]: sorted(unpack([row["blob"]], RECORD_FIELDS).column("offset").to_pylist()) for row in rows}
    assert held == {0: [1, 4], 1: [3], 3: [0, 2, 5]}


def test_a_large_task_is_packed_as_it_goes_and_nothing_is_lost_or_doubled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packed, "PACK_ROWS", 5)
    batches = [records([n % 3 for n in range(4)], first=4 * k) for k in range(5)]  # 20 records, 4 at a time
    out = list(pack_records(iter(batches)))
    assert [batch.num_rows for batch in out] == [3, 3, 3]  # after 8 records, after 16, and the 4 left at the end
    table = unpack([b for batch in out for b in batch.column("blob").to_pylist()], RECORD_FIELDS)
    assert sorted(table.column("offset").to_pylist()) == list(range(20))
    assert table.schema == RECORD_FIELDS


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
