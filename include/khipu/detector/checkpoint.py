"""What a detector checkpoint keeps that is read without Spark: its epoch file and the counts its state is laid out by.

``<checkpoint>/khipu_detector/khipu-epoch.json`` holds the second the checkpoint was first started (its identity:
:func:`khipu.detector.job.checkpoint_epoch`) and the bucket count its state is kept in, recorded at that first start
(a checkpoint of an earlier release gets it at its first start by this one). The shuffle partitions are Spark's own
record: the ``spark.sql.shuffle.partitions`` in the conf of the newest batch of the query's offset log. Both are
read wherever the checkpoint is (a local folder or an object store), so the launcher checks a start against them
before it submits anything (:meth:`khipu.detector.sizing.DetectorSizing.settled`).

**Which folder is the query's.** The query's checkpoint is ``<checkpoint>/khipu_detector`` until a rescale
(:mod:`khipu.detector.rescale`) carries its state to another bucket count: that writes a new folder beside it
(``khipu_detector.1``, then ``.2``) and, last, ``<checkpoint>/khipu-query.json`` naming it. Everything that opens the
query's checkpoint asks :func:`query_checkpoint`, so the detector and the DAG's checks follow that one small file
(written whole, also in an object store, which renames nothing) and the folder it left stays as it was.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from khipu.detector.launch import DetectorJobError
from khipu.detector.model import DETECTOR_QUERY
from khipu.storage.location import Location

EPOCH_FILE = "khipu-epoch.json"  # in the query's checkpoint: when it was first started, its bucket count
QUERY_FILE = "khipu-query.json"  # in the checkpoint: the folder of the query's checkpoint, once one was rescaled
HANDOVER_FILE = "khipu-rescaled.json"  # in a query checkpoint a rescale wrote (khipu.detector.handover.Handover)
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


@dataclass(frozen=True, slots=True)
class Epoch:
    started_s: int
    buckets: int | None  # None: written by a release that did not keep it
    # the batch key of its batch 0 after the epoch's second (khipu.detector.outputs.BatchKeys): 0, or, for a checkpoint
    # a rescale wrote, where the one it continues stopped (its first batch replays the other's unfinished one)
    first_batch: int = 0


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
        first_batch = found.get("first_batch", 0)
        if not isinstance(first_batch, int) or isinstance(first_batch, bool) or first_batch < 0:
            raise TypeError(f"first_batch {first_batch!r}")
        return Epoch(int(found["started_s"]), buckets, first_batch)
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DetectorJobError(
            "checkpoint epoch", path.url,
            f'JSON {{"started_s": <seconds>, "buckets": <count>[, "first_batch": <batch key>]}} ({exc})',
        ) from exc  # fmt: skip


def write_epoch(query_checkpoint: Location | Path, epoch: Epoch) -> None:
    body: dict[str, int] = {"started_s": epoch.started_s}
    if epoch.buckets is not None:
        body["buckets"] = epoch.buckets
    if epoch.first_batch:
        body["first_batch"] = epoch.first_batch
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
    """The bucket count and shuffle partitions the query checkpoint keeps (None: none yet). A checkpoint a rescale
    wrote keeps, until its first batch records Spark's own, the shuffle partitions the rescale chose."""
    query = Location.of(query_checkpoint, "checkpoint")
    epoch = read_epoch(query)
    partitions = recorded_shuffle_partitions(query)
    if partitions is None:
        partitions = _handed_over_partitions(query)
    return CheckpointSizing(str(query), epoch.buckets if epoch else None, partitions)


def _handed_over_partitions(query: Location) -> int | None:
    path = query / HANDOVER_FILE
    try:
        found = json.loads(path.read_text()).get("shuffle_partitions")
    except FileNotFoundError:
        return None
    except (ValueError, AttributeError) as exc:
        raise DetectorJobError("rescale manifest", path.url, f"the JSON a rescale writes ({exc})") from exc
    return found if isinstance(found, int) and not isinstance(found, bool) else None


def query_checkpoint(checkpoint_dir: Location | Path) -> Location:
    """The query's checkpoint under ``checkpoint_dir``: the folder ``khipu-query.json`` names (a rescale wrote it),
    else ``khipu_detector``. A pointer that is damaged, or names a folder that is not there, is refused by name."""
    checkpoint = Location.of(checkpoint_dir, "checkpoint")
    pointer = checkpoint / QUERY_FILE
    try:
        found: Any = json.loads(pointer.read_text())
    except FileNotFoundError:
        return checkpoint / DETECTOR_QUERY
    except ValueError as exc:
        raise DetectorJobError("checkpoint query file", pointer.url, f'JSON {{"folder": <name>}} ({exc})') from exc
    folder = found.get("folder") if isinstance(found, dict) else None
    if not isinstance(folder, str) or not folder.startswith(DETECTOR_QUERY) or "/" in folder:
        raise DetectorJobError("checkpoint query file", pointer.url, f'JSON {{"folder": "{DETECTOR_QUERY}[.<n>]"}}')
    query = checkpoint / folder
    if not query.is_dir():
        raise DetectorJobError(
            "checkpoint query file", pointer.url,
            f"the name of a folder beside it; {query.url} is not there (delete {QUERY_FILE} to start the detector on "
            f"{(checkpoint / DETECTOR_QUERY).url})",
        )  # fmt: skip
    return query


def point_at(checkpoint_dir: Location | Path, query: Location) -> None:
    """Make ``query`` (a folder directly under ``checkpoint_dir``) the query's checkpoint: one file, written whole."""
    checkpoint = Location.of(checkpoint_dir, "checkpoint")
    if query.parent.url != checkpoint.url:
        raise ValueError(f"{query.url} is not a folder of {checkpoint.url}")
    (checkpoint / QUERY_FILE).write_text(json.dumps({"folder": query.name}))
