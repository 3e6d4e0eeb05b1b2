"""Offset snapshots and their runs: what the offset-snapshot DAG saw of each group and partition, minute by minute.

Health reads a partition's history from here; the detector reads committed offsets and log starts
(:mod:`khipu.detector.committed`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, delete, func, insert, or_, select
from sqlalchemy.exc import IntegrityError

from khipu.offsets.model import GROUP_STATES_WITHOUT_MEMBERS, PartitionKey, PartitionSnapshot, SnapshotRun
from khipu.store import schema
from khipu.store.engine import StoreEngine, partition_key_is


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    snapshot_ms: int  # when this committed offset was observed


@dataclass(frozen=True, slots=True)
class RemovalEvidence:
    first_gone_ms: int | None  # the first snapshot whose log start was past the record
    passed_while_present: bool  # the group's committed offset was past it while the log still held it
    retention_ms: int | None  # from the newest snapshot that reported it
    retention_bytes: int | None


class SnapshotRepository:
    """``store.snapshots``: offset snapshots and snapshot runs."""

    def __init__(self, engine: StoreEngine) -> None:
        self._engine = engine

    def write(self, run: SnapshotRun, rows: Sequence[PartitionSnapshot]) -> bool:
        """Store one snapshot in one transaction; False when this cluster's snapshot at that time exists.

        Each row is stored with whether its committed offset changed since the group's previous
        snapshot of that partition.
        """
        table = schema.offset_snapshots
        try:
            with self._engine.begin() as tx:
                before = tx.execute(
                    select(func.max(table.c.snapshot_ms)).where(
                        table.c.cluster == run.cluster, table.c.snapshot_ms < run.snapshot_ms
                    )
                ).scalar()
                previous: dict[PartitionKey, int | None] = {}
                if before is not None:
                    for row in tx.execute(
                        select(table).where(table.c.cluster == run.cluster, table.c.snapshot_ms == before)
                    ):
                        previous[PartitionKey(row.cluster, row.group_id, row.topic, row.partition)] = (
                            row.committed_offset
                        )
                tx.execute(
                    insert(schema.snapshot_runs).values(
                        cluster=run.cluster,
                        snapshot_ms=run.snapshot_ms,
                        groups=run.groups,
                        partitions=run.partitions,
                        duration_ms=run.duration_ms,
                        errors=json.dumps(list(run.errors)),
                    )
                )
                if rows:
                    tx.execute(
                        insert(table),
                        [
                            {
                                **_snapshot_row(row),
                                "committed_changed": row.committed is not None
                                and row.key in previous
                                and previous[row.key] != row.committed,
                            }
                            for row in rows
                        ],
                    )
        except IntegrityError:
            return False
        return True

    def runs(self, cluster: str, since_ms: int = 0) -> list[SnapshotRun]:
        table = schema.snapshot_runs
        with self._engine.begin() as tx:
            result = tx.execute(
                select(table)
                .where(table.c.cluster == cluster, table.c.snapshot_ms >= since_ms)
                .order_by(table.c.snapshot_ms)
            )
            return [
                SnapshotRun(
                    r.snapshot_ms, r.cluster, r.groups, r.partitions, r.duration_ms, tuple(json.loads(r.errors))
                )
                for r in result
            ]

    def histories(
        self, cluster: str, since_ms: int, keys: Iterable[PartitionKey] | None = None
    ) -> dict[PartitionKey, list[PartitionSnapshot]]:
        """Snapshots since ``since_ms`` per partition key, oldest first (of ``keys`` only, when given)."""
        table = schema.offset_snapshots
        query = select(table).where(table.c.cluster == cluster, table.c.snapshot_ms >= since_ms)
        wanted = set(keys) if keys is not None else None
        if wanted is not None:
            query = query.where(table.c.group_id.in_({k.group for k in wanted}))
        result: dict[PartitionKey, list[PartitionSnapshot]] = defaultdict(list)
        with self._engine.begin() as tx:
            for row in tx.execute(query.order_by(table.c.snapshot_ms)):
                snapshot = _snapshot_from(row)
                if wanted is None or snapshot.key in wanted:
                    result[snapshot.key].append(snapshot)
        return dict(result)

    def latest(self, cluster: str) -> list[PartitionSnapshot]:
        """Every row of the cluster's newest snapshot."""
        table = schema.offset_snapshots
        with self._engine.begin() as tx:
            newest = tx.execute(select(func.max(table.c.snapshot_ms)).where(table.c.cluster == cluster)).scalar()
            if newest is None:
                return []
            rows = tx.execute(
                select(table)
                .where(table.c.cluster == cluster, table.c.snapshot_ms == newest)
                .order_by(table.c.group_id, table.c.topic, table.c.partition)
            )
            return [_snapshot_from(row) for row in rows]

    def partition_history(self, key: PartitionKey, *, live_limit: int, recent_limit: int) -> list[PartitionSnapshot]:
        """The newest ``recent_limit`` snapshots of a partition together with its newest ``live_limit``
        live ones (:attr:`PartitionSnapshot.live`, however long ago), oldest first."""
        table = schema.offset_snapshots
        same = and_(*partition_key_is(table, key))
        state_says_live = or_(table.c.group_state.is_(None), table.c.group_state.not_in(GROUP_STATES_WITHOUT_MEMBERS))
        live = and_(
            table.c.committed_offset.is_not(None),
            or_(
                table.c.committed_changed.is_(True),
                table.c.assigned.is_(True),
                and_(table.c.assigned.is_(None), state_says_live),
            ),
        )
        with self._engine.begin() as tx:
            recent = tx.execute(select(table).where(same).order_by(table.c.snapshot_ms.desc()).limit(recent_limit))
            lived = tx.execute(select(table).where(same, live).order_by(table.c.snapshot_ms.desc()).limit(live_limit))
            merged = {row.snapshot_ms: _snapshot_from(row) for row in [*recent, *lived]}
        return [merged[at] for at in sorted(merged)]

    def backlog_started_ms(self, cluster: str, topic: str, partition: int, committed: int) -> int | None:
        """When the log end first passed ``committed``: the first snapshot after the last one whose log end
        was at or below it (or the oldest snapshot, when none was: then a lower bound on the age)."""
        table = schema.offset_snapshots
        same = and_(table.c.cluster == cluster, table.c.topic == topic, table.c.partition == partition)
        with self._engine.begin() as tx:
            caught_up = tx.execute(
                select(func.max(table.c.snapshot_ms)).where(same, table.c.log_end_offset <= committed)
            ).scalar()
            after = select(func.min(table.c.snapshot_ms)).where(same, table.c.log_end_offset > committed)
            if caught_up is not None:
                after = after.where(table.c.snapshot_ms > caught_up)
            started = tx.execute(after).scalar()
        return None if started is None else int(started)

    def committed_offset_at(
        self, cluster: str, group: str, topic: str, partition: int, at_ms: int
    ) -> CommittedOffset | None:
        """The group's latest committed offset on the partition as of ``at_ms``, from the snapshots."""
        table = schema.offset_snapshots
        with self._engine.begin() as tx:
            row = tx.execute(
                select(table.c.committed_offset, table.c.snapshot_ms)
                .where(
                    table.c.cluster == cluster,
                    table.c.group_id == group,
                    table.c.topic == topic,
                    table.c.partition == partition,
                    table.c.snapshot_ms <= at_ms,
                    table.c.committed_offset.is_not(None),
                )
                .order_by(table.c.snapshot_ms.desc())
                .limit(1)
            ).first()
        return None if row is None else CommittedOffset(int(row.committed_offset), int(row.snapshot_ms))

    def latest_log_start(self, cluster: str, topic: str, partition: int) -> tuple[int, int] | None:
        """The partition's log-start offset in its newest snapshot: (snapshot_ms, log_start)."""
        table = schema.offset_snapshots
        with self._engine.begin() as tx:
            row = tx.execute(
                select(table.c.snapshot_ms, table.c.log_start_offset)
                .where(
                    table.c.cluster == cluster,
                    table.c.topic == topic,
                    table.c.partition == partition,
                    table.c.log_start_offset.is_not(None),
                )
                .order_by(table.c.snapshot_ms.desc())
                .limit(1)
            ).first()
        return None if row is None else (int(row.snapshot_ms), int(row.log_start_offset))

    def removal_evidence(self, cluster: str, group: str, topic: str, partition: int, offset: int) -> RemovalEvidence:
        """What the snapshot history says of a record that left its log: when it was first seen gone, whether
        the group's committed offset was past it while it was still there (a skip), the topic's retention as it
        was then (the newest snapshot at or before it was first seen gone: retention changed since says nothing of
        why it went; the newest of all when none is that old)."""
        table = schema.offset_snapshots
        same = and_(table.c.cluster == cluster, table.c.topic == topic, table.c.partition == partition)
        with self._engine.begin() as tx:
            first_gone = tx.execute(
                select(func.min(table.c.snapshot_ms)).where(same, table.c.log_start_offset > offset)
            ).scalar()
            skipped = tx.execute(
                select(table.c.snapshot_ms)
                .where(
                    same,
                    table.c.group_id == group,
                    table.c.committed_offset > offset,
                    table.c.log_start_offset <= offset,
                )
                .limit(1)
            ).first()
            kept_query = (
                select(table.c.retention_ms, table.c.retention_bytes)
                .where(same, table.c.retention_ms.is_not(None))
                .order_by(table.c.snapshot_ms.desc())
                .limit(1)
            )
            kept = tx.execute(kept_query.where(table.c.snapshot_ms <= first_gone)).first() if first_gone else None
            kept = kept or tx.execute(kept_query).first()
        return RemovalEvidence(
            first_gone_ms=None if first_gone is None else int(first_gone),
            passed_while_present=skipped is not None,
            retention_ms=None if kept is None else kept.retention_ms,
            retention_bytes=None if kept is None else kept.retention_bytes,
        )

    def latest_committed(self, cluster: str, group: str) -> tuple[int, dict[tuple[str, int], int]] | None:
        """The group's committed offsets from its newest snapshot: (snapshot_ms, {(topic, partition): offset})."""
        table = schema.offset_snapshots
        with self._engine.begin() as tx:
            newest = tx.execute(
                select(func.max(table.c.snapshot_ms)).where(table.c.cluster == cluster, table.c.group_id == group)
            ).scalar()
            if newest is None:
                return None
            rows = tx.execute(
                select(table.c.topic, table.c.partition, table.c.committed_offset).where(
                    table.c.cluster == cluster,
                    table.c.group_id == group,
                    table.c.snapshot_ms == newest,
                    table.c.committed_offset.is_not(None),
                )
            )
            return int(newest), {(r.topic, r.partition): int(r.committed_offset) for r in rows}

    def prune(self, before_ms: int) -> int:
        """Delete snapshots (and their run records) older than ``before_ms``; return the rows deleted."""
        with self._engine.begin() as tx:
            deleted = tx.execute(
                delete(schema.offset_snapshots).where(schema.offset_snapshots.c.snapshot_ms < before_ms)
            )
            tx.execute(delete(schema.snapshot_runs).where(schema.snapshot_runs.c.snapshot_ms < before_ms))
            return int(deleted.rowcount or 0)


def _snapshot_row(row: PartitionSnapshot) -> dict[str, Any]:
    return dict(
        cluster=row.cluster,
        group_id=row.group,
        topic=row.topic,
        partition=row.partition,
        snapshot_ms=row.snapshot_ms,
        committed_offset=row.committed,
        log_start_offset=row.log_start,
        log_end_offset=row.log_end,
        group_state=row.group_state,
        retention_ms=row.retention_ms,
        members=row.members,
        assigned=row.assigned,
        retention_bytes=row.retention_bytes,
    )


def _snapshot_from(row: Any) -> PartitionSnapshot:
    return PartitionSnapshot(
        row.snapshot_ms,
        row.cluster,
        row.group_id,
        row.topic,
        row.partition,
        row.committed_offset,
        row.log_start_offset,
        row.log_end_offset,
        row.group_state,
        row.retention_ms,
        bool(row.committed_changed),
        members=row.members,
        assigned=None if row.assigned is None else bool(row.assigned),
        retention_bytes=row.retention_bytes,
    )
