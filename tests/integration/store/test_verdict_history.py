"""Verdicts settled through the verdict book on SQLite and PostgreSQL: late evidence kept, history written,
final messages told apart, metrics of the minutes a verdict left and joined recomputed."""

from __future__ import annotations

import dataclasses

import pytest

from khipu.reconcile.window import changes_for
from khipu.store import Store
from khipu.verdicts.book import VerdictBook
from khipu.verdicts.metrics import MINUTE_MS
from khipu.verdicts.model import Cause, Verdict, VerdictKind

pytestmark = pytest.mark.integration


def judged(message_id: str, kind: VerdictKind, *, seen: int, decided: int, by: str = "detector") -> Verdict:
    return Verdict(
        message_id=message_id,
        stream="orders",
        hop="local/out -> s1",
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
        first_seen_ms=seen,
        decided_by=by,
    )


def test_late_evidence_is_kept_and_the_history_tells_the_story(store: Store) -> None:
    book = VerdictBook(store.verdicts)
    book.record([judged("m1", VerdictKind.DELIVERED, seen=1_000, decided=40_000)], 40_000)
    book.record([judged("m2", VerdictKind.LOST, seen=1_000, decided=40_000)], 40_000)
    # minutes later a rewound group reads m1 again, and m2's RECEIVED trace turns up: fresh states
    late = [
        judged("m1", VerdictKind.DELIVERED, seen=600_000, decided=640_000),
        judged("m2", VerdictKind.DELIVERED, seen=600_000, decided=640_000),
    ]
    changes = book.record(late, 640_000).changes
    assert [(c.verdict.message_id, c.verdict.kind) for c in changes] == [
        ("m1", VerdictKind.DUPLICATE),
        ("m2", VerdictKind.RETRACTED),
    ]
    rows = {r["message_id"]: r for r in store.verdicts.rows()}
    assert (rows["m1"]["verdict"], rows["m1"]["cause"], rows["m1"]["count"]) == ("DUPLICATE", "rewind_replay", 2)
    assert (rows["m2"]["verdict"], rows["m2"]["evidence_kind"]) == ("RETRACTED", "DELIVERED")
    assert rows["m1"]["late_evidence"] and rows["m2"]["late_evidence"]
    story = [(h["from_verdict"], h["to_verdict"], h["at_ms"]) for h in store.verdicts.history("m2")]
    assert story == [(None, "LOST", 40_000), ("LOST", "RETRACTED", 640_000)]

    assert book.settled_messages(["m1", "m2", "m3"]) == set()  # both carry late evidence; m3 is unknown
    reconciled = [
        dataclasses.replace(
            judged("m1", VerdictKind.DUPLICATE, seen=1_000, decided=700_000, by="reconciliation"),
            cause=Cause.REWIND_REPLAY,
            count=2,
        ),
        judged("m2", VerdictKind.DELIVERED, seen=1_000, decided=700_000, by="reconciliation"),
    ]
    stored = book.stored_verdicts(["m1", "m2"])
    changes = [change for verdict in reconciled for change in changes_for(stored[verdict.message_id], [verdict])]
    assert book.apply(changes, 700_000) == set()
    assert book.settled_messages(["m1", "m2", "m3"]) == {"m1", "m2"}  # reconciled: the late evidence is dealt with

    # both stay in the minute they were first decided in: it now counts a retraction and a duplicate
    (minute,) = store.verdicts.read_metrics()
    assert minute["minute_ms"] == 40_000 // MINUTE_MS * MINUTE_MS
    assert (minute["lost"], minute["retracted"], minute["duplicate"], minute["false_loss_rate"]) == (0, 1, 1, 1.0)


def test_the_same_judgement_twice_writes_nothing_the_second_time(store: Store) -> None:
    book = VerdictBook(store.verdicts)
    verdict = judged("m1", VerdictKind.LOST, seen=1_000, decided=40_000)
    assert len(book.record([verdict], 40_000).changes) == 1
    replayed = book.record([dataclasses.replace(verdict, decided_ms=41_000)], 41_000)  # a replayed batch
    assert replayed.changes == [] and replayed.current[("m1", "local/out -> s1")].kind is VerdictKind.LOST
    assert len(store.verdicts.history("m1")) == 1


def test_a_change_decided_against_a_row_that_changed_meanwhile_is_not_applied(store: Store) -> None:
    book = VerdictBook(store.verdicts)
    book.record([judged("m1", VerdictKind.LOST, seen=1_000, decided=40_000)], 40_000)
    read_by_reconciliation = book.stored_verdicts(["m1"])["m1"]
    # meanwhile the detector's writer retracts it (a late RECEIVED)
    book.record([judged("m1", VerdictKind.DELIVERED, seen=600_000, decided=640_000)], 640_000)
    confirmed = changes_for(
        read_by_reconciliation, [judged("m1", VerdictKind.LOST, seen=1_000, decided=700_000, by="reconciliation")]
    )
    assert book.apply(confirmed, 700_000) == {("m1", "local/out -> s1")}  # not applied: decided on a stale read
    (row,) = store.verdicts.rows()
    assert row["verdict"] == "RETRACTED"
    assert [h["to_verdict"] for h in store.verdicts.history("m1")] == ["LOST", "RETRACTED"]
