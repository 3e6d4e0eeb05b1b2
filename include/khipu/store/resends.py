"""``store.resends``: the resend ledger, one row per attempt at resending a confirmed loss.

An attempt is recorded as *intended* before anything is produced (idempotent: the same resend id is
recorded once), then *produced* with the position it landed at, or *unrecoverable* / *failed* with
the reason. A task that restarts reads its open intents here and looks for their resend ids in the
destination topic before producing anything again (:mod:`khipu.resend.ledger`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from sqlalchemy import or_, select, update

from khipu.store import schema
from khipu.store.engine import StoreEngine, insert_ignoring_duplicate

CHUNK = 500  # ids per IN (...) query

LEDGER_COLUMNS = (
    "resend_id",
    "message_id",
    "hop",
    "stream",
    "attempt",
    "state",
    "source_kind",
    "source_position",
    "destination",
    "target_group",
    "destination_partition",
    "scan_from_offset",
    "reason",
    "claimed_by",
    "claimed_until_ms",
)


class ResendRepository:
    def __init__(self, engine: StoreEngine) -> None:
        self._engine = engine

    def record_intent(self, entry: Mapping[str, Any], at_ms: int) -> bool:
        """Write an attempt (its ``LEDGER_COLUMNS``) unless its resend id is there already; True when written."""
        values = {name: entry.get(name) for name in LEDGER_COLUMNS}
        with self._engine.begin() as tx:
            return insert_ignoring_duplicate(
                tx, schema.resend_ledger, {**values, "intended_ms": at_ms, "updated_ms": at_ms}
            )

    def claim(self, resend_id: str, owner: str, now_ms: int, lease_ms: int) -> bool:
        """Take (or keep) an open attempt for ``owner`` until ``now_ms + lease_ms``, unless another run holds it
        still; True when ``owner`` holds it now."""
        table = schema.resend_ledger
        free = or_(table.c.claimed_by.is_(None), table.c.claimed_by == owner, table.c.claimed_until_ms < now_ms)
        with self._engine.begin() as tx:
            result = tx.execute(
                update(table)
                .where(table.c.resend_id == resend_id, table.c.state == "intended", free)
                .values(claimed_by=owner, claimed_until_ms=now_ms + lease_ms)
            )
            return bool(result.rowcount == 1)

    def set_placement(self, resend_id: str, entry: Mapping[str, Any], at_ms: int) -> None:
        """An open attempt written without a placement (planned unrecoverable) now has an original: its source,
        destination and placement (``entry``: its ledger row as now planned), fixed before producing."""
        moved = ("source_kind", "source_position", "destination", "target_group", "destination_partition")
        values = {name: entry.get(name) for name in (*moved, "scan_from_offset", "reason")}
        self._set(resend_id, at_ms, **values)

    def mark_produced(self, resend_id: str, partition: int, offset: int, at_ms: int) -> None:
        """The attempt's record is in its destination at (partition, offset)."""
        self._set(resend_id, at_ms, state="produced", produced_partition=partition, produced_offset=offset, error=None)

    def mark(self, resend_id: str, state: str, at_ms: int, error: str | None = None) -> None:
        """Another outcome (``unrecoverable``, ``failed``) with what went wrong."""
        self._set(resend_id, at_ms, state=state, error=error)

    def entry(self, resend_id: str) -> dict[str, Any] | None:
        table = schema.resend_ledger
        with self._engine.begin() as tx:
            row = tx.execute(select(table).where(table.c.resend_id == resend_id)).first()
        return None if row is None else dict(row._mapping)

    def attempts(self, message_id: str, hop: str) -> list[dict[str, Any]]:
        """Every attempt for this loss, first first."""
        table = schema.resend_ledger
        query = select(table).where(table.c.message_id == message_id, table.c.hop == hop).order_by(table.c.attempt)
        with self._engine.begin() as tx:
            return [dict(row._mapping) for row in tx.execute(query)]

    def of_messages(self, message_ids: Collection[str]) -> dict[tuple[str, str], list[dict[str, Any]]]:
        """Every attempt for these messages, by (message id, hop), first attempt first."""
        table, ids = schema.resend_ledger, sorted(set(message_ids))
        found: dict[tuple[str, str], list[dict[str, Any]]] = {}
        with self._engine.begin() as tx:
            for start in range(0, len(ids), CHUNK):
                query = (
                    select(table)
                    .where(table.c.message_id.in_(ids[start : start + CHUNK]))
                    .order_by(table.c.message_id, table.c.hop, table.c.attempt)
                )
                for row in tx.execute(query):
                    entry = dict(row._mapping)
                    found.setdefault((entry["message_id"], entry["hop"]), []).append(entry)
        return found

    def in_state(self, state: str, limit: int = 1000) -> list[dict[str, Any]]:
        """Attempts in this state, oldest change first (``intended``: those a crash may have left open)."""
        table = schema.resend_ledger
        query = select(table).where(table.c.state == state).order_by(table.c.updated_ms, table.c.resend_id).limit(limit)
        with self._engine.begin() as tx:
            return [dict(row._mapping) for row in tx.execute(query)]

    def _set(self, resend_id: str, at_ms: int, **values: Any) -> None:
        table = schema.resend_ledger
        with self._engine.begin() as tx:
            tx.execute(update(table).where(table.c.resend_id == resend_id).values(updated_ms=at_ms, **values))
