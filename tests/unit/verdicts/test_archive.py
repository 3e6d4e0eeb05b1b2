"""The verdict archive: Parquet by hour and micro-batch, idempotent per batch, with its decided-index (an SQLite store
here; tests/integration/store/test_decided.py tests the index itself on SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from khipu.store import Store
from khipu.store.verdicts import VERDICT_COLUMNS
from khipu.trace.archive import HOUR_MS, hour_of
from khipu.verdicts.archive import (
    COLUMNS,
    SCHEMA,
    VerdictArchive,
    VerdictArchiveError,
    verdict_table,
)

T0 = 1_795_000_000_000 // HOUR_MS * HOUR_MS  # an hour boundary
HOP = "local/in -> s1"


@pytest.fixture
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """The store the archive's index is kept in: an SQLite file apart from the archive's folder."""
    kept = Store(f"sqlite:///{tmp_path_factory.mktemp('store') / 'khipu.db'}")
    kept.migrate()
    yield kept
    kept.close()


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


def test_a_batch_reads_back_as_written_with_its_none_values(tmp_path: Path, store: Store) -> None:
    archive = VerdictArchive(tmp_path, store)
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


def test_rows_are_sorted_by_message_id_within_a_file_and_split_by_the_hour_decided(
    tmp_path: Path, store: Store
) -> None:
    archive = VerdictArchive(tmp_path, store)
    rows = [delivered(f"m{n:03d}", T0 + (HOUR_MS if n % 3 == 0 else 0) + n) for n in (7, 3, 9, 1, 5, 2, 6)]
    assert archive.write_batch(0, verdict_table(rows)) == [hour_of(T0), hour_of(T0 + HOUR_MS)]
    for hour in (T0, T0 + HOUR_MS):
        ids = pq.read_table(tmp_path / f"hour={hour_of(hour)}" / "batch_id=0" / "part-0.parquet")["message_id"]
        in_hour = [r["message_id"] for r in rows if r["decided_ms"] // HOUR_MS == hour // HOUR_MS]
        assert ids.to_pylist() == sorted(in_hour)
    assert archive.batches() == {hour_of(T0): [0], hour_of(T0 + HOUR_MS): [0]}


def test_a_replayed_batch_decided_in_another_hour_leaves_one_copy(tmp_path: Path, store: Store) -> None:
    archive = VerdictArchive(tmp_path, store)
    archive.write_batch(4, verdict_table([delivered("m1", T0 + 10), delivered("m2", T0 + 10)]))
    archive.write_batch(4, verdict_table([delivered("m1", T0 + HOUR_MS + 10)]))  # replayed after the hour turned
    assert [(r["message_id"], r["decided_ms"]) for r in archive.read()] == [("m1", T0 + HOUR_MS + 10)]
    assert archive.batches() == {hour_of(T0): [], hour_of(T0 + HOUR_MS): [4]}
    archive.write_batch(4, verdict_table([delivered("m1", T0 + HOUR_MS + 10)]))  # and again: the same
    assert len(archive.read()) == 1
    assert not list(tmp_path.rglob(".*"))  # no temporary file left behind


def test_the_same_verdict_in_two_batches_reads_once_as_first_decided(tmp_path: Path, store: Store) -> None:
    archive = VerdictArchive(tmp_path, store)
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
    tmp_path: Path, store: Store, row: dict[str, Any], named: str
) -> None:
    archive = VerdictArchive(tmp_path, store)
    with pytest.raises(VerdictArchiveError) as refused:
        archive.write_batch(0, pa.Table.from_pylist([row]))
    assert named in str(refused.value)
    assert archive.hours() == []


def test_a_table_without_the_verdict_columns_is_refused_naming_them(tmp_path: Path, store: Store) -> None:
    with pytest.raises(VerdictArchiveError) as refused:
        VerdictArchive(tmp_path, store).write_batch(0, pa.table({"message_id": ["m1"], "hop": [HOP]}))
    assert "'columns': got ['stream', 'hop_kind'" in str(refused.value)


def test_search_reads_the_batches_the_index_names(tmp_path: Path, store: Store) -> None:
    archive = VerdictArchive(tmp_path, store, max_scan_hours=1)
    archive.write_batch(1, verdict_table([delivered("m1", T0 + 5)]))
    archive.write_batch(2, verdict_table([delivered("m2", T0 + 3 * HOUR_MS)]))
    archive.index.record(1, [("m1", T0, hour_of(T0))])
    found = archive.search(["m1"])
    assert [r["message_id"] for r in found.rows] == ["m1"] and found.note is None
    assert archive.read_messages(["m1"]) == found.rows


def test_search_without_the_index_scans_the_newest_hours_and_says_older_ones_were_not(
    tmp_path: Path, store: Store
) -> None:
    archive = VerdictArchive(tmp_path, store, max_scan_hours=1)
    archive.write_batch(1, verdict_table([delivered("m1", T0 + 5)]))
    archive.write_batch(2, verdict_table([delivered("m2", T0 + 3 * HOUR_MS)]))
    newest = archive.search(["m2"])
    assert [r["message_id"] for r in newest.rows] == ["m2"]
    assert (
        newest.note is not None
        and f"only the newest 1 of its 2 hours were searched ({hour_of(T0 + 3 * HOUR_MS)}" in (newest.note)
    )
    assert f"not in the verdict archive's index (table decided of the store at {store.safe_url})" in newest.note
    assert archive.search(["m1"]).rows == []  # older than the scan, and unknown to the index
    assert archive.read_messages(["m1"], hours=[hour_of(T0)])[0]["message_id"] == "m1"  # named hours are read
    assert VerdictArchive(tmp_path, store).search(["m1"]).note is None  # 48 hours: the whole archive was searched


def test_read_filters_by_stream_and_time_and_prune_drops_whole_hours_with_their_index_rows(
    tmp_path: Path, store: Store
) -> None:
    archive = VerdictArchive(tmp_path, store)
    archive.write_batch(1, verdict_table([delivered("m1", T0 + 5), delivered("m2", T0 + 7, stream="payments")]))
    archive.write_batch(2, verdict_table([delivered("m3", T0 + HOUR_MS + 5)]))
    archive.index.record(1, [("m1", T0, hour_of(T0)), ("m2", T0, hour_of(T0))])
    archive.index.record(2, [("m3", T0, hour_of(T0 + HOUR_MS))])
    assert [r["message_id"] for r in archive.read(stream="orders")] == ["m1", "m3"]
    assert [r["message_id"] for r in archive.read(since_ms=T0 + 6)] == ["m2", "m3"]
    assert archive.prune(T0 + HOUR_MS + 1) == [hour_of(T0)]
    assert archive.hours() == [hour_of(T0 + HOUR_MS)]
    assert set(archive.index.find(["m1", "m2", "m3"])) == {"m3"}
