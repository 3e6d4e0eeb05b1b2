"""What the detector's writer asks the store per batch does not grow with the batch: changed verdicts, back-pointers,
malformed records and emitters' sequence numbers each take a fixed number of SQL statements (one per 500 rows),
counted by SQLAlchemy's ``before_cursor_execute`` on SQLite and PostgreSQL, at 5 and at 400 of each; and each
statement does what the rows asked (a guarded change of a row changed meanwhile is not applied)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event

from khipu.detector.gaps import record_emitter_sequences
from khipu.store import Store
from khipu.verdicts.metrics import change_counts, metrics_of
from tests.integration.store.test_verdicts import guard_of, verdict

pytestmark = pytest.mark.integration
SIZES = (5, 400)


@contextmanager
def counted(store: Store) -> Iterator[list[str]]:
    """The statements the store sends while the block runs (each executemany once)."""
    sent: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement.split(None, 1)[0].upper())

    event.listen(store.engine.sql, "before_cursor_execute", count)
    try:
        yield sent
    finally:
        event.remove(store.engine.sql, "before_cursor_execute", count)


def statements_at_each_size(store: Store, step: Callable[[int, int], None]) -> list[list[str]]:
    """``step(n, offset)`` run once per size, on rows of its own (ids from ``offset``); the statements each sent."""
    sent = []
    for number, n in enumerate(SIZES):
        with counted(store) as statements:
            step(n, number * 10_000)
        sent.append(statements)
    return sent


def test_changed_verdicts_take_the_same_statements_however_many_and_a_stale_guard_is_refused(store: Store) -> None:
    def change(n: int, offset: int) -> None:
        ids = [f"m{offset + i}" for i in range(n)]
        first = [verdict(m, "LOST", 1_000) for m in ids]
        store.verdicts.store_changes(first, [None] * n, [None] * n, [change_counts(first, [])] * n, metrics_of)
        second = [verdict(m, "DELIVERED", 2_000, 500) for m in ids]
        guards = [guard_of(v) for v in first]
        guards[0] = {**guards[0], "decided_ms": 999}  # decided against a row that has changed since
        with counted(store) as statements:
            refused = store.verdicts.store_changes(
                second,
                guards,
                [None] * n,
                [change_counts([v], [p]) for v, p in zip(second, first, strict=True)],
                metrics_of,
            )
        changes.append(statements)
        assert refused == {(ids[0], "h")}
        stored = {r["message_id"]: r["verdict"] for r in store.verdicts.rows() if r["message_id"] in set(ids)}
        assert stored == {m: "LOST" if m == ids[0] else "DELIVERED" for m in ids}

    changes: list[list[str]] = []
    statements_at_each_size(store, change)
    assert len(changes[0]) == len(changes[1]) and changes[0] == changes[1], changes
    assert changes[0].count("WITH") == 1  # the guarded updates: one statement (a WITH ... UPDATE)


def test_pointers_and_malformed_records_take_one_statement_however_many(store: Store) -> None:
    def pointers(n: int, offset: int) -> None:
        found = [("sink", "local", "orders", 0, offset + i) for i in range(n)]
        assert store.channel.record_pointers(found + found[:2], 1_000) == n  # twice in a batch: kept once
        assert store.channel.record_pointers(found, 2_000) == 0  # a replayed batch adds nothing

    def malformed(n: int, offset: int) -> None:
        rows = [
            {"source_topic": "traces", "source_partition": 0, "source_offset": offset + i, "quarantine_reason": "bad",
             "raw_value": b"x"}
            for i in range(n)
        ]  # fmt: skip
        assert store.channel.add_quarantine(rows, 1_000) == n

    for step in (pointers, malformed):
        small, large = statements_at_each_size(store, step)
        assert small == large and small.count("INSERT") == len(small), (step.__name__, small, large)


def test_emitters_sequence_numbers_take_the_same_statements_however_many_emitters(store: Store) -> None:
    def sequences(n: int, offset: int) -> None:
        emitters = [f"e{offset + i}" for i in range(n)]
        # numbers 0..9 but 5: a gap, settled (the topic is read past it), then 5 comes late and 10..12 follow
        first = [(e, "loc", seq, 1_000 + seq) for e in emitters for seq in range(10) if seq != 5]
        record_emitter_sequences(store.channel, first, 2_000, settled_ms=100_000)
        gaps = store.channel.gap_summary()
        assert sum(row["missing"] for row in gaps if row["location"] == "loc") >= n
        with counted(store) as statements:
            late = [(e, "loc", seq, 5_000 + seq) for e in emitters for seq in (5, 10, 11, 12)]
            record_emitter_sequences(store.channel, late, 6_000, settled_ms=100_000)
        second.append(statements)
        assert store.channel.trace_gaps("loc") == []  # every gap filled

    second: list[list[str]] = []
    small, large = statements_at_each_size(store, sequences)
    assert small == large, (small, large)
    assert second[0] == second[1], second


def test_a_statement_carries_500_changes_and_a_stale_guard_anywhere_is_refused_even_on_a_key_changed_twice(
    store: Store,
) -> None:
    ids = [f"c{i}" for i in range(1_201)]
    first = [verdict(m, "LOST", 1_000) for m in ids]
    n = len(ids)
    store.verdicts.store_changes(first, [None] * n, [None] * n, [change_counts(first, [])] * n, metrics_of)
    second = [verdict(m, "DELIVERED", 2_000, 500) for m in ids]
    guards = [guard_of(v) for v in first]
    guards[1_100] = {**guards[1_100], "verdict": "PENDING"}  # in the third statement: decided against another row
    # c0 changed twice in the same call: first from its LOST (applies), then from a row it never had (refused)
    again = verdict("c0", "DUPLICATE", 3_000, 500)
    rows, all_guards = [*second, again], [*guards, {"verdict": "LOST", "decided_ms": 1, "late_evidence": False}]
    counts = [change_counts([v], [p]) for v, p in zip(second, first, strict=True)] + [change_counts([again], [])]
    with counted(store) as statements:
        refused = store.verdicts.store_changes(rows, all_guards, [None] * (n + 1), counts, metrics_of)
    assert statements.count("WITH") == 4  # 1,201 in three statements of at most 500, then c0's second change
    assert refused == {("c1100", "h"), ("c0", "h")}
    stored = {r["message_id"]: r["verdict"] for r in store.verdicts.rows()}
    assert stored["c1100"] == "LOST" and stored["c0"] == "DELIVERED" and stored["c1200"] == "DELIVERED"


def test_a_value_too_long_for_its_column_is_refused_on_postgresql_not_cut_short(empty_postgres_url: str) -> None:
    """SQLite keeps text of any length; PostgreSQL refuses a value longer than its column, and a batched change
    must not cast it to fit (an explicit cast to varchar(n) cuts it short without an error)."""
    store = Store(empty_postgres_url)
    store.migrate()
    try:
        row = verdict("long", "LOST", 1_000)
        store.verdicts.store_changes([row], [None], [None], [change_counts([row], [])], metrics_of)
        changed = verdict("long", "DELIVERED", 2_000, cause="x" * 40)  # the cause column holds 32
        with pytest.raises(Exception, match="too long"):
            store.verdicts.store_changes(
                [changed], [guard_of(row)], [None], [change_counts([changed], [row])], metrics_of
            )
        assert {r["message_id"]: r["cause"] for r in store.verdicts.rows()} == {"long": None}
    finally:
        store.close()
