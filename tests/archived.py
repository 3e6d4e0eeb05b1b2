"""Verdicts kept as the detector keeps them at scale, for the tests of every reader of a message's verdicts.

The plain first-time DELIVERED verdicts go to the verdict archive (with its index, as the detector's
writer records it); the exceptions are SQL rows with their history. Two messages of tests/viewdata.py's
stream: one whose audit sink lost it (four hops archived, one SQL LOST), and one whose archived
DELIVERED at the store sink was changed later (an SQL DUPLICATE, which wins over the archived row).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import insert

from khipu.store import Store, schema
from khipu.trace.archive import hour_of
from khipu.verdicts.archive import VerdictArchive, verdict_table
from tests.viewdata import AUDIT_READ, HOPS, STORE_READ, history_change, verdict

BATCH_ID = 7


@dataclass
class ArchivedSeed:
    partly_lost: str  # DELIVERED (archived) at every hop but the audit sink's, LOST there (SQL)
    changed: str  # DELIVERED (archived) at every hop; the store sink's read again later: DUPLICATE (SQL)
    archived: list[dict[str, Any]] = field(default_factory=list)  # the verdict archive's rows
    sql: list[dict[str, Any]] = field(default_factory=list)  # the SQL rows


def seed_archived(store: Store, verdict_archive_dir: Path, now_ms: int, decided_ms: int | None = None) -> ArchivedSeed:
    """Write the two messages: their DELIVERED verdicts to the archive (batch 7, the hour of ``decided_ms``,
    default 20 minutes before ``now_ms``) and the index, their exceptions and history to the store."""
    at = now_ms - 20 * 60_000 if decided_ms is None else decided_ms
    seeded = ArchivedSeed("arch-lost-1", "arch-changed-1")
    seeded.archived = [verdict(seeded.partly_lost, hop, "DELIVERED", at + j) for j, hop in enumerate(HOPS[:-1])]
    seeded.archived += [verdict(seeded.changed, hop, "DELIVERED", at + j) for j, hop in enumerate(HOPS)]
    seeded.sql = [
        verdict(
            seeded.partly_lost,
            AUDIT_READ,
            "LOST",
            at + 4,
            cause="skipped_by_consumer",
            detail="skipped by demo-sink-audit",
        ),
        verdict(
            seeded.changed,
            STORE_READ,
            "DUPLICATE",
            at + 3,  # a changed verdict keeps the time it was first decided
            cause="rewind_replay",
            count=2,
            late_evidence=True,
            detail="read again after it was decided",
        ),
    ]
    archive = VerdictArchive(verdict_archive_dir, store)
    archive.write_batch(BATCH_ID, verdict_table(seeded.archived))
    archive.index.record(BATCH_ID, [(m, at - 2_000, hour_of(at)) for m in (seeded.partly_lost, seeded.changed)])
    store.verdicts.upsert(seeded.sql)
    history = [
        history_change(seeded.partly_lost, AUDIT_READ, None, "LOST", at + 4, "detector", "decided"),
        history_change(seeded.changed, STORE_READ, "DELIVERED", "DUPLICATE", at + 60_000, "detector", "read again"),
    ]
    with store.engine.begin() as tx:
        tx.execute(insert(schema.verdict_history), history)
    return seeded
