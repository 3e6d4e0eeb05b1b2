"""Compacting an archive hour (khipu.storage.compaction) on a local folder: the hour's rows, each once, in a bounded
number of sorted files, whatever state an earlier run stopped in. The hours are written by the trace archive's own
writer (khipu.trace.archive.write_batch); tests/integration/storage/test_compaction_on_object_store.py runs the
protocol on a real S3 API, with a compaction killed between its writes and its deletes."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from khipu.storage.compaction import (
    COMPACTED_FOLDER,
    PART,
    CompactionError,
    compact_hour,
    distinct_rows,
    key_buckets,
    key_hashes,
    list_hour,
    parts_for,
    select_parts,
)
from khipu.storage.location import Location
from khipu.trace import archive
from khipu.trace.archive import HOUR_MS, hour_folder

T0 = 1_795_000_000_000 // HOUR_MS * HOUR_MS
HOUR = hour_folder(T0)


def trace(message_id: str, seq: int, **extra: Any) -> dict[str, Any]:
    return {
        "message_id": message_id, "stream": "orders", "location": "api", "cluster": "local", "type": "SENT",
        "timestamp_ms": T0 + seq, "topic": "orders", "partition": 0, "offset": seq, "group": None,
        "emitter_id": "api-e", "emitter_seq": seq, "sampling_percent": 100.0, "attributes": None,
        "prev_offsets": None, "key_hash": None, "tombstone": False, "transactional": False,
        "read_uncommitted": False, "kafka_timestamp_ms": T0 + 1_000 + seq, **extra,
    }  # fmt: skip


def write(root: Path, batch_id: int, rows: list[dict[str, Any]]) -> None:
    archive.write_batch(root, batch_id, pa.Table.from_pylist(rows, schema=archive.SCHEMA))


def hour_rows(root: Path) -> Counter[tuple[Any, ...]]:
    """Every row of the hour, as often as the files hold it (a copy counts twice here)."""
    files = sorted((root / HOUR).rglob("*.parquet"))
    rows = [r for f in files for r in pq.read_table(f, schema=archive.SCHEMA).to_pylist()]
    return Counter(tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(r.items())) for r in rows)


def batches_of(root: Path, count: int, per_batch: int) -> Counter[tuple[Any, ...]]:
    for batch in range(count):
        write(root, batch, [trace(f"m-{batch}-{i:03d}", batch * per_batch + i) for i in range(per_batch)])
    return hour_rows(root)


def compact(root: Path, target_bytes: int = 1 << 30, generation: str | None = None) -> Any:
    location = Location.of(root)
    return compact_hour(location, list_hour(location, HOUR), archive.COMPACTION, target_bytes, generation=generation)


def test_an_hour_of_micro_batches_becomes_one_file_holding_the_same_rows_batch_after_batch(tmp_path: Path) -> None:
    """The trace archive keeps its rows as the micro-batches held them (its spec sorts nothing): batch 2's before
    batch 10's, though ``batch_id=10`` is listed before ``batch_id=2``."""
    before = batches_of(tmp_path, 12, 40)
    done = compact(tmp_path)
    assert (done.files_before, done.files_after, done.rows_before, done.rows_after) == (12, 1, 480, 480)
    assert hour_rows(tmp_path) == before
    [part] = (tmp_path / HOUR).rglob("*.parquet")
    assert part.parent.name == COMPACTED_FOLDER and PART.fullmatch(part.name)
    assert sorted(p.name for p in (tmp_path / HOUR).iterdir()) == [COMPACTED_FOLDER]  # the batch folders are gone
    ids = pq.read_table(part, columns=["message_id"]).column("message_id").to_pylist()
    assert ids == [f"m-{batch}-{i:03d}" for batch in range(12) for i in range(40)]
    assert list_hour(Location.of(tmp_path), HOUR).compacted


