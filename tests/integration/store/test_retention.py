"""Retention in the store, on SQLite and PostgreSQL: settled verdicts and their history go by age (LOST, PENDING
and the messages a resend still needs stay), old minutes roll up into hours with a window's counts and
percentiles unchanged, heartbeats keep each query's newest, and a dry run counts exactly and changes nothing."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from sqlalchemy import insert, select

from khipu.retention.policy import REMOVABLE_VERDICTS
from khipu.store import Store, schema
from khipu.store.verdicts import ROLLUP_PART
from khipu.verdicts.book import VerdictBook, verdict_of
from khipu.verdicts.metrics import MinuteCounts, metrics_of
from khipu.verdicts.settle import Change

from .test_verdicts import archive_batch, verdict

pytestmark = pytest.mark.integration
MINUTE, HOUR, DAY = 60_000, 3_600_000, 86_400_000
T0 = 20_000 * DAY  # a day's start, far from zero


def tables(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the tables retention touches, in a stable order (what "changed nothing" compares)."""
    found = {}
    with store.engine.begin() as tx:
        for table in (schema.verdicts, schema.verdict_history, schema.verdict_metrics, schema.verdict_metric_parts,
                      schema.quarantine, schema.trace_gaps, schema.detector_heartbeat):  # fmt: skip
            found[table.name] = sorted(tuple(row) for row in tx.execute(select(table)))
    return found


def test_settled_verdicts_and_their_history_go_by_age_unsettled_and_pinned_ones_stay(store: Store) -> None:
    cutoff = T0 + 10 * DAY
    decided = [  # (message, kind, decided_ms): kept when young, unsettled or pinned
        ("old-delivered", "DELIVERED", cutoff - 1), ("old-dup", "DUPLICATE", cutoff - DAY),
        ("old-retracted", "RETRACTED", cutoff - 5 * DAY), ("old-confirmed", "CONFIRMED_LOST", cutoff - 2 * DAY),
        ("pinned", "CONFIRMED_LOST", cutoff - 3 * DAY), ("old-lost", "LOST", cutoff - 4 * DAY),
        ("old-pending", "PENDING", cutoff - DAY), ("young", "DELIVERED", cutoff),
        ("young-dup", "DUPLICATE", cutoff + 9),
    ]  # fmt: skip
    rows = [verdict(m, kind, at, stream="payments" if m == "old-confirmed" else "orders") for m, kind, at in decided]
    rows.append(verdict("pinned", "DELIVERED", cutoff - 4 * DAY, hop="h-read"))  # the pinned message's read hop
    VerdictBook(store.verdicts).apply([Change(verdict_of(r), "decided") for r in rows], T0)
    assert {h["message_id"] for h in _history(store)} == {m for m, _, _ in decided}  # a first-verdict entry each

    before = tables(store)
    dry = store.verdicts.prune(cutoff, REMOVABLE_VERDICTS, keep_losses_of={"orders"}, dry_run=True)
    assert tables(store) == before
    done = store.verdicts.prune(cutoff, REMOVABLE_VERDICTS, keep_losses_of={"orders"})

    # old-confirmed is a loss of "payments", whose resend is off: nothing will act on it; every row of "pinned"
    # (a confirmed loss of "orders") stays, its read hop's DELIVERED too
    gone = {"old-delivered", "old-dup", "old-retracted", "old-confirmed"}
    assert {r["message_id"] for r in store.verdicts.rows()} == {m for m, _, _ in decided} - gone
    assert {r["hop"] for r in store.verdicts.rows() if r["message_id"] == "pinned"} == {"h", "h-read"}
    history_at = {h["message_id"]: h["at_ms"] for h in _history(store)}
    assert set(history_at) == {m for m, _, _ in decided} - gone  # history goes with its verdict, and only then
    assert done == dry == (4, 4)
    assert store.verdicts.prune(cutoff, REMOVABLE_VERDICTS, keep_losses_of={"orders"}) == (0, 0)  # again: nothing more


