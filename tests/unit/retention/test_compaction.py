"""Compacting the archives' closed hours (khipu.retention.compaction) on local folders: which hours are closed (a
numbered table of cases, each with its reason), a replayed batch's hour waiting for the batch after it, a second
run doing nothing, and every reader answering the same after compaction as before: the verdict archive's search
by the index (an SQLite store here), the trace archive's read by message."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from khipu.retention.compaction import CLOSED_MARGIN_MS, compact_archive, compact_archives, why_open
from khipu.storage.compaction import COMPACTED_FOLDER, list_hour, select_parts
from khipu.storage.location import Location
from khipu.store import Store
from khipu.trace import archive
from khipu.trace.archive import HOUR_MS, hour_of
from khipu.verdicts.archive import COMPACTION, ROW_GROUP_ROWS, VerdictArchive, verdict_table

T0 = 1_795_000_000_000 // HOUR_MS * HOUR_MS  # an hour's start
H0, H1, H2 = hour_of(T0), hour_of(T0 + HOUR_MS), hour_of(T0 + 2 * HOUR_MS)
END = T0 + HOUR_MS  # H0's end
MARGIN = CLOSED_MARGIN_MS

# (case, read_to_ms, hours the replayable batch wrote in, open?, why)
CLOSING = [
    (1, None, set(), True, "the detector has said nothing: any hour may still be written"),
    (2, END - 1, set(), True, "traces that arrived in the hour's last millisecond may be unread"),
    (3, END + MARGIN - 1, set(), True, "past the end, not by the margin: a batch deciding at the end may be running"),
    (4, END + MARGIN, set(), False, "read past the end by the margin, no replayable batch wrote in it"),
    (5, END + MARGIN, {H0}, True, "the newest batch wrote in it: a replay would remove those files"),
    (6, END + MARGIN, {H1}, False, "the newest batch wrote in another hour only"),
    (7, END + 30 * HOUR_MS, {H0}, True, "however far read, a replayable batch's hour waits for the batch after it"),
]


@pytest.mark.parametrize(
    ("case", "read_to", "replayable", "still_open", "why"), CLOSING, ids=[str(c[0]) for c in CLOSING]
)
def test_an_hour_is_closed_once_read_past_with_a_margin_and_no_replayable_batch_wrote_in_it(
    case: int, read_to: int | None, replayable: set[str], still_open: bool, why: str
) -> None:
    assert (why_open(H0, read_to, replayable, MARGIN) is not None) == still_open, f"case {case}: {why}"


@pytest.fixture
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    kept = Store(f"sqlite:///{tmp_path_factory.mktemp('store') / 'khipu.db'}")
    kept.migrate()
    yield kept
    kept.close()


def trace(message_id: str, at_ms: int, seq: int) -> dict[str, Any]:
    return {"message_id": message_id, "stream": "orders", "location": "p", "cluster": "local", "type": "SENT",
            "timestamp_ms": at_ms, "topic": "orders", "partition": 0, "offset": seq, "group": None, "emitter_id": "e",
            "emitter_seq": seq, "sampling_percent": 100.0, "attributes": None, "prev_offsets": None,
            "kafka_timestamp_ms": at_ms}  # fmt: skip


def delivered(message_id: str, decided_ms: int, hop: str = "local/orders -> sink") -> dict[str, Any]:
    return {"message_id": message_id, "hop": hop, "stream": "orders", "hop_kind": "read", "verdict": "DELIVERED",
            "cause": None, "count": 1, "topic": "orders", "partition": 0, "offset": 1, "group": "sink",
            "location": "sink", "observed_ms": decided_ms, "latency_ms": 40, "e2e_latency_ms": 40,
            "decided_ms": decided_ms, "detail": "", "first_seen_ms": decided_ms - 1_000}  # fmt: skip


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def write_traces(root: Path, batch_id: int, rows: list[dict[str, Any]]) -> None:
    archive.write_batch(root, batch_id, pa.Table.from_pylist(rows, schema=archive.SCHEMA))


def test_a_replayed_batchs_hour_waits_for_the_next_batch_then_holds_the_replay_once(tmp_path: Path) -> None:
    """Batch 6 is replayed (its first attempt archived m-first, the replay m-replayed); while the commit record
    names it the hour waits, since a replay may still remove its files. Batch 7 commits in a later hour: the hour is
    compacted with batch 5's traces and the replay's, not the first attempt's."""
    root = tmp_path / "archive"
    write_traces(root, 5, [trace("m-5", T0 + 10, 1)])
    write_traces(root, 6, [trace("m-first", T0 + 20, 2)])
    write_traces(root, 6, [trace("m-replayed", T0 + 20, 2)])
    far = T0 + 5 * HOUR_MS
    waited = compact_archive(Location.of(root), archive.COMPACTION, far, 1 << 30)
    assert waited.hours == [] and waited.waiting == {H0: "the newest micro-batch wrote in it and may still be replayed"}

    write_traces(root, 7, [trace("m-7", T0 + 2 * HOUR_MS + 5, 3)])
    done = compact_archive(Location.of(root), archive.COMPACTION, far, 1 << 30)
    assert [hour.hour for hour in done.hours] == [H0] and H2 in done.waiting  # batch 7's hour waits now
    assert list_hour(Location.of(root), f"hour={H0}").compacted
    read = archive.read_traces(root, ["m-5", "m-first", "m-replayed", "m-7"], T0, T0 + 3 * HOUR_MS)
    assert [t.message_id for t in read] == ["m-5", "m-replayed", "m-7"]


