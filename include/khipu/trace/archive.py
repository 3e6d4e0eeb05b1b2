"""Reading the raw-trace archive (Parquet by UTC hour, written by the detector) outside Spark.

The view, the API and ``khipu trace`` ask for the traces of a few messages; they know roughly when
(from the verdicts' first-seen and decision times), so only those hours' folders are opened.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

HOUR_MS = 3_600_000
COLUMNS = (
    "message_id",
    "stream",
    "type",
    "location",
    "cluster",
    "topic",
    "partition",
    "offset",
    "group",
    "timestamp_ms",
    "emitter_id",
    "emitter_seq",
    "attributes",
)


@dataclass(frozen=True, slots=True)
class ArchivedTrace:
    message_id: str
    stream: str
    type: str  # SENT | RECEIVED
    location: str
    cluster: str
    topic: str
    partition: int | None
    offset: int | None
    group: str | None
    timestamp_ms: int
    emitter_id: str
    emitter_seq: int | None
    attributes: dict[str, str]


def hour_of(ms: int) -> str:
    """The archive's hour partition of a time (UTC): ``2026-11-23-10``."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d-%H")


def hour_folder(at_ms: int) -> str:
    """The archive's partition folder name of the UTC hour holding ``at_ms`` (``hour=2026-11-23-16``)."""
    return f"hour={hour_of(at_ms)}"


def hours_between(from_ms: int, to_ms: int) -> range:
    """The hours (ms // HOUR_MS) from the one holding ``from_ms`` to the one holding ``to_ms``, both included."""
    return range(from_ms // HOUR_MS, to_ms // HOUR_MS + 1)


def read_traces(archive_dir: Path, message_ids: Collection[str], from_ms: int, to_ms: int) -> list[ArchivedTrace]:
    """Every archived trace of these messages in the hours from ``from_ms`` to ``to_ms`` (both included),
    oldest first. An archive or hour that does not exist holds nothing."""
    return read_traces_in_hours(archive_dir, message_ids, hours_between(from_ms, to_ms))


def read_traces_in_hours(archive_dir: Path, message_ids: Collection[str], hours: Iterable[int]) -> list[ArchivedTrace]:
    """Every archived trace of these messages in these hours (ms // HOUR_MS), oldest first."""
    if not message_ids:
        return []
    folders = [
        archive_dir / hour_folder(hour * HOUR_MS)
        for hour in sorted(set(hours))
        if (archive_dir / hour_folder(hour * HOUR_MS)).is_dir()
    ]
    if not folders:
        return []
    dataset = ds.dataset([ds.dataset(str(folder), format="parquet", partitioning="hive") for folder in folders])
    table = dataset.to_table(columns=list(COLUMNS), filter=ds.field("message_id").isin(sorted(set(message_ids))))
    rows = sorted(table.to_pylist(), key=lambda r: (r["timestamp_ms"], r["emitter_id"], r["emitter_seq"] or 0))
    seen: set[tuple[Any, ...]] = set()
    traces: list[ArchivedTrace] = []
    for row in rows:
        key = (row["emitter_id"], row["emitter_seq"], row["message_id"], row["type"], row["offset"])
        if key in seen:  # a replayed batch archived twice under two batch ids: one trace
            continue
        seen.add(key)
        traces.append(
            ArchivedTrace(
                message_id=row["message_id"],
                stream=row["stream"],
                type=row["type"],
                location=row["location"],
                cluster=row["cluster"],
                topic=row["topic"],
                partition=row["partition"],
                offset=row["offset"],
                group=row["group"],
                timestamp_ms=int(row["timestamp_ms"]),
                emitter_id=row["emitter_id"],
                emitter_seq=row["emitter_seq"],
                attributes=_attributes(row["attributes"]),
            )
        )
    return traces


def _attributes(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}
