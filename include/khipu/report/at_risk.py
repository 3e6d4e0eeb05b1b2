"""Messages at risk: unconsumed records that retention removes before their group reaches them, named.

Consumer health says it per partition (EXPIRY_RISK: the oldest unconsumed record is close to ``retention.ms``).
This names the messages: a group's unconsumed offsets on a partition (from its committed offset to the log end,
as the newest offset snapshot saw them) are mapped to message ids through the SENT traces in the trace archive,
which carry each record's topic, partition, offset and timestamp.

A record leaves the log by time retention at the earliest ``timestamp + retention.ms`` (the broker deletes whole
segments once their newest record is that old, so it may stay a little longer, never less). Its group reaches it
when its committed offset passes it: at the group's recent pace (committed records per ms over the last
:data:`PACE_WINDOW_MS`; zero when no member holds the partition), ``(offset - committed + 1) / pace`` after the
snapshot. A record is **at risk** when it leaves the log within the look-ahead and before its group reaches it
(a group not moving never does); one below the log start already left unread (**gone**).

The rules are pure functions over small values (:func:`pace_per_ms`, :func:`reached_at_ms`, :func:`at_risk`,
:func:`exposed`, :func:`trace_window`); :func:`messages_at_risk` reads the store and the archive for them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from khipu.access import reach_limit
from khipu.health.evaluate import time_lag_bound_ms
from khipu.offsets.model import PartitionKey, PartitionSnapshot
from khipu.registry.model import Registry
from khipu.report.search import MAX_SCAN_BYTES, archive_hours, hour_files, plan_scan
from khipu.storage.location import Location
from khipu.store import Store
from khipu.trace.archive import HOUR_MS

PACE_WINDOW_MS = 10 * 60_000  # the group's pace: its committed offsets over the last ten minutes of snapshots
SNAPSHOTS_MS = HOUR_MS  # offset snapshots older than this are not read (the snapshot DAG takes one a minute)
TRACE_SLACK_MS = HOUR_MS  # a SENT trace reaches the archive's hour of its arrival, a little after its record
DEFAULT_WITHIN_MS = HOUR_MS


@dataclass(frozen=True, slots=True)
class Backlog:
    """One group's unconsumed records on one partition, as the newest offset snapshot saw them."""

    key: PartitionKey
    committed: int  # the next offset the group reads
    log_start: int
    log_end: int
    retention_ms: int  # the topic's retention.ms (> 0)
    observed_ms: int  # the snapshot's time
    pace_per_ms: float  # records the group committed per ms lately (0: not moving)
    time_lag_ms: int | None = None  # the oldest unconsumed record's age (consumer health's time lag)
    status: str | None = None  # the partition's consumer-health status

    @property
    def unconsumed(self) -> int:
        return max(0, self.log_end - self.committed)


@dataclass(frozen=True, slots=True)
class SentRecord:
    """A record as its SENT trace tells it: which message sits at which offset, written when."""

    message_id: str
    stream: str
    cluster: str
    topic: str
    partition: int
    offset: int
    timestamp_ms: int  # the record's timestamp: what time retention goes by


@dataclass(frozen=True, slots=True)
class AtRisk:
    message_id: str
    stream: str
    cluster: str
    group: str
    topic: str
    partition: int
    offset: int
    written_ms: int
    leaves_ms: int  # written + retention.ms: the earliest time retention removes it
    time_left_ms: int  # leaves_ms - now (0 or less: due now, or gone)
    reached_ms: int | None  # when its group reaches it at its pace (None: the group is not moving)
    gone: bool  # below the log start already: aged out unread


def pace_per_ms(history: Sequence[PartitionSnapshot], now_ms: int, window_ms: int = PACE_WINDOW_MS) -> float:
    """Records per ms the group committed on this partition over the snapshots of the last ``window_ms``
    (oldest first); 0 when no member holds the partition now, or fewer than two commits are known."""
    if not history or not history[-1].live:
        return 0.0
    recent = [s for s in history if s.committed is not None and s.snapshot_ms >= now_ms - window_ms]
    if len(recent) < 2 or recent[-1].snapshot_ms <= recent[0].snapshot_ms:
        return 0.0
    moved = (recent[-1].committed or 0) - (recent[0].committed or 0)
    return max(0.0, moved / (recent[-1].snapshot_ms - recent[0].snapshot_ms))


def reached_at_ms(backlog: Backlog, offset: int) -> int | None:
    """When the group's committed offset passes ``offset`` at its pace; None when it is not moving."""
    if offset < backlog.committed:
        return backlog.observed_ms
    if backlog.pace_per_ms <= 0:
        return None
    return backlog.observed_ms + math.ceil((offset - backlog.committed + 1) / backlog.pace_per_ms)