def test_a_row_written_twice_is_kept_once_and_rows_differing_in_one_column_are_both_kept(tmp_path: Path) -> None:
    """A batch archived again under another id (a new checkpoint reading the topic again) holds the same rows; a
    null list of back-pointers and an empty one, or a null pointer in it, are different rows."""
    rows = [trace("m-1", 1), trace("m-2", 2, prev_offsets=[5]), trace("m-3", 3, prev_offsets=[])]
    write(tmp_path, 1, rows)
    write(tmp_path, 900_000_001, rows)  # the same rows again
    write(tmp_path, 2, [trace("m-3", 3, prev_offsets=None), trace("m-2", 2, prev_offsets=[5, None])])
    done = compact(tmp_path)
    assert (done.rows_before, done.rows_after) == (8, 5)
    assert sum(hour_rows(tmp_path).values()) == 5 and set(hour_rows(tmp_path).values()) == {1}


def test_a_big_hour_is_split_by_message_id_into_files_of_about_the_target_size(tmp_path: Path) -> None:
    before = batches_of(tmp_path, 20, 200)
    size = sum(p.stat().st_size for p in (tmp_path / HOUR).rglob("*.parquet"))
    done = compact(tmp_path, target_bytes=size // 4)
    assert done.files_after == parts_for(size, size // 4) == 5
    assert hour_rows(tmp_path) == before
    for part in (tmp_path / HOUR / COMPACTED_FOLDER).iterdir():  # each file holds exactly its bucket's messages
        named = PART.fullmatch(part.name)
        assert named is not None and int(named["parts"]) == 5
        ids = pq.read_table(part, columns=["message_id"]).column("message_id")
        assert set(key_buckets(ids, 5).tolist()) == {int(named["bucket"])}


def test_a_run_stopped_after_writing_its_parts_leaves_copies_that_the_next_run_removes(tmp_path: Path) -> None:
    """The state a crash between the writes and the deletes leaves: the hour's batch folders and the new parts.
    Made here by putting the batch folders back after a run; the real kill is the object-store test's."""
    before = batches_of(tmp_path, 6, 30)
    kept = tmp_path.parent / f"{tmp_path.name}-batches"
    shutil.copytree(tmp_path / HOUR, kept)
    compact(tmp_path)
    shutil.copytree(kept, tmp_path / HOUR, dirs_exist_ok=True)
    listing = list_hour(Location.of(tmp_path), HOUR)
    assert not listing.compacted and listing.batches == [0, 1, 2, 3, 4, 5]
    assert hour_rows(tmp_path) == before + before  # every row twice: readers count each once
    done = compact(tmp_path)
    assert (done.rows_before, done.rows_after) == (360, 180)
    assert hour_rows(tmp_path) == before and list_hour(Location.of(tmp_path), HOUR).compacted


def test_a_run_stopped_while_writing_its_parts_leaves_copies_that_the_next_run_removes(tmp_path: Path) -> None:
    """Some parts of a generation written, none of the inputs deleted: a second generation is not a compacted
    hour, and the next run (another number of parts) keeps each row once."""
    before = batches_of(tmp_path, 8, 100)
    size = sum(p.stat().st_size for p in (tmp_path / HOUR).rglob("*.parquet"))
    scratch = tmp_path.parent / f"{tmp_path.name}-scratch"
    shutil.copytree(tmp_path, scratch)
    compact(scratch, target_bytes=size // 3, generation="aaaa")
    first_part = sorted((scratch / HOUR / COMPACTED_FOLDER).iterdir())[0]
    (tmp_path / HOUR / COMPACTED_FOLDER).mkdir()
    shutil.copy(first_part, tmp_path / HOUR / COMPACTED_FOLDER / first_part.name)  # one part of three
    assert not list_hour(Location.of(tmp_path), HOUR).compacted
    compact(tmp_path, target_bytes=size // 2, generation="bbbb")
    assert hour_rows(tmp_path) == before
    listing = list_hour(Location.of(tmp_path), HOUR)
    assert listing.generations == ["bbbb"] and listing.compacted


def test_a_compacted_hour_with_a_late_batch_is_not_compacted_and_is_merged_again(tmp_path: Path) -> None:
    before = batches_of(tmp_path, 3, 10)
    compact(tmp_path, generation="aaaa")
    write(tmp_path, 7, [trace("late", 99)])
    listing = list_hour(Location.of(tmp_path), HOUR)
    assert not listing.compacted and listing.batches == [7]
    compact(tmp_path, generation="bbbb")
    late = hour_rows(tmp_path) - before
    assert sum(late.values()) == 1 and dict(next(iter(late)))["message_id"] == "late"
    assert list_hour(Location.of(tmp_path), HOUR).generations == ["bbbb"]


def test_an_hour_retention_reduced_is_compacted_already(tmp_path: Path) -> None:
    """Retention's ``batch_id=-1`` (the traces a pending resend needs) is no micro-batch: nothing to redo."""
    kept = tmp_path / HOUR / "batch_id=-1" / "part-0.parquet"
    kept.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([trace("pinned", 1)], schema=archive.SCHEMA), kept)
    assert list_hour(Location.of(tmp_path), HOUR).compacted


def test_a_generation_used_before_is_refused(tmp_path: Path) -> None:
    batches_of(tmp_path, 1, 3)
    compact(tmp_path, generation="abc")
    write(tmp_path, 4, [trace("late", 99)])
    with pytest.raises(CompactionError, match="generation: got 'abc'; expected lower-case hex not used"):
        compact(tmp_path, generation="abc")


def test_select_parts_opens_one_part_per_message_and_every_micro_batch_file() -> None:
    ids = [f"m-{i}" for i in range(40)]
    buckets = dict(zip(ids, key_buckets(pa.array(ids), 4).tolist(), strict=True))
    parts = [f"a/hour=H/{COMPACTED_FOLDER}/part-aaaa-{b:05d}-of-00004.parquet" for b in range(4)]
    batch = "a/hour=H/batch_id=12/part-0.parquet"
    for message in ("m-3", "m-17"):
        expected = [f"a/hour=H/{COMPACTED_FOLDER}/part-aaaa-{buckets[message]:05d}-of-00004.parquet", batch]
        assert select_parts([*parts, batch], [message]) == expected
    assert select_parts(parts, ids) == parts  # 40 messages: every bucket


def reference_hash(text: str | None) -> int:
    """The hash as key_hashes documents it, one byte at a time in plain Python: the sum of (byte + 1) x 0x100000001B3
    to the byte's position, plus the length, mod 2**64, then splitmix64's finaliser."""
    mask = (1 << 64) - 1
    data = (text or "").encode()
    value = (sum((byte + 1) * pow(0x100000001B3, i, 1 << 64) for i, byte in enumerate(data)) + len(data)) & mask
    value ^= value >> 30
    value = (value * 0xBF58476D1CE4E5B9) & mask
    value ^= value >> 27
    value = (value * 0x94D049BB133111EB) & mask
    return value ^ (value >> 31)


def test_the_hash_of_an_id_is_its_bytes_alone_as_documented() -> None:
    """Files on disk are bucketed by it, and readers on other hosts compute it again: it must be exactly the
    documented function of the id's bytes, whatever the array's slicing, chunks or the ids beside it."""
    ids = ["m-1", "0b6e8f0c-5a49-4b7a-9d55-1c2f5e7a9b31", "", None, "ñandú-𝄞", "x" * 300]
    assert key_hashes(pa.array(ids)).tolist() == [reference_hash(i) for i in ids]
    sliced = pa.chunked_array([pa.array(["x", "m-1"]).slice(1), pa.array(["", None])])
    assert key_hashes(sliced).tolist() == [reference_hash(i) for i in ("m-1", "", None)]


def test_distinct_rows_keeps_the_first_of_equal_rows_in_place() -> None:
    table = pa.table({"a": [1, 2, 1, None, None], "b": [["x"], None, ["x"], [], None]})
    assert distinct_rows(table).to_pylist() == [
        {"a": 1, "b": ["x"]}, {"a": 2, "b": None}, {"a": None, "b": []}, {"a": None, "b": None},
    ]  # fmt: skip