def test_old_minutes_roll_up_into_hours_with_each_hours_counts_and_percentiles_unchanged(store: Store) -> None:
    # three hours of minutes, two hops; latencies spread so the hour's p99 differs from any one minute's
    written: Counter[tuple[str, int, str]] = Counter()  # (hop, hour, kind) -> verdicts, as the test wrote them
    batch = 0
    for hour in range(3):
        for minute in range(0, 60, 7):
            at = T0 + hour * HOUR + minute * MINUTE
            rows = []
            for i in range(minute % 5 + 1):
                for hop in ("h", "h2"):
                    rows.append(
                        verdict(
                            f"m{hour}-{minute}-{i}-{hop}", "DELIVERED", at + i, (i + 1) * (minute + 1) * 97, hop=hop
                        )
                    )
                    written[(hop, hour, "delivered")] += 1
            batch += 1
            archive_batch(store, f"detector:q:{batch}", rows)
    # a changed verdict (the changes part), in hour 1: a DELIVERED becomes DUPLICATE
    lost = verdict("changed", "LOST", T0 + HOUR + 5 * MINUTE)
    VerdictBook(store.verdicts).apply([Change(verdict_of(lost), "decided")], T0 + HOUR + 5 * MINUTE)
    written[("h", 1, "lost")] += 1

    def hourly(rows: list[dict[str, Any]]) -> dict[tuple[str, int], MinuteCounts]:
        summed: dict[tuple[str, int], MinuteCounts] = {}
        for row in rows:
            key = (row["hop"], (int(row["minute_ms"]) - T0) // HOUR)
            summed[key] = summed.get(key, MinuteCounts()).plus(MinuteCounts.of_row(row))
        return summed

    before_hours = hourly(store.verdicts.read_metrics())
    young = [m for m in store.verdicts.read_metrics() if m["minute_ms"] >= T0 + 2 * HOUR]
    before = tables(store)
    parts_before = len(store.verdicts.read_parts(since_ms=0)) - len(
        [p for p in store.verdicts.read_parts() if p["minute_ms"] >= T0 + 2 * HOUR]
    )

    assert store.verdicts.roll_up(T0 + 2 * HOUR, HOUR, metrics_of, dry_run=True) == parts_before
    assert tables(store) == before
    assert store.verdicts.roll_up(T0 + 2 * HOUR, HOUR, metrics_of) == parts_before

    metrics = store.verdicts.read_metrics()
    assert sorted((m["hop"], m["minute_ms"]) for m in metrics if m["minute_ms"] < T0 + 2 * HOUR) == [
        ("h", T0),
        ("h", T0 + HOUR),
        ("h2", T0),
        ("h2", T0 + HOUR),
    ]  # one row per hop and old hour, at the hour's start
    assert [m for m in metrics if m["minute_ms"] >= T0 + 2 * HOUR] == young  # the young hour is left alone
    after_hours = hourly(metrics)
    assert after_hours == before_hours  # counts and latency histograms, hour by hour
    for (hop, hour), counts in after_hours.items():
        assert counts.delivered == written[(hop, hour, "delivered")] and counts.lost == written[(hop, hour, "lost")]
        row = next(m for m in metrics if m["hop"] == hop and m["minute_ms"] == T0 + hour * HOUR) if hour < 2 else None
        if row is not None:
            assert row["latency_p99_ms"] == metrics_of(("orders", hop, T0 + hour * HOUR), counts).latency_p99_ms
    parts = store.verdicts.read_parts()
    assert {p["part"] for p in parts if p["minute_ms"] < T0 + 2 * HOUR} == {ROLLUP_PART}
    again = tables(store)
    assert store.verdicts.roll_up(T0 + 2 * HOUR, HOUR, metrics_of) == 0 and tables(store) == again

    # a late change to a rolled-up hour adds a minute beside it; the next roll-up folds it in
    late = verdict("late", "DUPLICATE", T0 + 30 * MINUTE)
    VerdictBook(store.verdicts).apply([Change(verdict_of(late), "decided")], T0 + 3 * DAY)
    assert store.verdicts.roll_up(T0 + 2 * HOUR, HOUR, metrics_of) == 1
    assert hourly(store.verdicts.read_metrics())[("h", 0)].duplicate == 1

    assert store.verdicts.prune_metrics(T0 + HOUR) == 2  # the first hour's two rows
    assert min(m["minute_ms"] for m in store.verdicts.read_metrics()) == T0 + HOUR
    assert min(p["minute_ms"] for p in store.verdicts.read_parts()) == T0 + HOUR


def test_quarantine_gaps_and_heartbeats_go_by_age_each_query_keeps_its_newest_report(store: Store) -> None:
    for offset, at in enumerate((T0, T0 + DAY, T0 + 3 * DAY)):
        store.channel.add_quarantine(
            [{"source_topic": "khipu.traces", "source_partition": 0, "source_offset": offset,
              "quarantine_reason": "bad", "raw_value": b"x"}], at
        )  # fmt: skip
    with store.engine.begin() as tx:
        tx.execute(insert(schema.trace_gaps), [
            {"emitter_id": "e", "location": "p", "from_seq": s, "to_seq": s + 1, "after_ms": at - 1, "before_ms": at,
             "noticed_ms": at} for s, at in ((1, T0), (5, T0 + 2 * DAY))
        ])  # fmt: skip
    beat = {"run_id": "r", "batch_id": 1, "input_rows": 0, "caught_up": True}
    with store.engine.begin() as tx:  # written directly: record() keeps only a day of one query's reports
        tx.execute(insert(schema.detector_heartbeat), [
            {**beat, "query_name": q, "at_ms": at}
            for q, at in (("a", T0), ("a", T0 + 1), ("b", T0), ("a", T0 + 5 * DAY))
        ])  # fmt: skip

    assert store.channel.prune_quarantine(T0 + 2 * DAY, dry_run=True) == 2
    assert store.channel.prune_quarantine(T0 + 2 * DAY) == 2
    assert [r["source_offset"] for r in store.channel.quarantined()] == [2]
    assert store.channel.prune_gaps(T0 + DAY) == 1
    assert [g[0] for g in store.channel.trace_gaps("p")] == [5]
    assert store.heartbeat.prune(T0 + 2 * DAY) == 2  # a's two old ones; b's only report stays
    with store.engine.begin() as tx:
        kept = sorted(tx.execute(select(schema.detector_heartbeat.c.query_name, schema.detector_heartbeat.c.at_ms)))
    assert kept == [("a", T0 + 5 * DAY), ("b", T0)]


def _history(store: Store) -> list[dict[str, Any]]:
    with store.engine.begin() as tx:
        return [dict(r._mapping) for r in tx.execute(select(schema.verdict_history))]
