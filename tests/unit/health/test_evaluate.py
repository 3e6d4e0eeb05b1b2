"""A partition's history becomes its health: status with evidence, lag, time lag, expiry, windows."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from khipu.health.evaluate import HealthConfig, TimeLag, at_expiry_risk, evaluate_history, time_lag
from khipu.health.rules import PartitionStatus
from khipu.health.windows import WindowKind
from khipu.offsets.model import PartitionSnapshot

M = 60_000
CONFIG = HealthConfig(window_size=5, min_window=3, min_stop_ms=2 * M)


def snap(minute: int, committed: int, log_end: int, state: str | None = "STABLE", **extra: int) -> PartitionSnapshot:
    return PartitionSnapshot(
        minute * M,
        "local",
        "sink",
        "orders",
        0,
        committed,
        extra.get("log_start", 0),
        log_end,
        state,
        extra.get("retention_ms"),
    )


def test_a_live_member_that_stops_moving_stalls_then_stops_once_it_leaves_the_group() -> None:
    history = [snap(m, 100, 100 + 10 * m) for m in range(6)]  # member present, offset stuck, log end grows
    stalled = evaluate_history(history, 5 * M + 1, CONFIG, backlog_started_ms=0)
    assert stalled.status is PartitionStatus.STALL
    assert stalled.lag == 50 and stalled.time_lag_ms == 5 * M + 1

    gone = history + [snap(m, 100, 100 + 10 * m, state="EMPTY") for m in range(6, 12)]  # the member left at minute 6
    stopped = evaluate_history(gone, 11 * M + 1, CONFIG, backlog_started_ms=0)
    assert stopped.status is PartitionStatus.STOP
    assert stopped.evidence["fired"][0] == "STOP"
    assert stopped.evidence["window"][-1] == [100, 5 * M, 50]  # the last live observation


def test_a_healthy_consumer_is_ok_and_the_evidence_shows_its_window() -> None:
    history = [snap(m, 10 * m, 10 * m + 2) for m in range(6)]
    health = evaluate_history(history, 5 * M + 1, CONFIG, backlog_started_ms=5 * M)
    assert health.status is PartitionStatus.OK
    assert len(health.evidence["window"]) == 5  # window_size entries


def test_a_consumer_keeping_up_with_a_small_lag_has_no_time_lag_of_zero() -> None:
    """Issue 38's "lag 3, time lag 0 s": the group keeps up, so the log end first passed its committed offset at the
    newest snapshot (as the store's backlog_started_ms answers), and the age came out as 0 although 3 records wait.
    They were written after the previous snapshot (its log end, 50, was below the committed 51): their age is not
    known, only that it is under a minute."""
    history = [snap(m, 10 * m + 1, 10 * m + 4) for m in range(6)]  # committed 51, log end 54 at minute 5
    health = evaluate_history(history, 5 * M, CONFIG, backlog_started_ms=5 * M)
    assert health.lag == 3
    assert health.time_lag_ms is None and health.evidence["time_lag_under_ms"] == M


def test_old_unconsumed_data_near_retention_is_an_expiry_risk() -> None:
    history = [snap(m, 100, 100 + m, retention_ms=60 * M) for m in range(6)]
    health = evaluate_history(history, 55 * M, CONFIG, backlog_started_ms=0)
    assert health.status is PartitionStatus.EXPIRY_RISK  # 55 min old, retention 60 min, margin 10 min
    assert "retention" in health.reason


def test_data_already_aged_out_is_an_expiry_risk_with_an_expired_window() -> None:
    history = [snap(0, 100, 500, log_start=0), snap(1, 100, 600, log_start=300)]
    health = evaluate_history(history, M + 1, CONFIG)
    assert health.status is PartitionStatus.EXPIRY_RISK
    assert [(w.kind, w.from_offset, w.to_offset) for w in health.windows] == [(WindowKind.EXPIRED, 100, 300)]


def test_a_rewind_between_the_last_two_snapshots_opens_a_window() -> None:
    history = [snap(m, 50 * m, 50 * m + 5) for m in range(5)] + [snap(5, 20, 260)]
    health = evaluate_history(history, 5 * M + 1, CONFIG, backlog_started_ms=0)
    assert health.status is PartitionStatus.REWIND
    assert [(w.kind, w.from_offset, w.to_offset) for w in health.windows] == [(WindowKind.REWIND, 20, 200)]


class LagCase(NamedTuple):
    number: int
    latest: PartitionSnapshot
    previous: PartitionSnapshot | None
    backlog_started_ms: int | None
    expected: TimeLag
    reason: str


# fmt: off
LAG_CASES = [
    LagCase(1, snap(5, 100, 100), snap(4, 90, 100), 0, TimeLag(0),
            "committed offset at the log end: nothing waits, no time lag"),
    LagCase(2, snap(5, 51, 54), snap(4, 41, 50), 5 * M, TimeLag(None, M),
            "the log end was 50 a minute ago, below the committed 51: the 3 waiting records came since, under 1 min"),
    LagCase(3, snap(5, 51, 54), snap(4, 41, 50), None, TimeLag(None, M),
            "the same, whatever the store said of the backlog's start"),
    LagCase(4, snap(5, 100, 140), snap(4, 100, 130), 2 * M, TimeLag(3 * M),
            "the log end passed 100 at minute 2 (the store's answer): at least 3 min old"),
    LagCase(5, snap(5, 100, 140), None, 5 * M, TimeLag(None),
            "the backlog began at the only snapshot there is: nothing says how old it is"),
    LagCase(6, snap(5, 100, 140), snap(4, 100, 130), None, TimeLag(None),
            "the backlog's start is not known: unknown, never 0"),
    LagCase(7, PartitionSnapshot(5 * M, "local", "sink", "orders", 0, None, 0, 140), snap(4, 100, 130), 0,
            TimeLag(None), "no commit: no lag, no time lag"),
]
# fmt: on


@pytest.mark.parametrize("case", LAG_CASES, ids=lambda c: f"case{c.number}")
def test_time_lag_is_the_oldest_unconsumed_records_age_or_says_it_is_not_known(case: LagCase) -> None:
    assert time_lag(case.latest, case.previous, case.backlog_started_ms, 5 * M) == case.expected, case.reason


def test_a_check_whose_clock_is_behind_the_snapshots_never_has_a_negative_time_lag() -> None:
    """The snapshots are stamped by the snapshot task's host, ``now_ms`` by the host that judges them: a clock set
    back, or two hosts' clocks apart, puts now before them. The time since is 0 then (khipu.clock.elapsed_ms), never
    negative: a negative age would read as "caught up" and never near retention."""
    backlog = snap(5, 100, 140), snap(4, 100, 130)  # rule 4: the backlog started at minute 4.5, before minute 5
    assert time_lag(*backlog, 4 * M + 30_000, now_ms=4 * M) == TimeLag(0)
    written_since = snap(5, 51, 54), snap(4, 41, 50)  # rule 3: under the time since the previous snapshot
    assert time_lag(*written_since, None, now_ms=3 * M) == TimeLag(None, 0)


def test_expiry_helper() -> None:
    assert not at_expiry_risk(10 * M, -1, M)  # unlimited retention
    assert at_expiry_risk(50 * M, 60 * M, 10 * M) and not at_expiry_risk(49 * M, 60 * M, 10 * M)
