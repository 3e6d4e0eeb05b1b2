"""Verdicts and their per-minute metrics in the store (SQLite and PostgreSQL), the way the writers drive them:
the detector replaces a part of its own per batch (the verdicts it archives), every change of a stored verdict
moves its counts in the part ``changes`` with the row, and a minute's metrics are the sum of its parts."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import insert, update

from khipu.store import Store, schema
from khipu.store.engine import MIGRATIONS
from khipu.store.verdicts import CHANGES_PART
from khipu.verdicts.book import VerdictBook, verdict_of
from khipu.verdicts.metrics import (
    MINUTE_MS,
    MinuteCounts,
    MinuteKey,
    change_counts,
    counts_by_minute,
    metrics_of,
    minutes_touched,
)
from khipu.verdicts.model import Cause, Verdict, VerdictKind

pytestmark = pytest.mark.integration

COUNTS = ("delivered", "lost", "duplicate", "trace_lost", "pending", "confirmed_lost", "retracted")
DERIVED = ("false_loss_rate", "loss_rate", "duplicate_rate", "latency_p50_ms", "latency_p95_ms", "latency_p99_ms")


def verdict(
    message_id: str, kind: str, decided_ms: int, latency_ms: int | None = None, hop: str = "h", **extra: Any
) -> dict[str, Any]:
    return {
        "message_id": message_id,
        "hop": hop,
        "stream": "orders",
        "hop_kind": "read",
        "verdict": kind,
        "cause": None,
        "count": 1,
        "topic": "orders",
        "partition": 0,
        "offset": 1,
        "group": "sink",
        "location": "sink",
        "observed_ms": decided_ms,
        "latency_ms": latency_ms,
        "e2e_latency_ms": latency_ms,
        "decided_ms": decided_ms,
        "detail": "",
        "first_seen_ms": decided_ms - 1_000,
        **extra,
    }


def archive_batch(store: Store, part: str, rows: Sequence[dict[str, Any]]) -> None:
    """What the detector's writer does with the plain DELIVERED verdicts of a batch: archive them (not here),
    count them in a part of the batch's own."""
    store.verdicts.replace_part(part, counts_by_minute(rows), metrics_of)


def store_change(
    store: Store, new: dict[str, Any], previous: dict[str, Any] | None, guard: dict[str, Any] | None
) -> set[tuple[str, str]]:
    counts = change_counts([new], [previous] if previous else [])
    return store.verdicts.store_changes([new], [guard], [None], [counts], metrics_of)


def guard_of(row: dict[str, Any]) -> dict[str, Any]:
    return {"verdict": row["verdict"], "decided_ms": row["decided_ms"], "late_evidence": False}


def metric_counts(store: Store) -> dict[int, tuple[int, ...]]:
    """minute -> its stored counts, in COUNTS order (stream orders, hop h)."""
    return {
        int(m["minute_ms"]): tuple(m[name] for name in COUNTS)
        for m in store.verdicts.read_metrics("orders")
        if m["hop"] == "h"
    }


def assert_minutes_are_the_sum_of_their_parts(store: Store) -> None:
    summed: dict[MinuteKey, MinuteCounts] = {}
    for part in store.verdicts.read_parts():
        key = MinuteKey(part["stream"], part["hop"], part["minute_ms"])
        summed[key] = summed.get(key, MinuteCounts()).plus(MinuteCounts.of_row(part))
    stored = {MinuteKey(m["stream"], m["hop"], m["minute_ms"]): m for m in store.verdicts.read_metrics()}
    assert set(stored) == {key for key, counts in summed.items() if counts.verdicts}
    for key, row in stored.items():
        expected = metrics_of(key, summed[key])
        assert MinuteCounts.of_row(row) == summed[key], key
        assert {name: row[name] for name in DERIVED} == {name: getattr(expected, name) for name in DERIVED}, key


def test_a_replayed_batch_replaces_its_own_part_and_leaves_the_same_tables(store: Store) -> None:
    batch = [
        verdict("m1", "DELIVERED", 1_000, 10),
        verdict("m2", "DELIVERED", 2_000, 1_234),
        verdict("m3", "DELIVERED", 70_000, 30),
    ]
    archive_batch(store, "detector:q1:7", batch)
    first = (store.verdicts.read_parts(), store.verdicts.read_metrics())
    archive_batch(store, "detector:q1:7", batch)  # replayed after a restart
    assert (store.verdicts.read_parts(), store.verdicts.read_metrics()) == first
    assert [(p["minute_ms"], p["part"], p["delivered"], p["latency_histogram"]) for p in first[0]] == [
        (0, "detector:q1:7", 2, '{"10":1,"1230":1}'),
        (MINUTE_MS, "detector:q1:7", 1, '{"30":1}'),
    ]
    assert [(m["minute_ms"], m["delivered"], m["latency_p50_ms"], m["latency_p99_ms"]) for m in first[1]] == [
        (0, 2, 10, 1_230),  # 1,234 ms is counted in its bucket, 1,230
        (MINUTE_MS, 1, 30, 30),
    ]
    assert_minutes_are_the_sum_of_their_parts(store)


