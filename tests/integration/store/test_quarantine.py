"""The quarantine (SQLite and PostgreSQL): one row per malformed trace-topic position, a position being the record's
topic, partition and offset and, in a batch record, the line (``source_line``; a record of one trace is line 0)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import column, insert, select, table

from khipu.store import Store, schema
from tests.integration.store.test_verdicts import migrate_to

pytestmark = pytest.mark.integration
AT_MS = 1_700_000_000_000
# the quarantine as revision 0010 has it: no line
OLD_QUARANTINE = table(
    "quarantine", *(column(c.name) for c in schema.quarantine.c if c.name not in ("id", "source_line"))
)


def malformed(offset: int, reason: str, line: int | None = None, partition: int = 0) -> dict[str, Any]:
    row = {
        "source_topic": "khipu.traces",
        "source_partition": partition,
        "source_offset": offset,
        "quarantine_reason": reason,
        "raw_value": f"{offset}:{line}".encode(),
        "kafka_timestamp_ms": AT_MS - 1,
    }
    return row if line is None else {**row, "source_line": line}


def positions(store: Store) -> list[tuple[int, int, int, str]]:
    return [
        (q["source_partition"], q["source_offset"], q["source_line"], q["reason"]) for q in store.channel.quarantined()
    ]


def test_two_malformed_lines_of_one_record_are_both_quarantined_once_each(store: Store) -> None:
    batch = [malformed(7, "field 'offset': bad", 2), malformed(7, "field 'v': bad", 0), malformed(8, "not JSON")]
    assert store.channel.add_quarantine(batch, AT_MS) == 3
    assert store.channel.add_quarantine(batch, AT_MS + 1) == 0  # a replayed micro-batch adds nothing
    assert store.channel.add_quarantine([malformed(7, "again", 0, partition=1)], AT_MS) == 1  # another partition
    assert positions(store) == [
        (0, 7, 0, "field 'v': bad"),
        (0, 7, 2, "field 'offset': bad"),
        (0, 8, 0, "not JSON"),  # a row without a line is a record of one trace: line 0
        (1, 7, 0, "again"),
    ]
    total, newest = store.channel.quarantine_page()
    assert total == 4 and {(q["source_offset"], q["source_line"]) for q in newest} == {(7, 0), (7, 2), (8, 0)}


def test_migration_0011_numbers_stored_rows_line_0_and_keys_the_quarantine_by_line(
    tmp_path: Path, empty_postgres_url: str
) -> None:
    for url in (f"sqlite:///{tmp_path / 'old.db'}", empty_postgres_url):
        migrate_to(url, "0010")
        store = Store(url)
        try:
            before = {k: v for k, v in malformed(5, "stored before batches").items() if k != "quarantine_reason"}
            with store.engine.begin() as tx:
                tx.execute(
                    insert(OLD_QUARANTINE).values(**before, reason="stored before batches", quarantined_ms=AT_MS)
                )
            migrate_to(url, "head")
            assert positions(store) == [(0, 5, 0, "stored before batches")]
            assert store.channel.add_quarantine([malformed(5, "line 1", 1), malformed(5, "line 0", 0)], AT_MS) == 1
            assert positions(store) == [(0, 5, 0, "stored before batches"), (0, 5, 1, "line 1")]

            migrate_to(url, "0010", command.downgrade)  # one row per record again: the one stored first stays
            with store.engine.begin() as tx:
                kept = tx.execute(select(OLD_QUARANTINE.c.source_offset, OLD_QUARANTINE.c.reason)).all()
            assert [tuple(row) for row in kept] == [(5, "stored before batches")]
            migrate_to(url, "head")
            assert positions(store) == [(0, 5, 0, "stored before batches")]
        finally:
            store.close()
