"""The verdict book with archived verdicts beside the SQL rows, on SQLite and PostgreSQL: an archived DELIVERED is
final, an open SQL verdict is found by time, a change of an archived verdict inserts the SQL row that overrides it
(and only if no row was written meanwhile)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from khipu.reconcile.window import changes_for
from khipu.store import Store
from khipu.verdicts.book import VerdictBook, verdict_row
from khipu.verdicts.model import Cause, Verdict, VerdictKind
from khipu.verdicts.settle import Change

pytestmark = pytest.mark.integration
HOP = "local/out -> s1"


def judged(message_id: str, kind: VerdictKind, *, decided: int = 40_000, by: str = "detector", **extra: Any) -> Verdict:
    verdict = Verdict(
        message_id=message_id,
        stream="orders",
        hop=HOP,
        hop_kind="read",
        kind=kind,
        cause=Cause.SKIPPED_BY_CONSUMER if kind is VerdictKind.LOST else None,
        count=0 if kind is VerdictKind.LOST else 1,
        topic="out",
        partition=0,
        offset=7,
        group="s1",
        location=None,
        observed_ms=None if kind is VerdictKind.LOST else decided - 100,
        latency_ms=None,
        e2e_latency_ms=None,
        decided_ms=decided,
        detail=kind.value,
        first_seen_ms=1_000,
        decided_by=by,
    )
    return dataclasses.replace(verdict, **extra)


def archived(message_id: str, hop: str = HOP) -> dict[str, Any]:
    """A row of the verdict archive (its columns are the SQL table's: ``group_id``)."""
    row = verdict_row(dataclasses.replace(judged(message_id, VerdictKind.DELIVERED), hop=hop))
    row["group_id"] = row.pop("group")
    return row


def test_an_archived_message_is_settled_unless_an_sql_verdict_of_it_is_open(store: Store) -> None:
    book = VerdictBook(store.verdicts)
    book.apply([Change(judged("m-open", VerdictKind.LOST, hop="other"), "decided")], 40_000)
    rows = [archived("m-archived"), archived("m-open")]
    assert book.settled_messages(["m-archived", "m-open", "m-none"], rows) == {"m-archived"}
    assert book.settled_messages(["m-archived"]) == set()  # without its archived rows: nothing known of it


def test_open_messages_are_found_by_time_across_pages(store: Store) -> None:
    book = VerdictBook(store.verdicts)
    changes = [Change(judged(f"m-{n}", VerdictKind.LOST, decided=40_000 + n), "decided") for n in range(7)]
    changes.append(Change(judged("m-late", VerdictKind.DELIVERED, late_evidence=True), "decided"))
    changes.append(Change(judged("m-final", VerdictKind.CONFIRMED_LOST), "decided"))
    changes.append(Change(judged("m-old", VerdictKind.LOST, decided=1_000), "decided"))
    book.apply(changes, 50_000)
    pages = list(book.open_message_pages(since_ms=10_000, page_rows=3))
    assert [len(page) for page in pages] == [3, 3, 1, 1]  # 7 open rows, then the one with late evidence
    assert set().union(*pages) == {f"m-{n}" for n in range(7)} | {"m-late"}


def test_the_sql_row_wins_and_a_change_of_an_archived_verdict_inserts_its_row(store: Store) -> None:
    book = VerdictBook(store.verdicts)
    book.apply([Change(judged("m1", VerdictKind.LOST, hop="other"), "decided")], 40_000)
    known = book.stored(["m1"], [archived("m1"), archived("m1", hop="other"), archived("m2")])
    assert {hop: v.kind for hop, v in known.by_message["m1"].items()} == {
        HOP: VerdictKind.DELIVERED,
        "other": VerdictKind.LOST,
    }
    assert known.archived == {("m1", HOP)} and "m2" not in known.by_message  # only the messages asked for

    read_twice = judged("m1", VerdictKind.DUPLICATE, by="reconciliation", count=2, cause=Cause.REWIND_REPLAY)
    agreeing = judged("m1", VerdictKind.DELIVERED, by="reconciliation")
    assert changes_for(known.by_message["m1"], [agreeing]) == []  # agreeing with the archive: nothing to write
    changes = changes_for(known.by_message["m1"], [read_twice])
    assert book.apply(changes, 60_000, known.archived) == set()
    row = next(r for r in store.verdicts.read_messages(["m1"]) if r["hop"] == HOP)
    assert (row["verdict"], row["count"], row["decided_ms"]) == ("DUPLICATE", 2, 40_000)  # its first minute kept
    # the archived verdict's first decision is written with the change, so the history reads from the start
    assert [(h["from_verdict"], h["to_verdict"]) for h in store.verdicts.history("m1") if h["hop"] == HOP] == [
        (None, "DELIVERED"),
        ("DELIVERED", "DUPLICATE"),
    ]
    assert book.apply(changes, 61_000, known.archived) == {("m1", HOP)}  # a row exists now: decided on a stale read
