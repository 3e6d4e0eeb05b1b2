"""The detector's trail against the trace topic's retention: numbered tables of cases, each with why its answer is
right (khipu.alerting.trail's rules, its alert's transitions, and the skip alert)."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from khipu.alerting.model import Alert, AlertState, Severity
from khipu.alerting.trail import (
    SKIP_ALERT_KIND,
    TRAIL_ALERT_KIND,
    TrailStatus,
    judge_partition,
    judge_trail,
    skip_alert,
    trail_alert,
    trail_margin_ms,
)
from khipu.kafka.admin import TopicRetention
from khipu.store.heartbeat import PartitionTrail, TraceSkip

NOW = 100_000_000
S = 1_000
MIN = 60 * S
FLOOR = 60 * S  # KHIPU_EXPIRY_MARGIN_S, as a test sets it
TEN_MIN = TopicRetention(10 * MIN, -1)  # margin: max(5 min, 1 min) = 5 min
UNLIMITED = TopicRetention(-1, -1)
COMPACTED = TopicRetention(10 * MIN, -1, frozenset({"compact"}))
BY_SIZE = TopicRetention(-1, 1_000_000)
BOTH = TopicRetention(10 * MIN, 1_000_000)
ONE_MIN = TopicRetention(1 * MIN, -1)  # margin: max(30 s, 1 min) = 1 min: the whole retention


def behind(read_end: int, log_start: int, log_end: int, age_ms: int | None) -> PartitionTrail:
    """Partition 0 read to ``read_end``; its oldest record not read yet appended ``age_ms`` ago (None: not known)."""
    waiting = max(read_end, log_start)
    if age_ms is None or waiting >= log_end:
        return PartitionTrail(0, read_end, 4, log_start, log_end, NOW)
    return PartitionTrail(0, read_end, 4, log_start, log_end, NOW, waiting, NOW - age_ms)


class Case(NamedTuple):
    number: int
    trail: PartitionTrail
    retention: TopicRetention | None
    expected: TrailStatus
    reason: str


OK, BYTES, MS, REMOVED = (TrailStatus.OK, TrailStatus.RETENTION_BYTES_NEAR, TrailStatus.RETENTION_MS_NEAR,
                          TrailStatus.REMOVED)  # fmt: skip
# fmt: off
CASES = [
    Case(1, behind(300, 0, 300, None), TEN_MIN, OK, "read to the log end: nothing for retention to take"),
    Case(2, behind(200, 0, 300, 4 * MIN + 59 * S), TEN_MIN, OK,
         "the oldest record not read is 4 min 59 s old: more than the 5 min margin left of 10 min"),
    Case(3, behind(200, 0, 300, 5 * MIN), TEN_MIN, MS,
         "5 min old of 10: within the margin (half the retention); nothing of it is removed before 10 min"),
    Case(4, behind(200, 0, 300, 9 * MIN + 59 * S), TEN_MIN, MS, "a second from its retention: still only near"),
    Case(5, behind(200, 250, 300, 1 * S), TEN_MIN, REMOVED,
         "the log starts at 250: offsets 200..249 were removed before it read them, however young the rest"),
    Case(6, behind(200, 0, 300, 9 * MIN), UNLIMITED, OK, "unlimited retention removes nothing: no age is near it"),
    Case(7, behind(200, 0, 300, 9 * MIN), COMPACTED, OK,
         "cleanup.policy compact only: retention.ms removes nothing by age"),
    Case(8, behind(200, 250, 300, None), COMPACTED, REMOVED,
         "whatever removed them (compaction, DeleteRecords), offsets not read are gone: rule 1 holds for every topic"),
    Case(9, behind(200, 0, 300, None), TEN_MIN, OK,
         "the oldest record's time not known (the broker did not answer): its age is not claimed"),
    Case(10, behind(200, 100, 300, None), BY_SIZE, BYTES,
         "retention.bytes, the log start past 0 (the log reached its limit) and 100 of the 200 offsets kept not read"),
    Case(11, behind(250, 100, 300, None), BY_SIZE, OK, "only 50 of the 200 kept not read: far from the oldest"),
    Case(12, behind(0, 0, 300, None), BY_SIZE, OK,
         "nothing removed yet: the log has not reached retention.bytes, and none of it goes before it does"),
    Case(13, behind(200, 100, 300, None), UNLIMITED, OK, "no retention.bytes: the share not read is no risk"),
    Case(14, behind(200, 100, 300, 6 * MIN), BOTH, MS, "near both limits: retention.ms near is the worse"),
    Case(15, behind(200, 0, 300, 0), ONE_MIN, MS,
         "retention (1 min) no longer than the floor (1 min): a record waiting is at risk as soon as it is written"),
    Case(16, behind(200, 0, 300, 9 * MIN), None, OK, "the topic's retention not known: only removals are judged"),
    Case(17, behind(200, 300, 300, None), None, REMOVED, "not knowing the retention never hides a removal"),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=[f"case{c.number}" for c in CASES])
def test_trail_rules_table(case: Case) -> None:
    margin = trail_margin_ms(case.retention.retention_ms or 0, FLOOR) if case.retention is not None else 0
    assert judge_partition(case.trail, case.retention, margin, NOW) is case.expected, case.reason
    judged = judge_trail([case.trail], case.retention, FLOOR, NOW)  # the same through the whole topic's judgement
    assert judged.status is case.expected, case.reason


def test_the_margin_is_half_the_retention_or_the_floor_whichever_is_larger() -> None:
    assert trail_margin_ms(7 * 24 * 60 * MIN, 10 * MIN) == 7 * 12 * 60 * MIN  # 3.5 days of a 7-day topic
    assert trail_margin_ms(10 * MIN, 10 * MIN) == 10 * MIN  # 5 min would leave too little: the floor
    assert trail_margin_ms(30 * MIN, 10 * MIN) == 15 * MIN


def test_the_topics_judgement_is_its_worst_partition_and_lists_those_at_risk_worst_first() -> None:
    trails = [
        PartitionTrail(0, 300, 4, 0, 300, NOW),  # caught up
        PartitionTrail(1, 200, 4, 0, 300, NOW, 200, NOW - 6 * MIN),  # near retention.ms
        PartitionTrail(2, 100, 4, 150, 300, NOW, 150, NOW - 9 * MIN),  # 50 removed unread
    ]
    judged = judge_trail(trails, TEN_MIN, FLOOR, NOW)
    assert judged.status is REMOVED
    assert [(r.trail.partition, r.status) for r in judged.at_risk] == [(2, REMOVED), (1, MS)]
    assert judged.margin_ms == 5 * MIN
    assert judged.figures is not None and (judged.figures.records_behind, judged.figures.removed_unread) == (300, 50)


def firing_alert(status: TrailStatus, since_ms: int = NOW - 10 * MIN) -> Alert:
    return Alert("k", "detector q trailing traces", TRAIL_ALERT_KIND, AlertState.FIRING, Severity.CRITICAL, "t",
                 since_ms, {"status": status.name})  # fmt: skip


class Transition(NamedTuple):
    number: int
    firing: TrailStatus | None  # what the subject's firing alert said (None: none fires)
    now: TrailStatus
    expected: AlertState | None
    reason: str


NOW_TRAILS = {
    OK: [behind(300, 0, 300, None)],
    MS: [behind(200, 0, 300, 6 * MIN)],
    REMOVED: [behind(200, 250, 300, 6 * MIN)],
}
# fmt: off
TRANSITIONS = [
    Transition(1, None, MS, AlertState.FIRING, "at risk, nothing firing: fire"),
    Transition(2, MS, MS, None, "still near, already firing: one alert per transition, not one per check"),
    Transition(3, MS, REMOVED, AlertState.FIRING,
               "records removed while it fired for retention near: worse news, an update of the same subject"),
    Transition(4, REMOVED, MS, None, "removed before, near now: not well again, and no news"),
    Transition(5, MS, OK, AlertState.RESOLVED, "no partition at risk: resolve"),
    Transition(6, REMOVED, OK, AlertState.RESOLVED, "caught up after a removal: resolve (the skip alert told it)"),
    Transition(7, None, OK, None, "well and nothing firing: quiet"),
    Transition(8, None, REMOVED, AlertState.FIRING, "removed with nothing firing (a check missed the risk): fire"),
]
# fmt: on


@pytest.mark.parametrize("case", TRANSITIONS, ids=[f"case{c.number}" for c in TRANSITIONS])
def test_trail_alert_transitions(case: Transition) -> None:
    judged = judge_trail(NOW_TRAILS[case.now], TEN_MIN, FLOOR, NOW)
    assert judged.status is case.now
    firing = None if case.firing is None else firing_alert(case.firing)
    alert = trail_alert("q", "traces", judged, firing, NOW)
    assert (alert.state if alert else None) == case.expected, case.reason
    if alert is not None:
        assert (alert.kind, alert.subject, alert.details["status"]) == (
            TRAIL_ALERT_KIND,
            "detector q trailing traces",
            case.now.name,
        )
        if alert.state is AlertState.FIRING:
            assert alert.title.startswith("updated: ") == (firing is not None)
            assert alert.details["firing_since_ms"] == (NOW if firing is None else firing.at_ms)


def test_the_firing_alert_names_each_partition_at_risk_with_its_figures_and_the_retention() -> None:
    trails = [PartitionTrail(3, 200, 4, 0, 300, NOW, 200, NOW - 6 * MIN), PartitionTrail(5, 290, 4, 0, 300, NOW)]
    alert = trail_alert("q", "traces", judge_trail(trails, TEN_MIN, FLOOR, NOW), None, NOW)
    assert alert is not None
    assert "partition 3 100 of the 300 offsets it keeps not read, the oldest 6.0 min old" in alert.title
    assert "retention.ms 10.0 min (alert margin 5.0 min)" in alert.title
    assert "partition 5" not in alert.title  # 10 behind, a second old: not at risk
    (named,) = alert.details["partitions"]
    assert (named["partition"], named["unread"], named["oldest_unread_age_ms"]) == (3, 100, 6 * MIN)
    assert (alert.details["records_behind"], alert.details["margin_ms"]) == (110, 5 * MIN)


def test_the_removal_alert_names_the_partitions_and_how_many_offsets_went_unread() -> None:
    trails = [PartitionTrail(0, 200, 4, 250, 300, NOW, 250, NOW - S), PartitionTrail(1, 90, 4, 100, 100, NOW)]
    alert = trail_alert("q", "traces", judge_trail(trails, TEN_MIN, FLOOR, NOW), firing_alert(MS), NOW)
    assert alert is not None and alert.state is AlertState.FIRING
    assert alert.title.startswith("updated: the broker removed 60 offsets of trace topic traces")
    assert "partition 0 offsets 200..249 (50)" in alert.title and "partition 1 offsets 90..99 (10)" in alert.title


def test_the_skip_alert_names_each_partition_and_the_offsets_skipped() -> None:
    skips = [TraceSkip(0, 200, 250, 11, NOW - S), TraceSkip(2, 40, 43, 11, NOW - S)]
    alert = skip_alert("q", "traces", skips, NOW)
    assert alert is not None
    assert (alert.kind, alert.state, alert.severity) == (SKIP_ALERT_KIND, AlertState.FIRING, Severity.CRITICAL)
    assert "skipped 53 offsets of trace topic traces" in alert.title
    assert "partition 0 offsets 200..249 (50), partition 2 offsets 40..42 (3)" in alert.title
    assert [(p["partition"], p["skipped"]) for p in alert.details["partitions"]] == [(0, 50), (2, 3)]
    again = skip_alert("q", "traces", skips, NOW + MIN)
    assert again is not None and again.key == alert.key  # a check run again after a failure: the same alert
    other = skip_alert("q", "traces", [TraceSkip(0, 200, 260, 12, NOW)], NOW)
    assert other is not None and other.key != alert.key
    assert skip_alert("q", "traces", [], NOW) is None
