"""The detector's heartbeat: each streaming query's progress, batch by batch (kept a day per query), and how far it
trails the trace topic (:class:`PartitionTrail`, :class:`TraceSkip`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import case, delete, func, insert, select, update

from khipu.store import schema
from khipu.store.engine import StoreEngine, upsert

KEEP_MS = 86_400_000


@dataclass(frozen=True, slots=True)
class PartitionTrail:
    """How far a detector query trails one trace-topic partition (``detector_trail``): where its newest finished
    batch ended, and the partition's log start and end as asked of the broker at ``asked_ms``."""

    partition: int
    read_end: int  # the offset the batch ``batch_id`` ended at: the next one the query reads
    batch_id: int
    log_start: int
    log_end: int
    asked_ms: int
    oldest_unread_offset: int | None = None  # the oldest record still in the log not read yet: max(read_end, log_start)
    oldest_unread_ms: int | None = None  # its timestamp (the broker's, on a LogAppendTime topic); None: not known

    @property
    def unread(self) -> int:
        """Offsets between where the query has read to and the log end (those removed unread among them)."""
        return max(0, self.log_end - self.read_end)

    @property
    def removed_unread(self) -> int:
        """Offsets the broker removed before the query read them: it will skip them."""
        return max(0, min(self.log_start, self.log_end) - self.read_end)


@dataclass(frozen=True, slots=True)
class TraceSkip:
    """Trace-topic offsets ``from_offset`` up to ``to_offset`` (excluded) of a partition that the broker removed before
    the batch ``batch_id`` read them (``detector_skips``)."""

    partition: int
    from_offset: int
    to_offset: int
    batch_id: int
    detected_ms: int
    alerted_ms: int | None = None

    @property
    def offsets(self) -> int:
        return self.to_offset - self.from_offset


