"""Judging the detector from its heartbeat and its driver: a numbered table of cases, each with its reason."""

from __future__ import annotations

import pytest

from khipu.alerting.decide import detector_alert
from khipu.alerting.model import AlertState
from khipu.detector.supervise import (
    DetectorObservation,
    DetectorState,
    SupervisionConfig,
    SupervisionConfigError,
    judge_detector,
)

CONFIG = SupervisionConfig(stale_after_ms=120_000, startup_grace_ms=300_000)
NOW = 10_000_000
S = 1000

# (case, observation, state, reason fragment, why the answer is right)
CASES = [
    (1, DetectorObservation(None, False), DetectorState.NEVER_RAN, "no heartbeat has ever been stored",
     "nothing ever reported, nothing runs, nothing was submitted: start it"),
    (2, DetectorObservation(NOW - 5 * S, True, NOW - 600 * S), DetectorState.HEALTHY, "last heartbeat 5s ago",
     "a fresh heartbeat from a running driver"),
    (3, DetectorObservation(NOW - 120 * S, True, NOW - 600 * S), DetectorState.HEALTHY, "120s ago",
     "exactly at the limit is not yet stale"),
    (4, DetectorObservation(NOW - 121 * S, True, NOW - 600 * S), DetectorState.HUNG, "stale after 120s",
     "the driver runs but has been silent too long: hung (a SIGSTOPped driver looks like this)"),
    (5, DetectorObservation(NOW - 5 * S, False, NOW - 600 * S), DetectorState.DOWN, "its driver is gone",
     "a fresh heartbeat does not help a driver that has exited: it just died"),
    (6, DetectorObservation(NOW - 900 * S, False), DetectorState.DOWN, "last heartbeat 900s ago",
     "it ran once and nothing runs now"),
    (7, DetectorObservation(None, True, NOW - 30 * S), DetectorState.STARTING, "submitted 30s ago",
     "a fresh submission gets its startup grace before it must report"),
    (8, DetectorObservation(NOW - 900 * S, True, NOW - 30 * S), DetectorState.STARTING, "no heartbeat yet",
     "the old heartbeat predates this submission: the new driver is still starting"),
    (9, DetectorObservation(None, True, NOW - 301 * S), DetectorState.HUNG, "never reported",
     "past the startup grace without a single heartbeat: hung at start"),
    (10, DetectorObservation(NOW - 900 * S, None, NOW - 3600 * S), DetectorState.HUNG, "runs elsewhere",
     "on a cluster only the heartbeat can be seen: silent means hung"),
    (11, DetectorObservation(None, None, NOW - 60 * S), DetectorState.STARTING, "submitted 60s ago",
     "a cluster submission also gets its startup grace"),
    (12, DetectorObservation(NOW - 10 * S, None, NOW - 3600 * S), DetectorState.HEALTHY, "10s ago",
     "a cluster driver that reports is healthy"),
    (13, DetectorObservation(None, False, NOW - 60 * S), DetectorState.DOWN, "its driver is gone",
     "submitted, then died at start before a single heartbeat: that is down (and alerts), not never-ran"),
    (14, DetectorObservation(NOW + 3 * S, True, NOW - 600 * S), DetectorState.HEALTHY, "last heartbeat 0s ago",
     "a heartbeat stamped 3 s ahead of this clock (the driver's host runs ahead, or this clock was set back): "
     "fresh, and its age is 0 s, never a negative one"),
    (15, DetectorObservation(None, True, NOW + 2 * S), DetectorState.STARTING, "submitted 0s ago",
     "a submission stamped after now by a clock ahead of this one: just submitted, never '-2s ago'"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "seen", "state", "reason", "why"), CASES, ids=[f"case-{c[0]}" for c in CASES])
def test_detector_state_table(
    case: int, seen: DetectorObservation, state: DetectorState, reason: str, why: str
) -> None:
    health = judge_detector(seen, NOW, CONFIG)
    assert health.state is state, why
    assert reason in health.reason, (health.reason, why)


def test_only_a_detector_that_ran_and_stopped_working_raises_the_alert_and_healthy_resolves_it() -> None:
    hung = judge_detector(DetectorObservation(NOW - 300 * S, True, NOW - 3600 * S), NOW, CONFIG)
    fired = detector_alert(hung, firing=False, now_ms=NOW)
    assert fired is not None and fired.state is AlertState.FIRING and fired.kind == "detector_down"
    assert fired.title.startswith("detector hung: last heartbeat 300s ago")
    assert detector_alert(hung, firing=True, now_ms=NOW + 120 * S) is None  # once, not every check
    starting = judge_detector(DetectorObservation(None, True, NOW - 10 * S), NOW, CONFIG)
    assert detector_alert(starting, firing=True, now_ms=NOW) is None  # restarted, not yet healthy: still firing
    never = judge_detector(DetectorObservation(None, False), NOW, CONFIG)
    assert detector_alert(never, firing=False, now_ms=NOW) is None  # a new stack is not an incident
    died_at_start = judge_detector(DetectorObservation(None, False, NOW - 60 * S), NOW, CONFIG)
    assert detector_alert(died_at_start, firing=False, now_ms=NOW) is not None
    healthy = judge_detector(DetectorObservation(NOW - 2 * S, True, NOW - 60 * S), NOW, CONFIG)
    resolved = detector_alert(healthy, firing=True, now_ms=NOW)
    assert resolved is not None and resolved.state is AlertState.RESOLVED
    assert detector_alert(healthy, firing=False, now_ms=NOW) is None


def test_settings_come_from_the_environment_and_bad_ones_name_the_variable() -> None:
    config = SupervisionConfig.from_env({"KHIPU_DETECTOR_STALE_AFTER_S": "30", "KHIPU_DETECTOR_STARTUP_GRACE_S": "90"})
    assert (config.stale_after_ms, config.startup_grace_ms) == (30_000, 90_000)
    with pytest.raises(SupervisionConfigError, match="KHIPU_DETECTOR_STALE_AFTER_S"):
        SupervisionConfig.from_env({"KHIPU_DETECTOR_STALE_AFTER_S": "soon"})
    with pytest.raises(SupervisionConfigError, match="stale_after_ms"):
        SupervisionConfig(stale_after_ms=10)