def test_a_second_run_does_nothing_and_a_dry_run_changes_nothing(tmp_path: Path, store: Store) -> None:
    traces, verdicts = tmp_path / "archive", tmp_path / "verdicts"
    with VerdictArchive(verdicts, store) as verdict_archive:
        for batch in range(4):
            write_traces(traces, batch, [trace(f"m-{batch}", T0 + batch, batch)])
            verdict_archive.write_batch(batch, verdict_table([delivered(f"m-{batch}", T0 + 100 + batch)]))
        write_traces(traces, 4, [])  # the newest batch wrote nothing: no hour waits for it
        verdict_archive.write_batch(4, verdict_table([]))
    read_to = END + MARGIN

    before = tree(tmp_path)
    lines: list[str] = []
    dry = compact_archives(
        Location.of(traces), Location.of(verdicts), read_to, 128, dry_run=True, progress=lines.append
    )
    assert tree(tmp_path) == before
    assert lines == [f"trace archive hour {H0}: would compact 4 files, {_bytes(traces)}",
                     f"verdict archive hour {H0}: would compact 4 files, {_bytes(verdicts)}"]  # fmt: skip
    assert dry["trace archive"].as_dict()["files_before"] == 4

    lines.clear()
    done = compact_archives(Location.of(traces), Location.of(verdicts), read_to, 128, progress=lines.append)
    assert [d.as_dict()["files_after"] for d in done.values()] == [1, 1]
    assert lines[0].startswith(f"trace archive hour {H0}: 4 files -> 1, ") and lines[0].endswith(" s")
    assert ", 4 rows, " in lines[0]
    after = tree(tmp_path)
    assert after != before

    lines.clear()
    again = compact_archives(Location.of(traces), Location.of(verdicts), read_to, 128, progress=lines.append)
    assert tree(tmp_path) == after
    assert [a.as_dict()["already_compacted"] for a in again.values()] == [1, 1]
    assert lines == [
        "trace archive: nothing to compact (1 hour(s) compacted before, 0 not closed yet)",
        "verdict archive: nothing to compact (1 hour(s) compacted before, 0 not closed yet)",
    ]


def _bytes(root: Path) -> str:
    return f"{sum(p.stat().st_size for p in root.glob('hour=*/batch_id=*/*.parquet')):,} B"


