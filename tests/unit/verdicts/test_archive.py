"""The verdict archive: Parquet by hour and micro-batch, idempotent per batch, with its decided-index."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from khipu.store.verdicts import VERDICT_COLUMNS
from khipu.trace.archive import HOUR_MS, hour_of
from khipu.verdicts.archive import (
    COLUMNS,
    SCHEMA,
    DecidedIndex,
    Decision,
    VerdictArchive,
    VerdictArchiveError,
    verdict_table,
)

T0 = 1_795_000_000_000 // HOUR_MS * HOUR_MS  # an hour boundary
HOP = "local/in -> s1"


def delivered(message_id: str, decided_ms: int, hop: str = HOP, **extra: Any) -> dict[str, Any]:
    """A verdict row as the verdict book makes it (``group``, not ``group_id``)."""
    return {
        "message_id": message_id,
        "hop": hop,
        "stream": "orders",
        "hop_kind": "read",
        "verdict": "DELIVERED",
        "cause": None,
        "count": 1,
        "topic": "in",
        "partition": 0,
        "offset": 7,
        "group": "s1",
        "location": None,
        "observed_ms": decided_ms - 100,
        "latency_ms": 40,
        "e2e_latency_ms": None,
        "decided_ms": decided_ms,
        "detail": "received",
        "first_seen_ms": decided_ms - 1_000,
        "decided_by": "detector",
        "evidence_kind": None,
        "late_evidence": False,
        **extra,
    }


def test_the_columns_are_the_sql_verdict_tables() -> None:
    assert COLUMNS == ("message_id", "hop", *VERDICT_COLUMNS)


def test_a_batch_reads_back_as_written_with_its_none_values(tmp_path: Path) -> None:
    archive = VerdictArchive(tmp_path)
    rows = [delivered("m2", T0 + 5), delivered("m1", T0 + 9, hop="p -> local/in", group=None, partition=None)]
    assert archive.write_batch(3, verdict_table(rows)) == [hour_of(T0)]
    read = archive.read_messages(["m1", "m2", "m3"], hours=[hour_of(T0)])
    expected = [
        {**{k: v for k, v in row.items() if k != "group"}, "group_id": row["group"]}
        for row in sorted(rows, key=lambda r: r["message_id"])
    ]
    assert read == expected
    assert read[0]["partition"] is None and read[0]["group_id"] is None and read[0]["e2e_latency_ms"] is None
    (path,) = (tmp_path / f"hour={hour_of(T0)}").glob("batch_id=3/*.parquet")
    assert path.name == "part-0.parquet" and pq.read_schema(path).equals(SCHEMA)


def test_rows_are_sorted_by_message_id_within_a_file_and_split_by_the_hour_decided(tmp_path: Path) -> None:
    archive = VerdictArchive(tmp_path)
    rows = [delivered(f"m{n:03d}", T0 + (HOUR_MS if n % 3 == 0 else 0) + n) for n in (7, 3, 9, 1, 5, 2, 6)]
    assert archive.write_batch(0, verdict_table(rows)) == [hour_of(T0), hour_of(T0 + HOUR_MS)]
    for hour in (T0, T0 + HOUR_MS):
        ids = pq.read_table(tmp_path / f"hour={hour_of(hour)}" / "batch_id=0" / "part-0.parquet")["message_id"]
        in_hour = [r["message_id"] for r in rows if r["decided_ms"] // HOUR_MS == hour // HOUR_MS]
        assert ids.to_pylist() == sorted(in_hour)
    assert archive.batches() == {hour_of(T0): [0], hour_of(T0 + HOUR_MS): [0]}


def test_a_replayed_batch_decided_in_another_hour_leaves_one_copy(tmp_path: Path) -> None:
    archive = VerdictArchive(tmp_path)
    archive.write_batch(4, verdict_table([delivered("m1", T0 + 10), delivered("m2", T0 + 10)]))
    archive.write_batch(4, verdict_table([delivered("m1", T0 + HOUR_MS + 10)]))  # replayed after the hour turned
    assert [(r["message_id"], r["decided_ms"]) for r in archive.read()] == [("m1", T0 + HOUR_MS + 10)]
    assert archive.batches() == {hour_of(T0): [], hour_of(T0 + HOUR_MS): [4]}
    archive.write_batch(4, verdict_table([delivered("m1", T0 + HOUR_MS + 10)]))  # and again: the same
    assert len(archive.read()) == 1
    assert not list(tmp_path.rglob(".*"))  # no temporary file left behind


def test_the_same_verdict_in_two_batches_reads_once_as_first_decided(tmp_path: Path) -> None:
    archive = VerdictArchive(tmp_path)
    archive.write_batch(1, verdict_table([delivered("m1", T0 + 10)]))
    archive.write_batch(2, verdict_table([delivered("m1", T0 + 20)]))
    assert [r["decided_ms"] for r in archive.read_messages(["m1"], hours=[hour_of(T0)])] == [T0 + 10]


@pytest.mark.parametrize(
    ("row", "named"),
    [
        (delivered("m1", T0, verdict="LOST"), "verdict archive 'verdict': got \"LOST (message 'm1'"),
        (delivered("m1", T0, late_evidence=True), "DELIVERED with late evidence"),
        (delivered("m1", T0, detail=None), "verdict archive 'detail': got None; expected a value in every row"),
        ({**delivered("m1", T0), "decided_ms": "soon"}, "verdict archive 'decided_ms': got 'string'; expected int64"),
    ],
)
def test_what_the_archive_cannot_take_is_refused_naming_it_and_nothing_is_written(
    tmp_path: Path, row: dict[str, Any], named: str
) -> None:
    archive = VerdictArchive(tmp_path)
    with pytest.raises(VerdictArchiveError) as refused:
        archive.write_batch(0, pa.Table.from_pylist([row]))
    assert named in str(refused.value)
    assert archive.hours() == []


def test_a_table_without_the_verdict_columns_is_refused_naming_them(tmp_path: Path) -> None:
    with pytest.raises(VerdictArchiveError) as refused:
        VerdictArchive(tmp_path).write_batch(0, pa.table({"message_id": ["m1"], "hop": [HOP]}))
    assert "'columns': got ['stream', 'hop_kind'" in str(refused.value)


def test_the_index_records_finds_replaces_forgets_and_prunes(tmp_path: Path) -> None:
    index = DecidedIndex(tmp_path / "_index" / "decided.sqlite")
    assert index.find(["m1"]) == {} and not index.exists  # asking never creates it
    assert index.record(1, [("m1", 100, hour_of(T0)), ("m2", 100, hour_of(T0))]) == 2
    assert index.record(2, [("m1", 900, hour_of(T0 + HOUR_MS))]) == 1  # seen again, by a fresh state
    assert index.record(1, [("m1", 100, hour_of(T0))]) == 1  # batch 1 replayed without m2
    assert index.find(["m1", "m2", "m3"]) == {
        "m1": [Decision(1, 100, hour_of(T0)), Decision(2, 900, hour_of(T0 + HOUR_MS))]
    }
    assert index.forget_batch(2) == 1 and index.find(["m1"]) == {"m1": [Decision(1, 100, hour_of(T0))]}
    index.record(3, [("m4", None, hour_of(T0 + 2 * HOUR_MS))])
    assert index.prune(T0 + HOUR_MS) == 1  # the hour before T0 + 1 h ended: its rows go
    assert index.find(["m1", "m4"]) == {"m4": [Decision(3, None, hour_of(T0 + 2 * HOUR_MS))]}
    with pytest.raises(VerdictArchiveError, match="'hour': got '2026-11-23T10'; expected an archive hour"):
        index.record(5, [("m5", 1, "2026-11-23T10")])


def test_the_index_records_and_finds_a_25000_message_batch_among_200000_rows(tmp_path: Path) -> None:
    index = DecidedIndex(tmp_path / "decided.sqlite")
    for batch in range(8):  # 200,000 rows held
        index.record(batch, [(f"m-{batch}-{n}", T0, hour_of(T0)) for n in range(25_000)])
    ids = [f"m-9-{n}" for n in range(25_000)]
    assert index.record(9, [(m, T0, hour_of(T0 + HOUR_MS)) for m in ids]) == 25_000
    found = index.find(ids[:12_500] + [f"m-3-{n}" for n in range(12_500)])
    assert len(found) == 25_000 and found["m-9-0"] == [Decision(9, T0, hour_of(T0 + HOUR_MS))]
    assert found["m-3-7"] == [Decision(3, T0, hour_of(T0))]


def test_search_reads_the_batches_the_index_names(tmp_path: Path) -> None:
    archive = VerdictArchive(tmp_path, max_scan_hours=1)
    archive.write_batch(1, verdict_table([delivered("m1", T0 + 5)]))
    archive.write_batch(2, verdict_table([delivered("m2", T0 + 3 * HOUR_MS)]))
    archive.index.record(1, [("m1", T0, hour_of(T0))])
    found = archive.search(["m1"])
    assert [r["message_id"] for r in found.rows] == ["m1"] and found.note is None
    assert archive.read_messages(["m1"]) == found.rows


def test_search_without_the_index_scans_the_newest_hours_and_says_older_ones_were_not(tmp_path: Path) -> None:
    archive = VerdictArchive(tmp_path, max_scan_hours=1)
    archive.write_batch(1, verdict_table([delivered("m1", T0 + 5)]))
    archive.write_batch(2, verdict_table([delivered("m2", T0 + 3 * HOUR_MS)]))
    newest = archive.search(["m2"])
    assert [r["message_id"] for r in newest.rows] == ["m2"]
    assert (
        newest.note is not None
        and f"only the newest 1 of its 2 hours were searched ({hour_of(T0 + 3 * HOUR_MS)}" in (newest.note)
    )
    assert archive.search(["m1"]).rows == []  # older than the scan, and unknown to the index
    assert archive.read_messages(["m1"], hours=[hour_of(T0)])[0]["message_id"] == "m1"  # named hours are read
    assert VerdictArchive(tmp_path).search(["m1"]).note is None  # 48 hours: the whole archive was searched


def test_read_filters_by_stream_and_time_and_prune_drops_whole_hours_with_their_index_rows(tmp_path: Path) -> None:
    archive = VerdictArchive(tmp_path)
    archive.write_batch(1, verdict_table([delivered("m1", T0 + 5), delivered("m2", T0 + 7, stream="payments")]))
    archive.write_batch(2, verdict_table([delivered("m3", T0 + HOUR_MS + 5)]))
    archive.index.record(1, [("m1", T0, hour_of(T0)), ("m2", T0, hour_of(T0))])
    archive.index.record(2, [("m3", T0, hour_of(T0 + HOUR_MS))])
    assert [r["message_id"] for r in archive.read(stream="orders")] == ["m1", "m3"]
    assert [r["message_id"] for r in archive.read(since_ms=T0 + 6)] == ["m2", "m3"]
    assert archive.prune(T0 + HOUR_MS + 1) == [hour_of(T0)]
    assert archive.hours() == [hour_of(T0 + HOUR_MS)]
    assert set(archive.index.find(["m1", "m2", "m3"])) == {"m3"}