def test_kafka_semantics_reprocessing_and_skew_are_stored_apart_and_outside_the_rates(store: Store) -> None:
    """ABORTED, SUPERSEDED and a reprocessed duplicate have count columns of their own, an impossible latency
    goes to the skew histogram: summed from parts like every count, and the rates and percentiles leave them out."""
    batch = [
        verdict("m1", "DELIVERED", 1_000, 10),
        verdict("m2", "DELIVERED", 2_000, -30_412),  # received 30 s before it was written: clock skew
        verdict("m3", "ABORTED", 3_000),
        verdict("m4", "SUPERSEDED", 4_000, cause="compacted"),
        verdict("m5", "DUPLICATE", 5_000, 20, cause="reprocessed_after_abort"),
        verdict("m6", "LOST", 6_000, cause="skipped_by_consumer"),
    ]
    archive_batch(store, "detector:q1:9", batch[:3])
    store_change(store, batch[3], None, None)
    store_change(store, batch[4], None, None)
    store_change(store, batch[5], None, None)
    [minute] = store.verdicts.read_metrics()
    counts = {name: minute[name] for name in ("delivered", "lost", "duplicate", "aborted", "superseded", "reprocessed")}
    assert counts == {"delivered": 2, "lost": 1, "duplicate": 0, "aborted": 1, "superseded": 1, "reprocessed": 1}
    assert minute["skew_histogram"] == '{"-30400":1}' and minute["latency_histogram"] == '{"10":1,"20":1}'
    assert minute["loss_rate"] == 1 / 4 and minute["duplicate_rate"] == 0.0  # of 4 judged, not 6
    assert (minute["latency_p50_ms"], minute["latency_p99_ms"]) == (10, 20)  # no negative percentile
    assert_minutes_are_the_sum_of_their_parts(store)


def test_a_part_replaced_by_fewer_minutes_takes_its_counts_out_of_the_minutes_it_left(store: Store) -> None:
    archive_batch(
        store, "detector:q1:1", [verdict("m1", "DELIVERED", 1_000, 10), verdict("m2", "DELIVERED", 70_000, 5)]
    )
    archive_batch(store, "detector:q1:2", [verdict("m3", "DELIVERED", 2_000, 20)])
    archive_batch(store, "detector:q1:1", [verdict("m2", "DELIVERED", 70_000, 5)])  # the batch, re-planned
    assert metric_counts(store) == {0: (1, 0, 0, 0, 0, 0, 0), MINUTE_MS: (1, 0, 0, 0, 0, 0, 0)}
    archive_batch(store, "detector:q1:1", [])  # nothing left of it: its minute sums to no verdict, and goes
    assert metric_counts(store) == {0: (1, 0, 0, 0, 0, 0, 0)}
    assert {p["part"] for p in store.verdicts.read_parts()} == {"detector:q1:2"}
    assert_minutes_are_the_sum_of_their_parts(store)


def test_a_writer_of_a_minute_waits_for_another_and_sums_what_that_one_committed(store: Store) -> None:
    archive_batch(store, "detector:q1:1", [verdict("m1", "DELIVERED", 1_000, 5)])
    parts, metrics = schema.verdict_metric_parts, schema.verdict_metrics
    finished = threading.Event()
    writer = threading.Thread(
        target=lambda: (archive_batch(store, "detector:q1:3", [verdict("m3", "DELIVERED", 2_000, 9)]), finished.set())
    )
    with store.engine.sql.connect() as other:
        with other.begin():  # another writer mid-transaction: its part is in, its minute held
            other.execute(
                insert(parts).values(
                    stream="orders", hop="h", minute_ms=0, part="detector:q1:2", **dict.fromkeys(COUNTS, 0),
                    latency_histogram='{"7":1}',
                ).values(delivered=1)
            )  # fmt: skip
            other.execute(update(metrics).where(metrics.c.minute_ms == 0).values(delivered=metrics.c.delivered))
            writer.start()
            assert not finished.wait(1.0)  # this writer waits for the minute ...
    writer.join(timeout=60)
    assert finished.is_set()  # ... and then sums the other's part too
    assert metric_counts(store) == {0: (3, 0, 0, 0, 0, 0, 0)}
    assert store.verdicts.read_metrics()[0]["latency_histogram"] == '{"5":1,"7":1,"9":1}'
    assert_minutes_are_the_sum_of_their_parts(store)


