"""How a micro-batch's files are committed to an archive, on a local folder or an object store alike.

A micro-batch writes one file per UTC hour it touches (``hour=H/batch_id=N/part-0.parquet``). Spark replays a
batch whose run did not finish (the driver died, a write failed), and a replay may touch other hours (the
verdict archive files verdicts by when they were decided). Object stores cannot rename, so "write elsewhere,
then move into place" is not available. The protocol instead:

1. read the archive's commit record ``_commit/last-batch.json``: the batch last written and every file it
   may have written;
2. when it is this batch (a replay), those files are this batch's earlier attempt;
3. record this batch with the union of the earlier attempt's files and the ones about to be written, *before*
   writing any (write-ahead: a crash from here on leaves a record naming every file it may have made);
4. delete the earlier attempt's files that this attempt does not write;
5. write each file whole (:meth:`Location.write_bytes`: a reader sees an old file or a new one, never part).

Only the newest batch can be replayed (Spark runs batch N+1 after N is committed), so one record is enough.
Hence: a failed or repeated batch never leaves a partly written file, and once the replay has run, no file of an
earlier attempt; in between, readers see what the failed attempt wrote, whole files only. Every reader already
counts a message's trace or verdict found twice once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from khipu.storage.location import Location

COMMIT_RECORD = "_commit/last-batch.json"


def write_batch_files(root: Location, batch_id: int, files: Mapping[str, bytes]) -> list[str]:
    """Commit a micro-batch's files (relative name -> bytes) under ``root`` by the protocol above; returns the
    names of the earlier attempt's files it removed."""
    record = root / COMMIT_RECORD
    earlier = set(_recorded(record, batch_id))
    if root.is_local:  # archives written before the commit record: the batch's folders, found the old way
        folder = root.local_path
        earlier |= {str(p.relative_to(folder)) for p in folder.glob(f"hour=*/batch_id={batch_id}/*.parquet")}
    record.write_text(json.dumps({"batch_id": batch_id, "files": sorted(earlier | set(files))}))
    removed = sorted(earlier - set(files))
    for name in removed:
        (root / name).delete()
    if root.is_local:  # an emptied batch folder goes too, as the old writer removed it
        for name in removed:
            folder = (root / name).local_path.parent
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
    for name, data in sorted(files.items()):
        (root / name).write_bytes(data)
    return removed


@dataclass(frozen=True, slots=True)
class RecordedBatch:
    """The batch an archive's commit record names: the newest written, the only one Spark may still replay."""

    batch_id: int
    files: tuple[str, ...]  # every file (relative name) it may have written, or its earlier attempt did

    @property
    def hour_folders(self) -> frozenset[str]:
        """The hour folders (``hour=…``) it may have written in: a replay may rewrite or remove files there."""
        return frozenset(name.split("/", 1)[0] for name in self.files if "/" in name)


def last_batch(root: Location) -> RecordedBatch | None:
    """What the archive's commit record names (None: no batch was committed by it yet)."""
    recorded = _read_record(root / COMMIT_RECORD)
    if recorded is None:
        return None
    return RecordedBatch(recorded["batch_id"], tuple(str(name) for name in recorded.get("files", [])))


def _recorded(record: Location, batch_id: int) -> list[str]:
    """The files the commit record names for this batch (none when it records another batch, or nothing)."""
    recorded = _read_record(record)
    if recorded is None or recorded.get("batch_id") != batch_id:
        return []
    return [str(name) for name in recorded.get("files", [])]


def _read_record(record: Location) -> dict[str, Any] | None:
    try:
        recorded = json.loads(record.read_text())
    except FileNotFoundError:
        return None
    except ValueError as exc:  # a record cut short cannot happen (written whole); say so if it does
        raise ValueError(f"{record.url}: not a commit record ({exc}); remove it to start again") from exc
    if not isinstance(recorded, dict) or not isinstance(recorded.get("batch_id"), int):
        raise ValueError(f"{record.url}: not a commit record (no batch_id in {recorded!r}); remove it to start again")
    return recorded
