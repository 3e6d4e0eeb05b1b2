"""What a detector checkpoint keeps that is read without Spark: its epoch file and the counts its state is laid out by.

``<checkpoint>/khipu_detector/khipu-epoch.json`` holds the second the checkpoint was first started (its identity:
:func:`khipu.detector.job.checkpoint_epoch`) and the bucket count its state is kept in, recorded at that first start
(a checkpoint of an earlier release gets it at its first start by this one). The shuffle partitions are Spark's own
record: the ``spark.sql.shuffle.partitions`` in the conf of the newest batch of the query's offset log. Both are
read wherever the checkpoint is (a local folder or an object store), so the launcher checks a start against them
before it submits anything (:meth:`khipu.detector.sizing.DetectorSizing.settled`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from khipu.detector.launch import DetectorJobError
from khipu.storage.location import Location

EPOCH_FILE = "khipu-epoch.json"  # in the query's checkpoint: when it was first started, its bucket count
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


@dataclass(frozen=True, slots=True)
class Epoch:
    started_s: int
    buckets: int | None  # None: written by a release that did not keep it


@dataclass(frozen=True, slots=True)
class CheckpointSizing:
    """The counts a checkpoint keeps (None: none yet, or not recorded), and where it is."""

    url: str
    buckets: int | None
    shuffle_partitions: int | None


def read_epoch(query_checkpoint: Location | Path) -> Epoch | None:
    """The query checkpoint's epoch file; None when it has none. A damaged one is named."""
    path = Location.of(query_checkpoint, "checkpoint") / EPOCH_FILE
    try:
        found: dict[str, Any] = json.loads(path.read_text())
        buckets = found.get("buckets")
        if buckets is not None and (not isinstance(buckets, int) or isinstance(buckets, bool)):
            raise TypeError(f"buckets {buckets!r}")
        return Epoch(int(found["started_s"]), buckets)
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DetectorJobError(
            "checkpoint epoch", path.url, f'JSON {{"started_s": <seconds>, "buckets": <count>}} ({exc})'
        ) from exc


def write_epoch(query_checkpoint: Location | Path, epoch: Epoch) -> None:
    body: dict[str, int] = {"started_s": epoch.started_s}
    if epoch.buckets is not None:
        body["buckets"] = epoch.buckets
    (Location.of(query_checkpoint, "checkpoint") / EPOCH_FILE).write_text(json.dumps(body))


def recorded_shuffle_partitions(query_checkpoint: Location | Path) -> int | None:
    """The shuffle partitions Spark recorded with the newest batch of the query's offset log; None before any."""
    offsets = Location.of(query_checkpoint, "checkpoint") / "offsets"
    batches = [int(info.base_name) for info in offsets.children() if info.base_name.isdigit()]
    if not batches:
        return None
    path = offsets / str(max(batches))
    try:
        metadata = json.loads(path.read_text().splitlines()[1])
        found = metadata.get("conf", {}).get(SHUFFLE_PARTITIONS)
        return None if found is None else int(found)
    except (IndexError, ValueError, AttributeError) as exc:
        raise DetectorJobError(
            "checkpoint offset log", path.url, f"Spark's offset log: v1, then its metadata as JSON ({exc})"
        ) from exc


def checkpoint_sizing(query_checkpoint: Location | Path) -> CheckpointSizing:
    """The bucket count and shuffle partitions the query checkpoint keeps (None: none yet)."""
    query = Location.of(query_checkpoint, "checkpoint")
    epoch = read_epoch(query)
    return CheckpointSizing(str(query), epoch.buckets if epoch else None, recorded_shuffle_partitions(query))
