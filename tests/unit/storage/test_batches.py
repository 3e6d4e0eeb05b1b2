from __future__ import annotations

import json
from pathlib import Path

from khipu.storage.batches import COMMIT_RECORD, write_batch_files
from khipu.storage.location import Location


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not str(p.relative_to(root)).startswith("_commit")
    }


def test_a_replay_touching_other_hours_replaces_every_file_of_its_earlier_attempt(tmp_path: Path) -> None:
    root = Location.of(tmp_path)
    write_batch_files(root, 6, {"hour=H1/batch_id=6/part-0.parquet": b"kept"})
    write_batch_files(root, 7, {"hour=H1/batch_id=7/part-0.parquet": b"a", "hour=H2/batch_id=7/part-0.parquet": b"b"})
    removed = write_batch_files(
        root, 7, {"hour=H2/batch_id=7/part-0.parquet": b"b2", "hour=H3/batch_id=7/part-0.parquet": b"c"}
    )
    assert removed == ["hour=H1/batch_id=7/part-0.parquet"]
    assert _files(tmp_path) == {
        "hour=H1/batch_id=6/part-0.parquet": b"kept",
        "hour=H2/batch_id=7/part-0.parquet": b"b2",
        "hour=H3/batch_id=7/part-0.parquet": b"c",
    }
    assert not (tmp_path / "hour=H1/batch_id=7").exists()


def test_the_record_names_every_file_before_any_is_written(tmp_path: Path) -> None:
    """A writer that died after recording its batch (the record is written first) left files the record names:
    the replay removes them even though it writes other hours."""
    root = Location.of(tmp_path)
    write_batch_files(root, 9, {"hour=H1/batch_id=9/part-0.parquet": b"x", "hour=H2/batch_id=9/part-0.parquet": b"y"})
    record = json.loads((tmp_path / COMMIT_RECORD).read_text())
    assert record == {
        "batch_id": 9,
        "files": ["hour=H1/batch_id=9/part-0.parquet", "hour=H2/batch_id=9/part-0.parquet"],
    }
    write_batch_files(root, 9, {})
    assert _files(tmp_path) == {}


def test_a_batch_written_before_the_record_existed_is_found_in_its_folders(tmp_path: Path) -> None:
    old = tmp_path / "hour=H1/batch_id=4/part-0.parquet"
    old.parent.mkdir(parents=True)
    old.write_bytes(b"from the previous release")
    write_batch_files(Location.of(tmp_path), 4, {"hour=H2/batch_id=4/part-0.parquet": b"new"})
    assert _files(tmp_path) == {"hour=H2/batch_id=4/part-0.parquet": b"new"}


def test_the_next_batch_leaves_the_one_before_alone(tmp_path: Path) -> None:
    root = Location.of(tmp_path)
    write_batch_files(root, 1, {"hour=H1/batch_id=1/part-0.parquet": b"one"})
    write_batch_files(root, 2, {})
    assert _files(tmp_path) == {"hour=H1/batch_id=1/part-0.parquet": b"one"}