class HeartbeatRepository:
    """``store.heartbeat``: what each detector query last reported."""

    def __init__(self, engine: StoreEngine) -> None:
        self._engine = engine

    def record(self, beat: Mapping[str, Any]) -> None:
        """Keep one progress report (columns of ``detector_heartbeat``); drop the query's reports over a day old."""
        table = schema.detector_heartbeat
        with self._engine.begin() as tx:
            tx.execute(insert(table).values(**beat))
            tx.execute(
                delete(table).where(
                    table.c.query_name == beat["query_name"], table.c.at_ms < int(beat["at_ms"]) - KEEP_MS
                )
            )

    def record_read_to(self, query_name: str, read_to_ms: int, at_ms: int) -> None:
        """The time up to which the query has read the trace topic, as its writer knows it before and after a
        batch runs (it only moves forward)."""
        table = schema.detector_progress
        with self._engine.begin() as tx:
            current = tx.execute(select(table.c.read_to_ms).where(table.c.query_name == query_name)).scalar()
            if current is None:
                tx.execute(insert(table).values(query_name=query_name, read_to_ms=read_to_ms, at_ms=at_ms))
            elif read_to_ms > current:
                tx.execute(
                    update(table).where(table.c.query_name == query_name).values(read_to_ms=read_to_ms, at_ms=at_ms)
                )

    def record_running_read_to(self, query_name: str, read_to_ms: int) -> None:
        """How far the batch of ``query_name`` about to run will have read the trace topic when it ends
        (:func:`khipu.detector.clock.running_read_to_ms`); it only moves forward. Nothing is recorded for a query
        whose progress is not kept yet (its checkpoint's start makes the row)."""
        table = schema.detector_progress
        with self._engine.begin() as tx:
            current = tx.execute(
                select(table.c.running_read_to_ms).where(table.c.query_name == query_name)
            ).one_or_none()
            if current is not None and (current[0] is None or read_to_ms > current[0]):
                tx.execute(update(table).where(table.c.query_name == query_name).values(running_read_to_ms=read_to_ms))

    def running_read_to_ms(self, query_name: str) -> int | None:
        """What :meth:`record_running_read_to` last recorded for ``query_name`` (None: nothing yet)."""
        table = schema.detector_progress
        with self._engine.begin() as tx:
            found = tx.execute(select(table.c.running_read_to_ms).where(table.c.query_name == query_name)).scalar()
        return None if found is None else int(found)

    def start_over(self, query_name: str, at_ms: int) -> None:
        """A new checkpoint of ``query_name`` starts reading the trace topic from its beginning: nothing it has
        read yet, and the heartbeats of earlier checkpoints say nothing of it."""
        table = schema.detector_progress
        with self._engine.begin() as tx:
            tx.execute(delete(table).where(table.c.query_name == query_name))
            tx.execute(insert(table).values(query_name=query_name, read_to_ms=0, at_ms=at_ms, since_ms=at_ms))
            tx.execute(delete(schema.detector_trail).where(schema.detector_trail.c.query_name == query_name))

    def record_trail(self, query_name: str, trails: Sequence[PartitionTrail]) -> None:
        """Where ``query_name``'s newest finished batch ended on each partition, with the log's bounds then (the
        detector, after each batch)."""
        rows = [{"query_name": query_name, **asdict(trail)} for trail in trails]
        with self._engine.begin() as tx:
            upsert(tx, schema.detector_trail, rows, ("query_name", "partition"))

    def refresh_trail(self, query_name: str, trails: Sequence[PartitionTrail]) -> int:
        """Newer log bounds and oldest unread records for partitions whose read end is still the one given (a check
        between batches, or while the query is stopped): a batch that ended since wrote its own. Returns how many
        rows were refreshed."""
        table = schema.detector_trail
        refreshed = 0
        with self._engine.begin() as tx:
            for trail in trails:
                refreshed += (
                    tx.execute(
                        update(table)
                        .where(
                            table.c.query_name == query_name,
                            table.c.partition == trail.partition,
                            table.c.read_end == trail.read_end,
                            table.c.asked_ms < trail.asked_ms,
                        )
                        .values(
                            log_start=trail.log_start,
                            log_end=trail.log_end,
                            asked_ms=trail.asked_ms,
                            oldest_unread_offset=trail.oldest_unread_offset,
                            oldest_unread_ms=trail.oldest_unread_ms,
                        )
                    ).rowcount
                    or 0
                )
        return refreshed

    def trail(self, query_name: str) -> list[PartitionTrail]:
        """What :meth:`record_trail` and :meth:`refresh_trail` last recorded for ``query_name``, by partition."""
        table = schema.detector_trail
        with self._engine.begin() as tx:
            rows = tx.execute(select(table).where(table.c.query_name == query_name).order_by(table.c.partition))
            return [
                PartitionTrail(**{name: value for name, value in row._mapping.items() if name != "query_name"})
                for row in rows
            ]

    def record_skips(self, query_name: str, skips: Sequence[TraceSkip]) -> None:
        """Offsets ``query_name`` skipped; a skip from the same offset recorded again (a batch replayed after more was
        removed) keeps the larger end and is alerted again."""
        table = schema.detector_skips
        with self._engine.begin() as tx:
            for skip in skips:
                key = (table.c.query_name == query_name, table.c.partition == skip.partition,
                       table.c.from_offset == skip.from_offset)  # fmt: skip
                known = tx.execute(select(table.c.to_offset).where(*key)).scalar()
                if known is None:
                    tx.execute(insert(table).values(query_name=query_name, **asdict(skip)))
                elif skip.to_offset > known:
                    tx.execute(
                        update(table)
                        .where(*key)
                        .values(
                            to_offset=skip.to_offset,
                            batch_id=skip.batch_id,
                            detected_ms=skip.detected_ms,
                            alerted_ms=None,
                        )
                    )

    def prune_skips(self, before_ms: int, *, dry_run: bool = False) -> int:
        """Drop the skips detected before ``before_ms`` whose alert has been told (one not told yet stays, whatever its
        age, until the trail alert tells it); returns how many (a dry run counts, keeps them)."""
        table = schema.detector_skips
        with self._engine.begin(commit=not dry_run) as tx:
            old = (table.c.detected_ms < before_ms, table.c.alerted_ms.is_not(None))
            return int(tx.execute(delete(table).where(*old)).rowcount or 0)

    def skips(self, query_name: str, *, since_ms: int = 0, unalerted: bool = False) -> list[TraceSkip]:
        """The skips of ``query_name`` detected since ``since_ms`` (only those no alert told yet: ``unalerted``), in
        the order they were detected."""
        table = schema.detector_skips
        query = select(table).where(table.c.query_name == query_name, table.c.detected_ms >= since_ms)
        if unalerted:
            query = query.where(table.c.alerted_ms.is_(None))
        with self._engine.begin() as tx:
            rows = tx.execute(query.order_by(table.c.detected_ms, table.c.partition, table.c.from_offset))
            return [
                TraceSkip(**{name: value for name, value in row._mapping.items() if name != "query_name"})
                for row in rows
            ]

    def mark_skips_alerted(self, query_name: str, skips: Sequence[TraceSkip], at_ms: int) -> None:
        table = schema.detector_skips
        with self._engine.begin() as tx:
            for skip in skips:
                tx.execute(
                    update(table)
                    .where(
                        table.c.query_name == query_name,
                        table.c.partition == skip.partition,
                        table.c.from_offset == skip.from_offset,
                        table.c.to_offset == skip.to_offset,
                    )
                    .values(alerted_ms=at_ms)
                )

    def read_to_ms(self, query_name: str) -> int | None:
        """The time up to which ``query_name`` has read the trace topic: every trace written before it has been
        read. The newest of its writer's figure, the batches' reported figure, and the start of the newest batch
        that read its whole input."""
        heartbeat, progress = schema.detector_heartbeat, schema.detector_progress
        with self._engine.begin() as tx:
            written, since = tx.execute(
                select(progress.c.read_to_ms, progress.c.since_ms).where(progress.c.query_name == query_name)
            ).one_or_none() or (None, 0)
            recorded, caught_up = tx.execute(
                select(
                    func.max(heartbeat.c.read_to_ms),
                    func.max(case((heartbeat.c.caught_up.is_(True), heartbeat.c.at_ms), else_=None)),
                ).where(heartbeat.c.query_name == query_name, heartbeat.c.at_ms >= since)
            ).one()
        found = [int(value) for value in (recorded, caught_up, written) if value is not None]
        return max(found) if found else None

    def prune(self, before_ms: int, *, dry_run: bool = False) -> int:
        """Drop every query's reports from before ``before_ms``, except each query's newest (a stopped query still
        says when it last ran); returns how many (a dry run counts, keeps them)."""
        table = schema.detector_heartbeat
        newest = select(func.max(table.c.id)).group_by(table.c.query_name)
        with self._engine.begin(commit=not dry_run) as tx:
            return int(
                tx.execute(delete(table).where(table.c.at_ms < before_ms, table.c.id.not_in(newest))).rowcount or 0
            )

    def latest(self, query_name: str) -> dict[str, Any] | None:
        """The newest report of ``query_name`` (its ``detector_heartbeat`` columns)."""
        table = schema.detector_heartbeat
        with self._engine.begin() as tx:
            row = tx.execute(
                select(table)
                .where(table.c.query_name == query_name)
                .order_by(table.c.at_ms.desc(), table.c.id.desc())
                .limit(1)
            ).first()
        return None if row is None else dict(row._mapping)

    def series(self, query_name: str, since_ms: int, limit: int = 2000) -> list[dict[str, Any]]:
        """The reports of ``query_name`` since ``since_ms``, oldest first (the newest ``limit`` of them)."""
        table = schema.detector_heartbeat
        query = (
            select(table)
            .where(table.c.query_name == query_name, table.c.at_ms >= since_ms)
            .order_by(table.c.at_ms.desc(), table.c.id.desc())
            .limit(limit)
        )
        with self._engine.begin() as tx:
            return [dict(row._mapping) for row in reversed(tx.execute(query).all())]
