"""All the verdicts of a message: the SQL store's and the verdict archive's, the SQL row winning per hop."""

from __future__ import annotations

from pathlib import Path

import pytest

from khipu.store import Store
from khipu.trace.archive import HOUR_MS
from khipu.verdicts.archive import VerdictArchive, verdict_table
from khipu.verdicts.read import all_verdicts, merged, verdicts_of, with_first_decisions
from tests.archived import ArchivedSeed, seed_archived
from tests.viewdata import AUDIT_READ, HOPS, STORE_READ, verdict

NOW_MS = 1_795_000_000_000


@pytest.fixture
def kept(tmp_path: Path) -> tuple[Store, VerdictArchive, ArchivedSeed]:
    store = Store(f"sqlite:///{tmp_path / 'khipu.db'}")
    store.migrate()
    seeded = seed_archived(store, tmp_path / "verdicts", NOW_MS)
    return store, VerdictArchive(tmp_path / "verdicts", store), seeded


def test_merged_keeps_the_sql_row_of_a_hop_both_hold_and_every_other_row() -> None:
    archived = [verdict("m1", hop, "DELIVERED", 1_000) for hop in HOPS[:3]]
    sql = [verdict("m1", HOPS[1], "DUPLICATE", 1_000, count=2), verdict("m1", HOPS[4], "LOST", 1_001)]
    rows = merged(sql, archived)
    assert [(r["hop"], r["verdict"]) for r in rows] == sorted(
        [(HOPS[0], "DELIVERED"), (HOPS[1], "DUPLICATE"), (HOPS[2], "DELIVERED"), (HOPS[4], "LOST")]
    )


def test_a_messages_verdicts_are_its_archived_delivered_hops_and_its_sql_exceptions(
    kept: tuple[Store, VerdictArchive, ArchivedSeed],
) -> None:
    store, archive, seeded = kept
    found = verdicts_of(store.verdicts, archive, [seeded.partly_lost])
    assert found.note is None
    assert {r["hop"]: r["verdict"] for r in found.rows} == {
        **{r["hop"]: "DELIVERED" for r in seeded.archived if r["message_id"] == seeded.partly_lost},
        AUDIT_READ: "LOST",
    }
    assert set(HOPS) == {r["hop"] for r in found.rows}
    assert {r["hop"]: r["verdict"] for r in verdicts_of(store.verdicts, None, [seeded.partly_lost]).rows} == {
        AUDIT_READ: "LOST"
    }  # without the archive: the SQL rows only


def test_an_archived_delivered_changed_later_reads_as_its_sql_row(
    kept: tuple[Store, VerdictArchive, ArchivedSeed],
) -> None:
    store, archive, seeded = kept
    rows = {r["hop"]: r for r in verdicts_of(store.verdicts, archive, [seeded.changed]).rows}
    assert len(rows) == len(HOPS)
    stored = next(r for r in seeded.sql if r["message_id"] == seeded.changed)
    assert (rows[STORE_READ]["verdict"], rows[STORE_READ]["count"]) == (stored["verdict"], stored["count"])
    assert rows[STORE_READ]["late_evidence"] is True


def test_all_verdicts_are_the_union_oldest_first(kept: tuple[Store, VerdictArchive, ArchivedSeed]) -> None:
    store, archive, seeded = kept
    rows = all_verdicts(store.verdicts, archive)
    keys = [(r["message_id"], r["hop"]) for r in rows]
    assert len(keys) == len(set(keys)) == len({(r["message_id"], r["hop"]) for r in seeded.archived + seeded.sql})
    assert [r["decided_ms"] for r in rows] == sorted(r["decided_ms"] for r in rows)
    assert all_verdicts(store.verdicts, archive, stream="nope") == []


def test_an_archived_verdict_gets_its_first_decision_in_the_history(
    kept: tuple[Store, VerdictArchive, ArchivedSeed],
) -> None:
    store, archive, seeded = kept
    rows = verdicts_of(store.verdicts, archive, [seeded.changed]).rows
    history = with_first_decisions(store.verdicts.history(seeded.changed), rows)
    by_hop = {
        hop: [(h["from_verdict"], h["to_verdict"], h["reason"]) for h in history if h["hop"] == hop] for hop in HOPS
    }
    assert by_hop[HOPS[0]] == [(None, "DELIVERED", "decided")]
    assert by_hop[STORE_READ] == [("DELIVERED", "DUPLICATE", "read again")]  # its own history: nothing added
    first = next(h for h in history if h["hop"] == HOPS[0])
    assert first["at_ms"] == next(r["decided_ms"] for r in rows if r["hop"] == HOPS[0])
    assert [h["at_ms"] for h in history] == sorted(h["at_ms"] for h in history)


def test_a_message_the_index_does_not_know_says_older_hours_were_not_searched(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'khipu.db'}")
    store.migrate()
    archive = VerdictArchive(tmp_path / "verdicts", store, max_scan_hours=1)
    archive.write_batch(1, verdict_table([verdict("old", HOPS[0], "DELIVERED", NOW_MS - 5 * HOUR_MS)]))
    archive.write_batch(2, verdict_table([verdict("new", HOPS[0], "DELIVERED", NOW_MS)]))
    found = verdicts_of(store.verdicts, archive, ["old"])
    assert found.rows == [] and found.note is not None and "only the newest 1 of its 2 hours" in found.note
    named = verdicts_of(store.verdicts, archive, ["old"], hours=archive.hours())
    assert [r["message_id"] for r in named.rows] == ["old"] and named.note is None
