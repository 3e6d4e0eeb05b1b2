"""Retention limits and cutoffs: a numbered table of cases, each with why its answer is right."""

from __future__ import annotations

from dataclasses import replace

import pytest

from khipu.retention.policy import (
    REMOVABLE_VERDICTS,
    UNSETTLED_VERDICTS,
    RetentionError,
    RetentionPolicy,
    disk_low,
    plan_retention,
    reconciliation_reach_hours,
)
from khipu.trace.archive import HOUR_MS
from khipu.verdicts.model import VerdictKind

HORIZON = 2 * HOUR_MS
NOW = 1_764_000_000_000 + 25 * 60_000  # 25 minutes into an hour
HOUR = NOW // HOUR_MS * HOUR_MS

# (case, policy changes, horizon, refused setting or None, why)
CHECKS = [
    (1, {}, HORIZON, None, "the defaults keep a week of traces: far more than 5 h reach + 72 h backfill"),
    (2, {"trace_archive_hours": 78, "backfill_hours": 72}, HORIZON, None, "78 = 6 h reach (2 x 2 h + 1 h, +1) + 72"),
    (3, {"trace_archive_hours": 77, "backfill_hours": 72}, HORIZON, "trace_archive_hours", "one hour short of 78"),
    (
        4,
        {"trace_archive_hours": 4, "backfill_hours": 1, "verdict_days": 1, "verdict_archive_hours": 4},
        60_000,
        None,
        "a 1 min horizon reaches 3 h back (2 min + 1 h rounded up, +1): 3 + 1 backfill hour",
    ),
    (5, {"verdict_archive_hours": 100}, HORIZON, "verdict_archive_hours", "shorter than the 168 trace-archive hours"),
    (6, {"verdict_days": 6}, HORIZON, "verdict_days", "6 days is less than the trace archive's 7"),
    (7, {"trace_archive_hours": 200, "minute_metrics_days": 9}, 10 * HOUR_MS, None,
     "a 10 h horizon reaches 22 h: 22 + 72 <= 200"),
    (9, {"trace_archive_hours": 200}, HORIZON, "minute_metrics_days",
     "7 days of minutes < 200 h: a re-decided window's changes would land in rolled hours"),
    (10, {"metrics_days": 6, "minute_metrics_days": 6}, HORIZON, "minute_metrics_days",
     "6 days of minutes < the 7 days of traces"),
    (8, {"trace_archive_hours": 93}, 10 * HOUR_MS, "trace_archive_hours", "22 + 72 = 94 > 93"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "changes", "horizon", "refused", "why"), CHECKS, ids=[f"case{c[0]}" for c in CHECKS])
def test_limits_that_would_remove_what_reconciliation_needs_are_refused(
    case: int, changes: dict[str, int], horizon: int, refused: str | None, why: str
) -> None:
    policy = replace(RetentionPolicy(), **changes)
    if refused is None:
        plan_retention(policy, NOW, horizon)
        return
    with pytest.raises(RetentionError) as caught:
        plan_retention(policy, NOW, horizon)
    assert caught.value.setting == refused, why
    assert f"got {getattr(policy, refused)!r}" in str(caught.value)


# (case, field, value, why)
BAD_VALUES = [
    (1, "trace_archive_hours", 0, "nothing kept at all"),
    (2, "verdict_days", -3, "a negative age"),
    (3, "heartbeat_days", 1.5, "ages are whole units"),
    (4, "quarantine_days", True, "a flag is not a number of days"),
    (5, "disk_free_min_percent", 100.0, "an alert that always fires"),
    (6, "minute_metrics_days", 500, "minutes kept longer than the hours they roll into (400 days)"),
]


@pytest.mark.parametrize(("case", "name", "value", "why"), BAD_VALUES, ids=[f"case{c[0]}" for c in BAD_VALUES])
def test_a_bad_value_names_the_setting_and_what_is_expected(case: int, name: str, value: object, why: str) -> None:
    with pytest.raises(RetentionError) as caught:
        RetentionPolicy(**{name: value})  # type: ignore[arg-type]
    assert caught.value.setting == name, why
    assert "expected" in str(caught.value)


def test_cutoffs_fall_on_hour_starts_at_each_kinds_age() -> None:
    policy = RetentionPolicy(trace_archive_hours=100, verdict_archive_hours=200, verdict_days=10, quarantine_days=3,
                             heartbeat_days=2, minute_metrics_days=5, metrics_days=30)  # fmt: skip
    plan = plan_retention(policy, NOW, HORIZON)
    assert plan.cutoffs() == {
        "trace_archive": HOUR - 100 * HOUR_MS,
        "verdict_archive": HOUR - 200 * HOUR_MS,
        "verdicts": HOUR - 240 * HOUR_MS,
        "quarantine": HOUR - 72 * HOUR_MS,
        "heartbeats": HOUR - 48 * HOUR_MS,
        "minutes": HOUR - 120 * HOUR_MS,
        "metrics": HOUR - 720 * HOUR_MS,
    }
    assert all(at % HOUR_MS == 0 for at in plan.cutoffs().values())


def test_reach_covers_the_hourly_runs_oldest_read() -> None:
    # the hourly run at `now` reconciles [hour - H - 1h, hour - H) and reads from one horizon before its start
    for horizon in (60_000, HOUR_MS, 2 * HOUR_MS, 90 * 60_000):
        oldest_read = (NOW // HOUR_MS * HOUR_MS - horizon - HOUR_MS - horizon) // HOUR_MS * HOUR_MS
        assert NOW // HOUR_MS * HOUR_MS - reconciliation_reach_hours(horizon) * HOUR_MS <= oldest_read


def test_only_receipts_and_final_verdicts_may_go() -> None:
    assert {VerdictKind.LOST, VerdictKind.PENDING} == UNSETTLED_VERDICTS
    assert VerdictKind.CONFIRMED_LOST in REMOVABLE_VERDICTS  # a pending resend pins its own, by message


def test_disk_low_below_the_threshold() -> None:
    policy = RetentionPolicy(disk_free_min_percent=10.0)
    assert disk_low(9, 100, policy) and not disk_low(10, 100, policy) and not disk_low(0, 0, policy)
