"""A partition's history becomes its health: status with evidence, lag, time lag, expiry, windows."""

from __future__ import annotations

from khipu.health.evaluate import HealthConfig, at_expiry_risk, evaluate_history, time_lag_ms
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
    assert health.time_lag_ms == 1


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


def test_time_lag_and_expiry_helpers() -> None:
    assert time_lag_ms(0, None, 10) == 0
    assert time_lag_ms(5, None, 10) is None  # backlog start unknown
    assert time_lag_ms(5, 4, 10) == 6
    assert not at_expiry_risk(10 * M, -1, M)  # unlimited retention
    assert at_expiry_risk(50 * M, 60 * M, 10 * M) and not at_expiry_risk(49 * M, 60 * M, 10 * M)