def test_the_changes_part_is_the_stores_own(store: Store) -> None:
    for part in (CHANGES_PART, "", "x" * 250):
        with pytest.raises(ValueError, match=f"part {part!r}: expected a writer's id of 1 to 249 characters"):
            store.verdicts.replace_part(part, {}, metrics_of)


def test_a_lost_verdict_retracted_later_moves_its_count_from_lost_to_retracted(store: Store) -> None:
    archive_batch(store, "detector:q1:1", [verdict("m1", "DELIVERED", 3_000, 8)])
    lost = verdict("m2", "LOST", 2_000, cause="skipped_by_consumer")
    assert store_change(store, lost, None, None) == set()
    assert metric_counts(store) == {0: (1, 1, 0, 0, 0, 0, 0)}
    retracted = verdict("m2", "RETRACTED", 2_000, 40, evidence_kind="DELIVERED", late_evidence=True)
    assert store_change(store, retracted, lost, guard_of(lost)) == set()
    assert metric_counts(store) == {0: (1, 0, 0, 0, 0, 0, 1)}
    [minute] = store.verdicts.read_metrics()
    assert (minute["false_loss_rate"], minute["loss_rate"], minute["latency_histogram"]) == (1.0, 0.0, '{"8":1,"40":1}')
    [changes] = [p for p in store.verdicts.read_parts() if p["part"] == CHANGES_PART]
    assert (changes["lost"], changes["retracted"], changes["latency_histogram"]) == (0, 1, '{"40":1}')
    assert_minutes_are_the_sum_of_their_parts(store)


def test_a_change_not_applied_moves_no_count(store: Store) -> None:
    lost = verdict("m1", "LOST", 2_000)
    store_change(store, lost, None, None)
    stale = {"verdict": "PENDING", "decided_ms": 2_000, "late_evidence": False}  # decided against another read
    assert store_change(store, verdict("m1", "CONFIRMED_LOST", 2_000), lost, stale) == {("m1", "h")}
    assert store_change(store, verdict("m1", "LOST", 2_000), None, None) == {("m1", "h")}  # the row exists
    assert metric_counts(store) == {0: (0, 1, 0, 0, 0, 0, 0)}
    assert_minutes_are_the_sum_of_their_parts(store)


def test_an_archived_delivered_changed_to_duplicate_moves_delivered_to_duplicate_in_its_minute(store: Store) -> None:
    delivered = verdict("m1", "DELIVERED", 61_000, 12)
    archive_batch(store, "detector:q1:3", [delivered, verdict("m2", "DELIVERED", 62_000, 15)])
    assert metric_counts(store) == {MINUTE_MS: (2, 0, 0, 0, 0, 0, 0)}
    # a rewound group reads m1 again: no SQL row to guard, the archived DELIVERED is the previous verdict
    duplicate = verdict("m1", "DUPLICATE", 61_000, 12, cause="rewind_replay", count=2, late_evidence=True)
    assert store_change(store, duplicate, delivered, None) == set()
    assert metric_counts(store) == {MINUTE_MS: (1, 0, 1, 0, 0, 0, 0)}
    [minute] = store.verdicts.read_metrics()
    assert (minute["duplicate_rate"], minute["latency_histogram"]) == (0.5, '{"12":1,"15":1}')
    archive_batch(store, "detector:q1:3", [delivered, verdict("m2", "DELIVERED", 62_000, 15)])  # the batch replayed
    assert metric_counts(store) == {MINUTE_MS: (1, 0, 1, 0, 0, 0, 0)}
    assert [r["verdict"] for r in store.verdicts.rows()] == ["DUPLICATE"]
    assert_minutes_are_the_sum_of_their_parts(store)


def judged(message_id: str, kind: VerdictKind, decided_ms: int, seen_ms: int, latency_ms: int | None) -> Verdict:
    return verdict_of(
        verdict(
            message_id,
            kind.value,
            decided_ms,
            latency_ms,
            first_seen_ms=seen_ms,
            cause=Cause.SKIPPED_BY_CONSUMER.value if kind is VerdictKind.LOST else None,
        )
    )