def test_the_verdict_search_finds_after_compaction_everything_the_index_names(tmp_path: Path, store: Store) -> None:
    """Forty micro-batches decide 400 messages over two hours, one batch across an hour's end (its index rows name
    the first hour, as a batch's rows name one hour); some messages get a verdict on a second hop. Compacted into
    several files an hour, every message's archived verdicts are found as before, through the index, opening one
    file of each hour it names, and, once the index no longer holds them (pruned), by scanning the newest hours."""
    root = tmp_path / "verdicts"
    with VerdictArchive(root, store) as verdicts:
        for batch in range(40):
            at = END - 10 if batch == 21 else T0 + 60_000 + batch * 170_000
            rows = [delivered(f"m-{batch}-{i}", at + 2 * i) for i in range(10)]
            rows += [delivered(f"m-{batch}-{i}", at + 2 * i + 1, hop="local/out -> sink2") for i in range(0, 10, 3)]
            verdicts.write_batch(batch, verdict_table(rows))
            verdicts.index.record(batch, {(r["message_id"], r["first_seen_ms"], hour_of(at)) for r in rows})
        verdicts.write_batch(40, verdict_table([]))  # the batch after: batch 39's hour cannot be replayed now
        ids = sorted({f"m-{b}-{i}" for b in range(40) for i in range(10)})
        before = verdicts.search(ids)
        assert len(before.rows) == 40 * 14 and before.note is None
        assert {hour_of(r["decided_ms"]) for r in before.rows if r["message_id"].startswith("m-21-")} == {H0, H1}

        size = sum(p.stat().st_size for p in root.rglob("*.parquet"))
        done = compact_archive(Location.of(root), COMPACTION, T0 + 3 * HOUR_MS, size // 6)
        assert [hour.hour for hour in done.hours] == [H0, H1]
        assert all(hour.compaction and hour.compaction.files_after > 1 for hour in done.hours)
        assert sorted(p.name for p in root.glob("hour=*/*")) == [COMPACTED_FOLDER, COMPACTED_FOLDER]

        assert verdicts.search(ids).rows == before.rows
        parts = {hour: Location.of(root / f"hour={hour}" / COMPACTED_FOLDER).files() for hour in (H0, H1)}
        for message in ("m-0-0", "m-21-3", "m-21-9", "m-39-6"):
            assert verdicts.search([message]).rows == [r for r in before.rows if r["message_id"] == message]
            assert [len(select_parts(files, [message])) for files in parts.values()] == [1, 1]
        verdicts.index.prune(T0 + 3 * HOUR_MS)  # the detector keeps the index 2.5 h: older messages are scanned
        assert verdicts.index.find(ids) == {}
        assert verdicts.search(ids).rows == before.rows


def test_a_compacted_verdict_hour_keeps_a_batchs_sort_and_row_groups(tmp_path: Path, store: Store) -> None:
    """Five batches of 4,000 verdicts (written each sorted by message id and hop) become one file sorted the same,
    in row groups of 8,192: a point lookup decodes one of them."""
    root = tmp_path / "verdicts"
    with VerdictArchive(root, store) as verdicts:
        for batch in range(5):
            rows = [
                delivered(f"m-{(i * 7919 + batch) % 20_000:05d}", T0 + batch * 1_000 + i % 500) for i in range(4_000)
            ]
            verdicts.write_batch(batch, verdict_table(rows))
        verdicts.write_batch(5, verdict_table([]))
    compact_archive(Location.of(root), COMPACTION, END + MARGIN, 1 << 30)
    [part] = root.glob(f"hour={H0}/{COMPACTED_FOLDER}/*.parquet")
    keys = pq.read_table(part, columns=["message_id", "hop"]).to_pylist()
    assert len(keys) == 20_000 and keys == sorted(keys, key=lambda k: (k["message_id"], k["hop"]))
    metadata = pq.ParquetFile(part).metadata
    assert [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)] == [ROW_GROUP_ROWS] * 2 + [3_616]