def exposed(backlog: Backlog, now_ms: int, within_ms: int) -> bool:
    """Whether any of the backlog's records can leave the log within the look-ahead: some already left (the log
    starts past the committed offset), or the oldest unconsumed one leaves by ``now + within`` (its age is the
    time lag; unknown: perhaps)."""
    if backlog.unconsumed == 0 and backlog.log_start <= backlog.committed:
        return False
    if backlog.log_start > backlog.committed or backlog.time_lag_ms is None:
        return True
    return now_ms - backlog.time_lag_ms + backlog.retention_ms <= now_ms + within_ms


def trace_window(backlog: Backlog, now_ms: int, within_ms: int, slack_ms: int = TRACE_SLACK_MS) -> tuple[int, int]:
    """The arrival times whose archive hours hold the SENT traces of the backlog's records that leave within the
    look-ahead: from the oldest unconsumed record's write (or two retentions back, when its age is unknown) to
    ``now + within - retention``, widened by ``slack_ms`` each side."""
    newest = now_ms + within_ms - backlog.retention_ms + slack_ms
    if backlog.time_lag_ms is not None:
        oldest = now_ms - backlog.time_lag_ms - slack_ms
    else:
        oldest = now_ms - 2 * backlog.retention_ms - slack_ms
    return min(oldest, newest), newest


def at_risk(backlogs: Iterable[Backlog], records: Iterable[SentRecord], now_ms: int, within_ms: int) -> list[AtRisk]:
    """The records of each backlog that leave the log within ``within_ms`` of ``now_ms`` before their group
    reaches them, and those already gone; soonest to leave first. A record traced twice (a replayed archive
    batch) counts once."""
    by_partition: dict[tuple[str, str, int], list[SentRecord]] = {}
    for record in records:
        by_partition.setdefault((record.cluster, record.topic, record.partition), []).append(record)
    found: dict[tuple[str, str, int, int, str], AtRisk] = {}
    for backlog in backlogs:
        key = backlog.key
        for record in by_partition.get((key.cluster, key.topic, key.partition), []):
            if not backlog.committed <= record.offset < backlog.log_end:
                continue
            gone = record.offset < backlog.log_start
            leaves = record.timestamp_ms + backlog.retention_ms
            if not gone and leaves > now_ms + within_ms:
                continue  # leaves after the look-ahead
            reached = reached_at_ms(backlog, record.offset)
            if not gone and reached is not None and reached < leaves:
                continue  # its group gets there first
            found[(key.group, key.topic, key.partition, record.offset, record.message_id)] = AtRisk(
                message_id=record.message_id,
                stream=record.stream,
                cluster=key.cluster,
                group=key.group,
                topic=key.topic,
                partition=key.partition,
                offset=record.offset,
                written_ms=record.timestamp_ms,
                leaves_ms=leaves,
                time_left_ms=leaves - now_ms,
                reached_ms=reached,
                gone=gone,
            )
    return sorted(found.values(), key=lambda r: (r.leaves_ms, r.group, r.topic, r.partition, r.offset))


@dataclass(frozen=True, slots=True)
class BacklogLine:
    """A partition judged: its backlog and how many of its messages are named at risk."""

    cluster: str
    group: str
    topic: str
    partition: int
    status: str | None
    committed: int
    log_start: int
    log_end: int
    unconsumed: int
    retention_ms: int
    pace_per_s: float
    at_risk: int
    gone: int


@dataclass(frozen=True, slots=True)
class AtRiskReport:
    cluster: str
    now_ms: int
    within_ms: int
    partitions: list[BacklogLine]  # every partition with unconsumed records that may leave within the look-ahead
    messages: list[AtRisk]
    complete: bool  # every archive hour the records' traces can be in was read
    notes: list[str] = field(default_factory=list)


def backlogs_of(
    histories: Mapping[PartitionKey, Sequence[PartitionSnapshot]],
    health: Mapping[PartitionKey, tuple[int | None, str]],
) -> list[Backlog]:
    """Each partition's backlog from its snapshots (oldest first) and its consumer health (time lag, status):
    those whose newest snapshot knows the committed offset, the log's ends and a time retention."""
    backlogs = []
    for key, history in sorted(histories.items()):
        latest = history[-1]
        if None in (latest.committed, latest.log_start, latest.log_end) or not (latest.retention_ms or 0) > 0:
            continue
        time_lag, status = health.get(key, (None, None))
        backlogs.append(
            Backlog(
                key=key,
                committed=int(latest.committed or 0),
                log_start=int(latest.log_start or 0),
                log_end=int(latest.log_end or 0),
                retention_ms=int(latest.retention_ms or 0),
                observed_ms=latest.snapshot_ms,
                pace_per_ms=pace_per_ms(history, latest.snapshot_ms),
                time_lag_ms=time_lag,
                status=status,
            )
        )
    return backlogs


