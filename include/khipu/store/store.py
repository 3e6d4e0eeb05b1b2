"""The store's operations. Every write of one logical step is one transaction."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, and_, create_engine, delete, event, func, insert, or_, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from khipu.alerting.decide import Transition
from khipu.alerting.model import Alert, AlertState, Severity
from khipu.detector.sequences import KEEP_RECENT, EmitterHistory, Run, absorb
from khipu.health.evaluate import PartitionHealth
from khipu.health.rules import PartitionStatus
from khipu.health.windows import OffsetWindow, WindowKind
from khipu.offsets.model import GROUP_STATES_WITHOUT_MEMBERS, PartitionKey, PartitionSnapshot, SnapshotRun
from khipu.store import schema

MIGRATIONS = Path(__file__).parent / "migrations"


@dataclass(frozen=True, slots=True)
class RemovalEvidence:
    first_gone_ms: int | None  # the first snapshot whose log start was past the record
    passed_while_present: bool  # the group's committed offset was past it while the log still held it
    retention_ms: int | None  # from the newest snapshot that reported it
    retention_bytes: int | None


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

    @contextmanager
    def _begin(self) -> Iterator[Connection]:
        """A transaction; database errors come out as :class:`StoreError` saying what to do."""
        try:
            with self.engine.begin() as tx:
                yield tx
        except (OperationalError, ProgrammingError) as exc:
            raise StoreError(self._explain(exc)) from None

    def _explain(self, exc: OperationalError | ProgrammingError) -> str:
        detail = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc)
        if "no such table" in detail or "does not exist" in detail:
            return (
                f"the store at {self.safe_url} lacks part of its schema ({detail}): it was never migrated or is "
                "older than this Khipu; run `khipu store migrate` (make up does)"
            )
        return f"cannot use the store at {self.safe_url}: {detail}"

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
        live ones (:attr:`PartitionSnapshot.live`, however long ago), oldest first."""
        table = schema.offset_snapshots
        same = and_(*_key_filter(table, key))
        state_says_live = or_(table.c.group_state.is_(None), table.c.group_state.not_in(GROUP_STATES_WITHOUT_MEMBERS))
        live = and_(
            table.c.committed_offset.is_not(None),
            or_(
                table.c.committed_changed.is_(True),
                table.c.assigned.is_(True),
                and_(table.c.assigned.is_(None), state_says_live),
            ),
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

    def latest_log_start(self, cluster: str, topic: str, partition: int) -> tuple[int, int] | None:
        """The partition's log-start offset in its newest snapshot: (snapshot_ms, log_start)."""
        table = schema.offset_snapshots
        with self._begin() as tx:
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
        the group's committed offset was past it while it was still there (a skip), the topic's retention."""
        table = schema.offset_snapshots
        same = and_(table.c.cluster == cluster, table.c.topic == topic, table.c.partition == partition)
        with self._begin() as tx:
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
            kept = tx.execute(
                select(table.c.retention_ms, table.c.retention_bytes)
                .where(same, table.c.retention_ms.is_not(None))
                .order_by(table.c.snapshot_ms.desc())
                .limit(1)
            ).first()
        return RemovalEvidence(
            first_gone_ms=None if first_gone is None else int(first_gone),
            passed_while_present=skipped is not None,
            retention_ms=None if kept is None else kept.retention_ms,
            retention_bytes=None if kept is None else kept.retention_bytes,
        )

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
        self,
        observed: Iterable[tuple[str, str, int, int]],
        now_ms: int,
        keep: int = KEEP_RECENT,
    ) -> int:
        """Track each emitter's sequence numbers; keep its gaps (lost traces); return how many gaps it has now
        that it had not before.

        ``observed``: (emitter id, location, sequence number, trace time) of one batch of traces
        and emitter marks. The gaps above each emitter's base are recomputed from the runs of
        numbers seen (:func:`khipu.detector.sequences.absorb`), so traces arriving out of order
        leave the same gaps as traces arriving in order. Emitters number from 0, so an emitter
        first seen above 0 lost its first traces. (A detector started at ``latest`` sees every
        emitter mid-way: start it at ``earliest``, the default.)
        """
        by_emitter: dict[str, tuple[str, list[tuple[int, int]]]] = {}
        for emitter_id, location, seq, at_ms in observed:
            by_emitter.setdefault(emitter_id, (location, []))[1].append((int(seq), int(at_ms)))
        progress, gaps = schema.emitter_progress, schema.trace_gaps
        new_gaps = 0
        with self._begin() as tx:
            for emitter_id, (location, seen) in sorted(by_emitter.items()):
                row = tx.execute(select(progress).where(progress.c.emitter_id == emitter_id)).first()
                history = _history(row) if row else EmitterHistory()
                absorbed = absorb(history, seen, keep)
                if absorbed.late:
                    self._fill_gaps(tx, emitter_id, list(absorbed.late))
                if not absorbed.changed:
                    continue
                stored = {
                    (int(r.from_seq), int(r.to_seq)): (int(r.id), int(r.noticed_ms))
                    for r in tx.execute(
                        select(gaps.c.id, gaps.c.from_seq, gaps.c.to_seq, gaps.c.noticed_ms).where(
                            gaps.c.emitter_id == emitter_id, gaps.c.from_seq > history.base_seq
                        )
                    )
                }
                new_gaps += sum((g.from_seq, g.to_seq) not in stored for g in absorbed.gaps)
                if stored:
                    tx.execute(delete(gaps).where(gaps.c.id.in_([gap_id for gap_id, _ in stored.values()])))
                for gap in absorbed.gaps:
                    noticed = stored.get((gap.from_seq, gap.to_seq), (0, now_ms))[1]
                    tx.execute(
                        insert(gaps).values(
                            emitter_id=emitter_id,
                            location=location,
                            from_seq=gap.from_seq,
                            to_seq=gap.to_seq,
                            after_ms=gap.after_ms,
                            before_ms=gap.before_ms,
                            noticed_ms=noticed,
                        )
                    )
                kept = absorbed.history
                values = dict(
                    location=location,
                    max_seq=kept.max_seq,
                    base_seq=kept.base_seq,
                    base_ms=kept.base_ms,
                    runs=json.dumps([[r.first_seq, r.first_ms, r.last_seq, r.last_ms] for r in kept.runs]),
                    updated_ms=now_ms,
                )
                if row:
                    tx.execute(update(progress).where(progress.c.emitter_id == emitter_id).values(**values))
                else:
                    tx.execute(insert(progress).values(emitter_id=emitter_id, **values))
        return new_gaps

    def _fill_gaps(self, tx: Connection, emitter_id: str, late: list[int]) -> None:
        """Numbers at or below an emitter's base arrived very late: each shrinks or splits its gap; a gap
        filled completely goes."""
        gaps = schema.trace_gaps
        for seq in late:
            for gap in tx.execute(
                select(gaps).where(gaps.c.emitter_id == emitter_id, gaps.c.from_seq <= seq, gaps.c.to_seq > seq)
            ).all():
                pieces = [(start, stop) for start, stop in ((gap.from_seq, seq), (seq + 1, gap.to_seq)) if stop > start]
                if not pieces:
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

    def record_pointers(self, pointers: Iterable[tuple[str, str, str, int, int]], seen_ms: int) -> int:
        """Keep positions an emitter says it received: (location, cluster, topic, partition, offset).

        They come from back-pointers (:attr:`khipu.trace.model.Trace.prev_offset`) and emitter
        marks whose own trace was not in the same batch. A position stored twice keeps its first
        time. Returns how many were new.
        """
        table = schema.trace_pointers
        rows = sorted({(str(loc), str(c), str(t), int(p), int(o)) for loc, c, t, p, o in pointers})
        added = 0
        with self._begin() as tx:
            for location, cluster, topic, partition, offset in rows:
                added += _insert_ignoring_duplicate(
                    tx,
                    table,
                    dict(
                        location=location,
                        cluster=cluster,
                        topic=topic,
                        partition=partition,
                        offset=offset,
                        seen_ms=seen_ms,
                    ),
                )
        return added

    def pointed_at(self, location: str, cluster: str, topic: str, partition: int, offset: int) -> bool:
        """Whether an emitter of the location said it received the record at this position."""
        t = schema.trace_pointers
        with self._begin() as tx:
            found = tx.execute(
                select(t.c.offset).where(
                    t.c.location == location,
                    t.c.cluster == cluster,
                    t.c.topic == topic,
                    t.c.partition == partition,
                    t.c.offset == offset,
                )
            ).first()
        return found is not None

    def prune_pointers(self, before_ms: int) -> int:
        """Drop pointers first seen before ``before_ms`` (the messages they could explain are decided)."""
        t = schema.trace_pointers
        with self._begin() as tx:
            return int(tx.execute(delete(t).where(t.c.seen_ms < before_ms)).rowcount or 0)

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

    def pending_alerts(self, now_ms: int | None = None) -> list[Alert]:
        """Alerts not delivered yet; with ``now_ms``, also those a dispatcher claimed over
        ``CLAIM_LEASE_MS`` ago and never finished (it died mid-delivery)."""
        table = schema.alerts
        with self._begin() as tx:
            return [
                _alert_from(r)
                for r in tx.execute(
                    select(table).where(_undelivered(table, now_ms)).order_by(table.c.at_ms, table.c.id)
                )
            ]

    def latest_alert(self, kind: str) -> Alert | None:
        """The newest alert of a kind (e.g. whether the detector-down alert is firing)."""
        table = schema.alerts
        with self._begin() as tx:
            row = tx.execute(
                select(table).where(table.c.kind == kind).order_by(table.c.at_ms.desc(), table.c.id.desc()).limit(1)
            ).first()
        return None if row is None else _alert_from(row)

    def claim_alert(self, key: str, claimed_ms: int) -> bool:
        """Take a pending alert for delivery (marked delivered at minus the claim time until it is);
        False when another dispatcher holds it. A claim older than ``CLAIM_LEASE_MS`` may be taken over."""
        table = schema.alerts
        with self._begin() as tx:
            taken = tx.execute(
                update(table)
                .where(table.c.alert_key == key, _undelivered(table, claimed_ms))
                .values(delivered_ms=-claimed_ms)
            )
        return bool(taken.rowcount)

    def release_alert(self, key: str) -> None:
        """Give a claimed alert back (no notifier could deliver it): the next dispatch retries it."""
        table = schema.alerts
        with self._begin() as tx:
            tx.execute(update(table).where(table.c.alert_key == key).values(delivered_ms=None))

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


CLAIM_LEASE_MS = 600_000


def _undelivered(table: Any, now_ms: int | None) -> Any:
    """Not delivered: never claimed, or (given ``now_ms``) claimed by a dispatcher over the lease ago."""
    if now_ms is None:
        return table.c.delivered_ms.is_(None)
    stale_claim = and_(table.c.delivered_ms < 0, table.c.delivered_ms > -(now_ms - CLAIM_LEASE_MS))
    return or_(table.c.delivered_ms.is_(None), stale_claim)


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


def _history(row: Any) -> EmitterHistory:
    return EmitterHistory(
        base_seq=int(row.base_seq),
        base_ms=None if row.base_ms is None else int(row.base_ms),
        runs=tuple(Run(int(a), int(b), int(c), int(d)) for a, b, c, d in json.loads(row.runs)),
    )
