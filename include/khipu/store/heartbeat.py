"""The detector's heartbeat: each streaming query's progress, batch by batch (kept a day per query)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import case, delete, func, insert, select, update

from khipu.store import schema
from khipu.store.engine import StoreEngine

KEEP_MS = 86_400_000


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