def oldest_age_ms(health_row: Mapping[str, Any]) -> int | None:
    """The age to reckon a backlog's oldest record with, from its stored consumer health: the time lag, or when
    that was not measured (records written since the previous snapshot) the bound it is under: the record is no
    older, so it leaves no sooner than this says, and its trace is no older either."""
    if health_row["time_lag_ms"] is not None:
        return int(health_row["time_lag_ms"])
    return time_lag_bound_ms(json.loads(health_row.get("evidence") or "{}"))


def messages_at_risk(
    store: Store,
    archive_dir: Location | Path | None,
    cluster: str,
    now_ms: int,
    within_ms: int = DEFAULT_WITHIN_MS,
    max_scan_bytes: int = MAX_SCAN_BYTES,
    registry: Registry | None = None,
) -> AtRiskReport:
    """The messages of ``cluster`` at risk within ``within_ms``: backlogs from the offset snapshots of the last hour
    and consumer health, their records named by the SENT traces of the archive hours they can be in (at most
    ``max_scan_bytes`` of them, newest first; a note says when not all could be read). Given the registry as one
    person sees it, of the partitions its streams' routes read, and the messages of its streams, only."""
    reach = reach_limit(registry) if registry is not None else None
    health = {
        PartitionKey(r["cluster"], r["group_id"], r["topic"], int(r["partition"])): (oldest_age_ms(r), str(r["status"]))
        for r in store.health.current_rows(cluster)
    }
    backlogs = [
        b
        for b in backlogs_of(store.snapshots.histories(cluster, since_ms=now_ms - SNAPSHOTS_MS), health)
        if exposed(b, now_ms, within_ms) and (reach is None or (b.key.cluster, b.key.group, b.key.topic) in reach.reads)
    ]
    notes: list[str] = []
    records: list[SentRecord] = []
    complete = True
    if backlogs:
        windows = [trace_window(b, now_ms, within_ms) for b in backlogs]
        plan = plan_scan(
            archive_hours(archive_dir), min(w[0] for w in windows), max(w[1] for w in windows), max_scan_bytes
        )
        if plan.note:
            notes.append(plan.note)
        complete = plan.complete
        records = scan_sent(archive_dir, plan.hours, backlogs)
    named = [r for r in at_risk(backlogs, records, now_ms, within_ms) if reach is None or r.stream in reach.streams]
    lines = [
        BacklogLine(
            cluster=b.key.cluster,
            group=b.key.group,
            topic=b.key.topic,
            partition=b.key.partition,
            status=b.status,
            committed=b.committed,
            log_start=b.log_start,
            log_end=b.log_end,
            unconsumed=b.unconsumed,
            retention_ms=b.retention_ms,
            pace_per_s=b.pace_per_ms * 1000,
            at_risk=sum(1 for r in named if (r.group, r.topic, r.partition) == b.key[1:] and not r.gone),
            gone=sum(1 for r in named if (r.group, r.topic, r.partition) == b.key[1:] and r.gone),
        )
        for b in backlogs
    ]
    return AtRiskReport(cluster, now_ms, within_ms, lines, named, complete, notes)


def scan_sent(
    archive_dir: Location | Path | None, hours: Sequence[int], backlogs: Sequence[Backlog]
) -> list[SentRecord]:
    """The SENT traces in these archive hours of the backlogs' unconsumed offsets, batch by batch (the archive a
    local folder or an object store)."""
    if archive_dir is None or not hours or not backlogs:
        return []
    root = Location.of(archive_dir, "archive")
    files = hour_files(root, hours)
    if not files:
        return []
    wanted: ds.Expression | None = None
    for b in backlogs:
        one = (
            (ds.field("cluster") == b.key.cluster)
            & (ds.field("topic") == b.key.topic)
            & (ds.field("partition") == b.key.partition)
            & (ds.field("offset") >= b.committed)
            & (ds.field("offset") < b.log_end)
        )
        wanted = one if wanted is None else wanted | one
    assert wanted is not None
    condition = (ds.field("type") == "SENT") & wanted
    columns = ["message_id", "stream", "cluster", "topic", "partition", "offset", "timestamp_ms"]
    return [
        SentRecord(
            r["message_id"],
            r["stream"],
            r["cluster"],
            r["topic"],
            int(r["partition"]),
            int(r["offset"]),
            int(r["timestamp_ms"]),
        )
        for batch in ds.dataset(files, format="parquet", filesystem=root.filesystem()).to_batches(
            columns=columns, filter=condition
        )
        for r in batch.to_pylist()
    ]
