"""The reconciliation window: what it reads, when the archive can answer for it, and judging with all traces."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from khipu.detector.decide import Lookups
from khipu.detector.model import DetectorConfig
from khipu.reconcile.window import (
    HOUR_MS,
    ArchiveCoverage,
    ReconcileError,
    ReconcileWindow,
    coverage_problems,
    horizon_from_env,
    hourly_window,
    rejudge,
)
from khipu.verdicts.model import VerdictKind
from tests.unit.detector.test_decide import PAST, STREAM, clean

H10 = int(datetime(2026, 11, 21, 10, tzinfo=UTC).timestamp() * 1000)


def test_the_hourly_run_reconciles_the_hour_whose_horizon_just_passed() -> None:
    window = hourly_window(H10, H10 + HOUR_MS, 2 * HOUR_MS)
    assert (window.start_ms, window.end_ms, window.read_to_ms) == (H10 - 2 * HOUR_MS, H10 - HOUR_MS, H10 + HOUR_MS)
    assert window.hours() == ["2026-11-21-08", "2026-11-21-09", "2026-11-21-10"]
    by_hand = hourly_window(H10 + HOUR_MS, H10 + HOUR_MS, 2 * HOUR_MS)  # a manual run: empty interval at 11:00
    assert (by_hand.start_ms, by_hand.end_ms) == (window.start_ms, window.end_ms)  # the hour that ends there


def test_an_empty_or_inverted_window_is_refused_naming_both_ends() -> None:
    with pytest.raises(ReconcileError, match=r"end.*2026-11-21T10:00:00Z.*after the start \(2026-11-21T10:00:00Z\)"):
        ReconcileWindow(H10, H10)
    with pytest.raises(ReconcileError, match="horizon_ms"):
        ReconcileWindow(H10, H10 + 1, horizon_ms=-1)


def test_the_horizon_setting_is_read_once_and_checked() -> None:
    assert horizon_from_env({}) == 2 * HOUR_MS
    assert horizon_from_env({"KHIPU_RECONCILE_HORIZON_MS": "180000"}) == 180_000
    with pytest.raises(ReconcileError, match=r"KHIPU_RECONCILE_HORIZON_MS.*'3m'"):
        horizon_from_env({"KHIPU_RECONCILE_HORIZON_MS": "3m"})


def test_the_archive_must_cover_the_window_and_say_which_hours_are_missing() -> None:
    window = ReconcileWindow(H10 - 3 * HOUR_MS, H10 - 2 * HOUR_MS, 2 * HOUR_MS)  # reads 07:00 .. 10:00
    now = H10 + HOUR_MS
    assert coverage_problems(window, ArchiveCoverage("2026-11-21-07", H10 + 5_000), now) == []
    late_start = coverage_problems(window, ArchiveCoverage("2026-11-21-09", H10 + 5_000), now)
    assert late_start == [
        "the archive starts at hour 2026-11-21-09; missing hours 2026-11-21-07 .. 2026-11-21-08 (2 h)"
    ]
    behind = coverage_problems(window, ArchiveCoverage("2026-11-21-07", H10 - HOUR_MS - 1), now)
    assert behind and "archived the trace topic up to 2026-11-21T08:59:59.999Z" in behind[0]
    assert "missing hours 2026-11-21-09 .. 2026-11-21-09" in behind[0]
    assert coverage_problems(window, ArchiveCoverage(None, None), now) == [
        "the trace archive is empty: the detector has archived nothing yet"
    ]
    too_recent = coverage_problems(window, ArchiveCoverage("2026-11-21-07", H10), H10 - 60_000)
    assert "horizon has not passed" in too_recent[0]


def test_rejudging_applies_the_detectors_rules_to_all_the_traces_with_the_grace_long_over() -> None:
    def committed(cluster: str, group: str, topic: str, partition: int) -> int | None:
        return PAST.get((group, topic))

    window = ReconcileWindow(0, 60_000, horizon_ms=600_000)
    config = DetectorConfig(grace_ms=30_000, max_wait_ms=300_000)
    verdicts = rejudge("m1", STREAM, clean(skip={"local/out -> s1"}), Lookups(committed), config, window, 10**9)
    by_hop = {v.hop: v for v in verdicts}
    assert {hop: v.kind for hop, v in by_hop.items()} == {
        "p -> local/in": VerdictKind.DELIVERED,
        "local/in -> proc": VerdictKind.DELIVERED,
        "proc -> local/out": VerdictKind.DELIVERED,
        "local/out -> s1": VerdictKind.LOST,
        "local/out -> s2": VerdictKind.DELIVERED,
    }
    assert {v.decided_by for v in verdicts} == {"reconciliation"} and {v.first_seen_ms for v in verdicts} == {1000}


def test_a_message_named_only_by_its_record_gets_trace_lost_where_it_evidently_passed() -> None:
    from khipu.reconcile.run import Lead
    from khipu.reconcile.window import judge_lead

    lead = Lead("s1", "local", "out", 0, 7, seen_ms=5_000, message_id="m9", stream="orders")
    verdicts = judge_lead(lead, "m9", STREAM, 9_000)
    assert {(v.hop, v.kind, v.offset) for v in verdicts} == {
        ("local/out -> s1", VerdictKind.TRACE_LOST, 7),  # s1's emitter points at it: received
        ("proc -> local/out", VerdictKind.TRACE_LOST, 7),  # the record is in out, which only proc writes
    }
    assert all(v.decided_by == "reconciliation" and "trace header names it" in v.detail for v in verdicts)


def test_reconciliation_gives_two_causes_at_one_read_hop_the_cause_the_rule_table_gives() -> None:
    """decide's case 64 re-judged by reconciliation (all the traces, the grace long over): the same rule, so the same
    precedence, a re-read before a retry at the read hop."""
    from tests.unit.detector.test_decide import CASES

    [case] = [c for c in CASES if c.number == 64]

    def committed(cluster: str, group: str, topic: str, partition: int) -> int | None:
        return case.committed.get((group, topic))

    window = ReconcileWindow(0, 60_000, horizon_ms=600_000)
    config = DetectorConfig(grace_ms=30_000, max_wait_ms=300_000)
    verdicts = rejudge("m1", case.stream, case.traces, Lookups(committed), config, window, 10**9)
    assert {v.hop: (v.kind, v.cause, v.count) for v in verdicts} == case.expected
