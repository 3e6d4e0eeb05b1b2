"""The store's operations. Every write of one logical step is one transaction."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, and_, create_engine, delete, event, func, insert, or_, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, OperationalError

from khipu.alerting.decide import Transition
from khipu.alerting.model import Alert, AlertState, Severity
from khipu.health.evaluate import PartitionHealth
from khipu.health.rules import PartitionStatus
from khipu.health.windows import OffsetWindow, WindowKind
from khipu.offsets.model import GROUP_STATES_WITHOUT_MEMBERS, PartitionKey, PartitionSnapshot, SnapshotRun
from khipu.store import schema

MIGRATIONS = Path(__file__).parent / "migrations"


class StoreError(RuntimeError):
    """The store could not be reached or used; the message names the store without its password."""


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    snapshot_ms: int  # when this committed offset was observed


@dataclass(frozen=True, slots=True)
class StoredStatus:
    status: PartitionStatus
    since_ms: int


class Store:
    def __init__(self, url: str, **engine_options: Any) -> None:
        self.url = url
        self.safe_url = make_url(url).render_as_string(hide_password=True)
        if url.startswith("sqlite") and ":memory:" not in url:
            database = make_url(url).database
            if database:
                Path(database).parent.mkdir(parents=True, exist_ok=True)
        if url.startswith("sqlite"):
            engine_options.setdefault("connect_args", {"timeout": 30})
        self.engine: Engine = create_engine(url, **engine_options)
        if url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_for_concurrent_writers)

    def close(self) -> None:
        self.engine.dispose()

    def migrate(self) -> None:
        """Create or upgrade the schema to the newest migration (safe to repeat)."""
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        try:
            with self.engine.begin() as connection:
                config.attributes["connection"] = connection
                command.upgrade(config, "head")
        except OperationalError as exc:
            raise StoreError(f"cannot migrate the store at {self.safe_url}: {exc.orig}") from None

    def _begin(self) -> Any:
        try:
            return self.engine.begin()
        except OperationalError as exc:
            raise StoreError(f"cannot reach the store at {self.safe_url}: {exc.orig}") from None

    # -- snapshots ------------------------------------------------------------------------

    def write_snapshot(self, run: SnapshotRun, rows: Sequence[PartitionSnapshot]) -> bool:
        """Store one snapshot in one transaction; False when this cluster's snapshot at that time exists.

        Each row is stored with whether its committed offset changed since the group's previous
        snapshot of that partition.
        """
        table = schema.offset_snapshots
        try:
            with self._begin() as tx:
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

    def snapshot_runs(self, cluster: str, since_ms: int = 0) -> list[SnapshotRun]:
        table = schema.snapshot_runs
        with self._begin() as tx:
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
        with self._begin() as tx:
            for row in tx.execute(query.order_by(table.c.snapshot_ms)):
                snapshot = _snapshot_from(row)
                if wanted is None or snapshot.key in wanted:
                    result[snapshot.key].append(snapshot)
        return dict(result)

    def latest_snapshot(self, cluster: str) -> list[PartitionSnapshot]:
        """Every row of the cluster's newest snapshot."""
        table = schema.offset_snapshots
        with self._begin() as tx:
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
        live ones (taken while the group had members, however long ago), oldest first."""
        table = schema.offset_snapshots
        same = and_(*_key_filter(table, key))
        live = and_(
            table.c.committed_offset.is_not(None),
            or_(table.c.group_state.is_(None), table.c.group_state.not_in(GROUP_STATES_WITHOUT_MEMBERS)),
        )
        with self._begin() as tx:
            recent = tx.execute(select(table).where(same).order_by(table.c.snapshot_ms.desc()).limit(recent_limit))
            lived = tx.execute(select(table).where(same, live).order_by(table.c.snapshot_ms.desc()).limit(live_limit))
            merged = {row.snapshot_ms: _snapshot_from(row) for row in [*recent, *lived]}
        return [merged[at] for at in sorted(merged)]

    def backlog_started_ms(self, cluster: str, topic: str, partition: int, committed: int) -> int | None:
        """When the log end first passed ``committed``: the first snapshot after the last one whose log end
        was at or below it (or the oldest snapshot, when none was: then a lower bound on the age)."""
        table = schema.offset_snapshots
        same = and_(table.c.cluster == cluster, table.c.topic == topic, table.c.partition == partition)
        with self._begin() as tx:
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
        with self._begin() as tx:
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

    def latest_committed(self, cluster: str, group: str) -> tuple[int, dict[tuple[str, int], int]] | None:
        """The group's committed offsets from its newest snapshot: (snapshot_ms, {(topic, partition): offset})."""
        table = schema.offset_snapshots
        with self._begin() as tx:
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

    def prune_snapshots(self, before_ms: int) -> int:
        """Delete snapshots (and their run records) older than ``before_ms``; return the rows deleted."""
        with self._begin() as tx:
            deleted = tx.execute(
                delete(schema.offset_snapshots).where(schema.offset_snapshots.c.snapshot_ms < before_ms)
            )
            tx.execute(delete(schema.snapshot_runs).where(schema.snapshot_runs.c.snapshot_ms < before_ms))
            return int(deleted.rowcount or 0)

    # -- health ---------------------------------------------------------------------------

    def current_statuses(self, cluster: str) -> dict[PartitionKey, StoredStatus]:
        table = schema.partition_health
        with self._begin() as tx:
            rows = tx.execute(select(table).where(table.c.cluster == cluster))
            return {
                PartitionKey(r.cluster, r.group_id, r.topic, r.partition): StoredStatus(
                    PartitionStatus[r.status], r.since_ms
                )
                for r in rows
            }

    def save_evaluation(
        self,
        healths: Sequence[PartitionHealth],
        changes: Sequence[Transition],
        windows: Sequence[OffsetWindow],
        alerts: Sequence[Alert],
    ) -> None:
        """Statuses, transitions, new windows and the alerts they raise, in one transaction (idempotent)."""
        changed = {change.key: change for change in changes}
        table = schema.partition_health
        with self._begin() as tx:
            existing = {
                PartitionKey(r.cluster, r.group_id, r.topic, r.partition): r.since_ms
                for r in tx.execute(
                    select(table.c.cluster, table.c.group_id, table.c.topic, table.c.partition, table.c.since_ms)
                )
            }
            for health in healths:
                values = dict(
                    status=health.status.name,
                    evaluated_ms=health.evaluated_ms,
                    lag=health.lag,
                    time_lag_ms=health.time_lag_ms,
                    reason=health.reason,
                    evidence=json.dumps(health.evidence),
                )
                if health.key in changed or health.key not in existing:
                    values["since_ms"] = health.evaluated_ms
                if health.key in existing:
                    tx.execute(update(table).where(*_key_filter(table, health.key)).values(**values))
                else:
                    tx.execute(
                        insert(table).values(
                            cluster=health.key.cluster,
                            group_id=health.key.group,
                            topic=health.key.topic,
                            partition=health.key.partition,
                            **values,
                        )
                    )
            for change in changes:
                tx.execute(
                    insert(schema.health_transitions).values(
                        cluster=change.key.cluster,
                        group_id=change.key.group,
                        topic=change.key.topic,
                        partition=change.key.partition,
                        from_status=change.from_status.name if change.from_status is not None else None,
                        to_status=change.to_status.name,
                        at_ms=change.at_ms,
                        reason=change.health.reason,
                        evidence=json.dumps(change.health.evidence),
                    )
                )
            for window in windows:
                _insert_ignoring_duplicate(
                    tx,
                    schema.offset_windows,
                    dict(
                        cluster=window.key.cluster,
                        group_id=window.key.group,
                        topic=window.key.topic,
                        partition=window.key.partition,
                        kind=window.kind.value,
                        from_offset=window.from_offset,
                        to_offset=window.to_offset,
                        detected_ms=window.detected_ms,
                        previous_committed=window.previous_committed,
                        committed=window.committed,
                    ),
                )
            for alert in alerts:
                _insert_ignoring_duplicate(tx, schema.alerts, _alert_row(alert))

    def transitions(self, cluster: str, since_ms: int = 0) -> list[tuple[PartitionKey, str | None, str, int]]:
        table = schema.health_transitions
        with self._begin() as tx:
            rows = tx.execute(
                select(table)
                .where(table.c.cluster == cluster, table.c.at_ms >= since_ms)
                .order_by(table.c.at_ms, table.c.id)
            )
            return [
                (PartitionKey(r.cluster, r.group_id, r.topic, r.partition), r.from_status, r.to_status, r.at_ms)
                for r in rows
            ]

    def offset_windows(
        self, cluster: str, topic: str | None = None, partition: int | None = None, covering_offset: int | None = None
    ) -> list[OffsetWindow]:
        """Stored windows, optionally of one partition and containing ``covering_offset``."""
        table = schema.offset_windows
        query = select(table).where(table.c.cluster == cluster)
        if topic is not None:
            query = query.where(table.c.topic == topic)
        if partition is not None:
            query = query.where(table.c.partition == partition)
        if covering_offset is not None:
            query = query.where(table.c.from_offset <= covering_offset, table.c.to_offset > covering_offset)
        with self._begin() as tx:
            return [
                OffsetWindow(
                    PartitionKey(r.cluster, r.group_id, r.topic, r.partition),
                    WindowKind(r.kind),
                    r.from_offset,
                    r.to_offset,
                    r.detected_ms,
                    r.previous_committed,
                    r.committed,
                )
                for r in tx.execute(query.order_by(table.c.detected_ms))
            ]

    # -- detector outputs -----------------------------------------------------------------

    def upsert_verdicts(self, rows: Sequence[Mapping[str, Any]]) -> set[tuple[str, str, int]]:
        """Insert or replace verdicts by (message id, hop): a replayed batch never stores one twice.

        Returns the (stream, hop, minute) metric keys the rows touch.
        """
        if not rows:
            return set()
        table = schema.verdicts
        values = [
            {
                "message_id": r["message_id"],
                "hop": r["hop"],
                "group_id": r.get("group"),
                **{c: r.get(c) for c in _VERDICT_COLUMNS if c != "group_id"},
            }
            for r in rows
        ]
        with self._begin() as tx:
            dialect = tx.dialect.name
            insert_of = postgresql_insert if dialect == "postgresql" else sqlite_insert
            statement = insert_of(table)
            tx.execute(
                statement.on_conflict_do_update(
                    index_elements=["message_id", "hop"],
                    set_={c: getattr(statement.excluded, c) for c in _VERDICT_COLUMNS},
                ),
                values,
            )
        return {(r["stream"], r["hop"], int(r["decided_ms"]) // MINUTE_MS * MINUTE_MS) for r in rows}

    def refresh_metrics(self, keys: Iterable[tuple[str, str, int]]) -> None:
        """Recompute the given (stream, hop, minute) metrics from the stored verdicts (idempotent)."""
        table, metrics = schema.verdicts, schema.verdict_metrics
        with self._begin() as tx:
            insert_of = postgresql_insert if tx.dialect.name == "postgresql" else sqlite_insert
            for stream, hop, minute in sorted(set(keys)):
                rows = tx.execute(
                    select(table.c.verdict, table.c.latency_ms).where(
                        table.c.stream == stream,
                        table.c.hop == hop,
                        table.c.decided_ms >= minute,
                        table.c.decided_ms < minute + MINUTE_MS,
                    )
                ).all()
                counts = {
                    kind: sum(1 for r in rows if r.verdict == kind)
                    for kind in ("DELIVERED", "LOST", "DUPLICATE", "TRACE_LOST", "PENDING")
                }
                judged = sum(counts.values()) or 1
                latencies = [int(r.latency_ms) for r in rows if r.latency_ms is not None]
                values = dict(
                    stream=stream,
                    hop=hop,
                    minute_ms=minute,
                    delivered=counts["DELIVERED"],
                    lost=counts["LOST"],
                    duplicate=counts["DUPLICATE"],
                    trace_lost=counts["TRACE_LOST"],
                    pending=counts["PENDING"],
                    loss_rate=counts["LOST"] / judged,
                    duplicate_rate=counts["DUPLICATE"] / judged,
                    latency_p50_ms=_percentile(latencies, 0.50),
                    latency_p95_ms=_percentile(latencies, 0.95),
                    latency_p99_ms=_percentile(latencies, 0.99),
                )
                statement = insert_of(metrics).values(**values)
                tx.execute(
                    statement.on_conflict_do_update(
                        index_elements=["stream", "hop", "minute_ms"],
                        set_={k: v for k, v in values.items() if k not in ("stream", "hop", "minute_ms")},
                    )
                )

    def verdicts(self, stream: str | None = None, since_ms: int = 0) -> list[dict[str, Any]]:
        table = schema.verdicts
        query = select(table).where(table.c.decided_ms >= since_ms)
        if stream is not None:
            query = query.where(table.c.stream == stream)
        with self._begin() as tx:
            return [dict(row._mapping) for row in tx.execute(query.order_by(table.c.decided_ms, table.c.message_id))]

    def metrics(self, stream: str | None = None, since_ms: int = 0) -> list[dict[str, Any]]:
        table = schema.verdict_metrics
        query = select(table).where(table.c.minute_ms >= since_ms)
        if stream is not None:
            query = query.where(table.c.stream == stream)
        with self._begin() as tx:
            return [dict(row._mapping) for row in tx.execute(query.order_by(table.c.minute_ms, table.c.hop))]

    def add_quarantine(self, rows: Sequence[Mapping[str, Any]], at_ms: int) -> int:
        """Record malformed trace records (once each, by their position on the trace topic)."""
        added = 0
        with self._begin() as tx:
            for row in rows:
                added += _insert_ignoring_duplicate(
                    tx,
                    schema.quarantine,
                    dict(
                        source_topic=row["source_topic"],
                        source_partition=row["source_partition"],
                        source_offset=row["source_offset"],
                        reason=row["quarantine_reason"],
                        raw_value=row["raw_value"],
                        kafka_timestamp_ms=row.get("kafka_timestamp_ms"),
                        quarantined_ms=at_ms,
                    ),
                )
        return added

    def quarantined(self) -> list[dict[str, Any]]:
        table = schema.quarantine
        with self._begin() as tx:
            return [
                dict(r._mapping)
                for r in tx.execute(select(table).order_by(table.c.source_partition, table.c.source_offset))
            ]

    def record_emitter_sequences(
        self, observed: Iterable[tuple[str, str, int, int, str, int, int]], now_ms: int
    ) -> int:
        """Track each emitter's sequence numbers; record its gaps (lost traces); return the new gaps.

        ``observed``: (emitter id, location, sequence number, trace time, topic, partition, offset)
        of one batch of traces and emitter marks (a mark has no topic, partition or offset). A gap
        is kept with, per partition the emitter had traced (or traces next), the offsets it had
        reached before the gap and first traced after it: a missing trace at an offset strictly
        between them may be the lost one (:meth:`trace_lost_at`); a record the group never traced
        (a skip) leaves no gap at all. Consumers work through runs of records of one partition, so
        a gap of one or two traces is looked for only on the partitions of the traces just before
        and after it. Numbers that show up late fill gaps.
        Emitters number from 0, so an emitter first seen above 0 lost its first traces. (A detector
        started at ``latest`` sees every emitter mid-way: start it at ``earliest``, the default.)
        """
        by_emitter: dict[str, tuple[str, list[tuple[int, int, str | None, int, int]]]] = {}
        for emitter_id, location, seq, at_ms, topic, partition, offset in observed:
            by_emitter.setdefault(emitter_id, (location, []))[1].append(
                (int(seq), int(at_ms), topic, int(partition or 0), int(offset or 0))
            )
        progress, gaps, windows = schema.emitter_progress, schema.trace_gaps, schema.gap_windows
        new_gaps = 0
        with self._begin() as tx:
            for emitter_id, (location, seen) in sorted(by_emitter.items()):
                seen.sort()
                row = tx.execute(select(progress).where(progress.c.emitter_id == emitter_id)).first()
                known_max = int(row.max_seq) if row else None
                late = [s for s, *_ in seen if known_max is not None and s <= known_max]
                if late:
                    self._fill_gaps(tx, emitter_id, late)
                positions: dict[str, int] = json.loads(row.positions) if row else {}
                open_windows: dict[str, list[int]] = {}
                for window in tx.execute(
                    select(windows.c.id, windows.c.topic, windows.c.partition).where(
                        windows.c.emitter_id == emitter_id, windows.c.hi_offset.is_(None)
                    )
                ):
                    open_windows.setdefault(f"{window.topic}|{window.partition}", []).append(int(window.id))
                previous: tuple[int, int] | None = (int(row.max_seq), int(row.max_seq_ms)) if row else None
                previous_key: str | None = row.last_position if row else None
                fresh = [t for t in seen if known_max is None or t[0] > known_max]
                if row is None and fresh and fresh[0][0] > 0:  # it lost traces before the first one seen
                    previous = (-1, fresh[0][1])
                for seq, at_ms, seen_topic, partition, offset in fresh:
                    position_key = f"{seen_topic}|{partition}" if seen_topic is not None else None  # None: a mark
                    if previous is not None and seq > previous[0] + 1:
                        gap_id = tx.execute(
                            insert(gaps).values(
                                emitter_id=emitter_id,
                                location=location,
                                from_seq=previous[0] + 1,
                                to_seq=seq,
                                after_ms=previous[1],
                                before_ms=at_ms,
                                noticed_ms=now_ms,
                                prev_position=previous_key,
                                next_position=position_key,
                            )
                        ).inserted_primary_key[0]
                        new_gaps += 1
                        size = seq - previous[0] - 1
                        # every partition it traced may hold the lost ones, and so may the one it traces now
                        candidates = [
                            *positions.items(),
                            *([] if position_key is None or position_key in positions else [(position_key, -1)]),
                        ]
                        for window_key, last in candidates:
                            window_topic, window_partition = window_key.rsplit("|", 1)
                            window_id = tx.execute(
                                insert(windows).values(
                                    gap_id=gap_id,
                                    emitter_id=emitter_id,
                                    location=location,
                                    topic=window_topic,
                                    partition=int(window_partition),
                                    lo_offset=last,
                                    hi_offset=None,
                                    gap_size=size,
                                )
                            ).inserted_primary_key[0]
                            open_windows.setdefault(window_key, []).append(int(window_id))
                    previous = (seq, at_ms)
                    if position_key is None:
                        continue
                    for window_id in open_windows.pop(position_key, []):
                        tx.execute(update(windows).where(windows.c.id == window_id).values(hi_offset=offset))
                    positions[position_key] = offset
                    previous_key = position_key
                if fresh:
                    values = dict(
                        location=location,
                        max_seq=fresh[-1][0],
                        max_seq_ms=fresh[-1][1],
                        positions=json.dumps(positions),
                        last_position=previous_key,
                        updated_ms=now_ms,
                    )
                    if row:
                        tx.execute(update(progress).where(progress.c.emitter_id == emitter_id).values(**values))
                    else:
                        tx.execute(insert(progress).values(emitter_id=emitter_id, **values))
        return new_gaps

    def _fill_gaps(self, tx: Connection, emitter_id: str, late: list[int]) -> None:
        """Late numbers shrink or split their gap; a gap filled completely goes, with its windows."""
        gaps, windows = schema.trace_gaps, schema.gap_windows
        for seq in late:
            for gap in tx.execute(
                select(gaps).where(gaps.c.emitter_id == emitter_id, gaps.c.from_seq <= seq, gaps.c.to_seq > seq)
            ).all():
                pieces = [(start, stop) for start, stop in ((gap.from_seq, seq), (seq + 1, gap.to_seq)) if stop > start]
                if not pieces:
                    tx.execute(delete(windows).where(windows.c.gap_id == gap.id))
                    tx.execute(delete(gaps).where(gaps.c.id == gap.id))
                    continue
                start, stop = pieces[0]
                tx.execute(update(gaps).where(gaps.c.id == gap.id).values(from_seq=start, to_seq=stop))
                for start, stop in pieces[1:]:
                    tx.execute(
                        insert(gaps).values(
                            emitter_id=emitter_id,
                            location=gap.location,
                            from_seq=start,
                            to_seq=stop,
                            after_ms=gap.after_ms,
                            before_ms=gap.before_ms,
                            noticed_ms=gap.noticed_ms,
                        )
                    )

    def trace_lost_at(self, location: str, topic: str, partition: int, offset: int) -> bool:
        """Whether a location's emitter may have lost the trace of the record at this position.

        The gaps whose windows hold the offset (an open window, with no trace after the gap there
        yet, covers the gaps' sizes past its low offset) lost k traces between them. If more than k
        records are missing in that stretch, the group skipped some: no explanation. If the
        records missing across all those gaps' partitions are no more than k, they are all lost
        traces; when they are more (a skip elsewhere next to a lost trace), only the partitions
        of the traces just before and after a gap count: consumers work through runs of one
        partition.
        """
        w, g = schema.gap_windows, schema.trace_gaps
        with self._begin() as tx:
            candidates = tx.execute(
                select(w.c.gap_id, w.c.emitter_id, w.c.lo_offset, w.c.hi_offset, w.c.gap_size).where(
                    w.c.location == location, w.c.topic == topic, w.c.partition == partition, w.c.lo_offset < offset
                )
            ).all()
            lost = sum(int(c.gap_size) for c in candidates if c.hi_offset is None or c.hi_offset > offset)
            covering = [
                c
                for c in candidates
                if (c.hi_offset is not None and c.hi_offset > offset)
                or (c.hi_offset is None and c.lo_offset + lost >= offset)
            ]
            if not covering:
                return False
            lost = sum(int(c.gap_size) for c in covering)
            closed = [c for c in covering if c.hi_offset is not None]
            if closed and min(c.hi_offset for c in closed) - max(c.lo_offset for c in closed) - 1 > lost:
                return False  # more records missing here than traces lost: the group skipped some
            gap_ids = sorted({c.gap_id for c in covering})
            stretches = {
                (s.topic, s.partition, s.lo_offset, s.hi_offset)
                for s in tx.execute(
                    select(w.c.topic, w.c.partition, w.c.lo_offset, w.c.hi_offset).where(
                        w.c.gap_id.in_(gap_ids), w.c.hi_offset.is_not(None)
                    )
                )
            }
            if sum(max(0, hi - lo - 1) for _, _, lo, hi in stretches) <= lost:
                return True
            here = f"{topic}|{partition}"
            neighbours = tx.execute(select(g.c.prev_position, g.c.next_position).where(g.c.id.in_(gap_ids))).all()
            return any(here in (n.prev_position, n.next_position) for n in neighbours)

    def trace_gaps(self, location: str) -> list[tuple[int, int]]:
        """Unfilled gaps of a location's emitters: (first missing number, first number after)."""
        gaps = schema.trace_gaps
        with self._begin() as tx:
            rows = tx.execute(
                select(gaps.c.from_seq, gaps.c.to_seq)
                .where(gaps.c.location == location)
                .order_by(gaps.c.emitter_id, gaps.c.from_seq)
            )
            return [(int(r.from_seq), int(r.to_seq)) for r in rows]

    def record_heartbeat(self, beat: Mapping[str, Any]) -> None:
        with self._begin() as tx:
            tx.execute(insert(schema.detector_heartbeat).values(**beat))
            tx.execute(
                delete(schema.detector_heartbeat).where(
                    schema.detector_heartbeat.c.query_name == beat["query_name"],
                    schema.detector_heartbeat.c.at_ms < int(beat["at_ms"]) - 86_400_000,
                )
            )

    def read_to_ms(self, query_name: str) -> int | None:
        """The start of the newest batch of ``query_name`` that read its whole input: every trace
        produced before this time has been read."""
        table = schema.detector_heartbeat
        with self._begin() as tx:
            at = tx.execute(
                select(func.max(table.c.at_ms)).where(table.c.query_name == query_name, table.c.caught_up.is_(True))
            ).scalar()
        return None if at is None else int(at)

    def latest_heartbeat(self, query_name: str) -> dict[str, Any] | None:
        table = schema.detector_heartbeat
        with self._begin() as tx:
            row = tx.execute(
                select(table)
                .where(table.c.query_name == query_name)
                .order_by(table.c.at_ms.desc(), table.c.id.desc())
                .limit(1)
            ).first()
        return None if row is None else dict(row._mapping)

    # -- alerts ---------------------------------------------------------------------------

    def pending_alerts(self) -> list[Alert]:
        table = schema.alerts
        with self._begin() as tx:
            return [
                _alert_from(r)
                for r in tx.execute(
                    select(table).where(table.c.delivered_ms.is_(None)).order_by(table.c.at_ms, table.c.id)
                )
            ]

    def add_alert(self, alert: Alert) -> bool:
        """Record an alert to send (False when that occurrence was recorded before)."""
        with self._begin() as tx:
            return _insert_ignoring_duplicate(tx, schema.alerts, _alert_row(alert))

    def mark_delivered(self, key: str, deliveries: dict[str, str], delivered_ms: int) -> None:
        table = schema.alerts
        with self._begin() as tx:
            tx.execute(
                update(table)
                .where(table.c.alert_key == key)
                .values(delivered_ms=delivered_ms, deliveries=json.dumps(deliveries))
            )

    def alerts(self, since_ms: int = 0) -> list[tuple[Alert, int | None, dict[str, str]]]:
        """Alerts since ``since_ms`` with when they were delivered and how each notifier fared."""
        table = schema.alerts
        with self._begin() as tx:
            rows = tx.execute(select(table).where(table.c.at_ms >= since_ms).order_by(table.c.at_ms, table.c.id))
            return [(_alert_from(r), r.delivered_ms, json.loads(r.deliveries) if r.deliveries else {}) for r in rows]


_VERDICT_COLUMNS = (
    "stream",
    "hop_kind",
    "verdict",
    "cause",
    "count",
    "topic",
    "partition",
    "offset",
    "group_id",
    "location",
    "observed_ms",
    "latency_ms",
    "e2e_latency_ms",
    "decided_ms",
    "detail",
)
MINUTE_MS = 60_000


def _sqlite_for_concurrent_writers(connection: Any, _record: Any) -> None:
    """The local store is shared by the detector and Airflow tasks: write-ahead log, patient locks."""
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def _percentile(values: list[int], fraction: float) -> int | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


def _key_filter(table: Any, key: PartitionKey) -> tuple[Any, ...]:
    return (
        table.c.cluster == key.cluster,
        table.c.group_id == key.group,
        table.c.topic == key.topic,
        table.c.partition == key.partition,
    )


def _insert_ignoring_duplicate(tx: Connection, table: Any, values: dict[str, Any]) -> bool:
    """Insert unless a unique constraint says the row exists (a retried task); True when inserted."""
    dialect = tx.dialect.name
    if dialect == "postgresql":
        statement: Any = postgresql_insert(table).values(**values).on_conflict_do_nothing()
    elif dialect == "sqlite":
        statement = sqlite_insert(table).values(**values).on_conflict_do_nothing()
    else:
        raise StoreError(f"the store supports SQLite and PostgreSQL, not {dialect}")
    return bool(tx.execute(statement).rowcount)


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
    )


def _alert_row(alert: Alert) -> dict[str, Any]:
    return dict(
        alert_key=alert.key,
        subject=alert.subject,
        kind=alert.kind,
        state=alert.state.value,
        severity=alert.severity.value,
        title=alert.title,
        details=json.dumps(dict(alert.details)),
        at_ms=alert.at_ms,
    )


def _alert_from(row: Any) -> Alert:
    return Alert(
        key=row.alert_key,
        subject=row.subject,
        kind=row.kind,
        state=AlertState(row.state),
        severity=Severity(row.severity),
        title=row.title,
        at_ms=row.at_ms,
        details=json.loads(row.details),
    )
