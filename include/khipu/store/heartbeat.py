"""The detector's heartbeat: each streaming query's progress, batch by batch (kept a day per query)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import case, delete, func, insert, select

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

    def read_to_ms(self, query_name: str) -> int | None:
        """The time up to which ``query_name`` has read the trace topic: every trace written before it has been
        read. The newest of the batches' own figure (``read_to_ms``) and the start of the newest batch that read
        its whole input (heartbeats written before the figure existed)."""
        table = schema.detector_heartbeat
        with self._engine.begin() as tx:
            recorded, caught_up = tx.execute(
                select(
                    func.max(table.c.read_to_ms),
                    func.max(case((table.c.caught_up.is_(True), table.c.at_ms), else_=None)),
                ).where(table.c.query_name == query_name)
            ).one()
        found = [int(value) for value in (recorded, caught_up) if value is not None]
        return max(found) if found else None

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