def test_the_book_settles_against_an_archived_verdict_and_moves_its_count(store: Store) -> None:
    book = VerdictBook(store.verdicts)
    archived = judged("m1", VerdictKind.DELIVERED, 61_000, 60_000, 12)
    archive_batch(store, "detector:q1:3", [verdict("m1", "DELIVERED", 61_000, 12)])
    late = judged("m1", VerdictKind.DELIVERED, 400_000, 399_000, 20)  # read again by a rewound group
    recorded = book.record([late], 400_000, archived={("m1", "h"): archived})
    assert [(c.verdict.kind, c.previous) for c in recorded.changes] == [(VerdictKind.DUPLICATE, archived)]
    assert metric_counts(store) == {MINUTE_MS: (0, 0, 1, 0, 0, 0, 0)}  # it keeps the minute it was first decided in
    again = book.record([late], 400_000, archived={("m1", "h"): archived})  # a replayed batch: the row is there
    assert again.changes == [] and metric_counts(store) == {MINUTE_MS: (0, 0, 1, 0, 0, 0, 0)}
    lost = judged("m2", VerdictKind.LOST, 62_000, 60_000, None)
    book.record([lost], 62_000)
    assert metric_counts(store) == {MINUTE_MS: (0, 1, 1, 0, 0, 0, 0)}
    assert_minutes_are_the_sum_of_their_parts(store)


def test_exceptions_are_counted_from_rows_by_cause_and_may_leave_a_kind_out(store: Store) -> None:
    store.verdicts.upsert(
        [
            verdict("m1", "DELIVERED", 59_999, 5),
            verdict("m2", "LOST", 60_000, cause="skipped_by_consumer"),  # the next minute
            verdict("m3", "DUPLICATE", 10, 7, hop="other", cause="rewind_replay"),
        ]
    )
    assert store.verdicts.kind_counts(0, excluding=["DELIVERED"]) == {
        ("orders", "h", "LOST", "skipped_by_consumer"): 1,
        ("orders", "other", "DUPLICATE", "rewind_replay"): 1,
    }
    assert store.verdicts.kind_counts(60_000) == {("orders", "h", "LOST", "skipped_by_consumer"): 1}
    assert store.verdicts.read_metrics() == []  # upsert leaves the metrics alone
    assert store.verdicts.read(stream="payments") == [] and len(store.verdicts.read(since_ms=60_000)) == 1


def migrate_to(url: str, revision: str, step: Any = command.upgrade) -> None:
    """Upgrade (or, with ``step=command.downgrade``, downgrade) the store at ``url`` to ``revision``."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    store = Store(url)
    try:
        with store.engine.sql.begin() as connection:
            config.attributes["connection"] = connection
            step(config, revision)
    finally:
        store.close()


def test_migration_0008_keeps_every_stored_minute_as_a_part_with_its_latencies(
    tmp_path: Path, empty_postgres_url: str
) -> None:
    rows = [
        verdict("m1", "DELIVERED", 1_000, 10),
        verdict("m2", "DELIVERED", 2_000, 12_345),
        verdict("m3", "LOST", 3_000),
        verdict("m4", "RESENT", 61_000, 7),
    ]
    for url in (f"sqlite:///{tmp_path / 'old.db'}", empty_postgres_url):
        migrate_to(url, "0007")
        store = Store(url)
        try:
            added_since = {"latency_histogram", "skew_histogram", "aborted", "superseded", "reprocessed"}  # 0008, 0010
            old_metrics = {c.name for c in schema.verdict_metrics.columns} - added_since
            with store.engine.begin() as tx:
                for row in rows:
                    values = {**{k: v for k, v in row.items() if k != "group"}, "group_id": row["group"]}
                    tx.execute(insert(schema.verdicts).values(**values))
                for key, counts in counts_by_minute(rows).items():
                    figures = metrics_of(key, counts)
                    tx.execute(
                        insert(schema.verdict_metrics).values(**{name: getattr(figures, name) for name in old_metrics})
                    )
            migrate_to(url, "head")
            parts = store.verdicts.read_parts()
            assert [(p["minute_ms"], p["part"], p["delivered"], p["lost"], p["confirmed_lost"]) for p in parts] == [
                (0, "migration:0008", 2, 1, 0),
                (MINUTE_MS, "migration:0008", 0, 0, 1),
            ]
            assert [m["latency_histogram"] for m in store.verdicts.read_metrics()] == ['{"10":1,"12300":1}', '{"7":1}']
            assert [p["latency_histogram"] for p in parts] == ['{"10":1,"12300":1}', '{"7":1}']
            assert [MinuteKey(m["stream"], m["hop"], m["minute_ms"]) for m in store.verdicts.read_metrics()] == (
                minutes_touched(rows)
            )
            # the next change of a migrated minute adds to what it had
            book = VerdictBook(store.verdicts)
            [lost] = [v for v in book.stored_verdicts(["m3"])["m3"].values()]
            assert book.record([judged("m3", VerdictKind.DELIVERED, 400_000, 399_000, 40)], 400_000).changes
            assert metric_counts(store)[0] == (2, 0, 0, 0, 0, 0, 1) and lost.kind is VerdictKind.LOST
            assert_minutes_are_the_sum_of_their_parts(store)
        finally:
            store.close()
