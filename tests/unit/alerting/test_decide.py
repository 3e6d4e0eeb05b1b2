"""Alert decisions: one per group transition, resolves when it quiets down, one per offset window."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from khipu.alerting.decide import alerts_for, group_changes
from khipu.health.evaluate import PartitionHealth
from khipu.health.rules import PartitionStatus
from khipu.health.windows import OffsetWindow, WindowKind
from khipu.offsets.model import PartitionKey

OK, WARN, REWIND, STALL, STOP, EXPIRY = (
    PartitionStatus.OK,
    PartitionStatus.WARN,
    PartitionStatus.REWIND,
    PartitionStatus.STALL,
    PartitionStatus.STOP,
    PartitionStatus.EXPIRY_RISK,
)


def key(partition: int, group: str = "sink") -> PartitionKey:
    return PartitionKey("local", group, "orders", partition)


def healths(*statuses: PartitionStatus, group: str = "sink") -> list[PartitionHealth]:
    return [PartitionHealth(key(p, group), s, 60_000, 10 * p, None, s.name) for p, s in enumerate(statuses)]


class Case(NamedTuple):
    number: int
    before: dict[PartitionKey, PartitionStatus]
    now: list[PartitionHealth]
    expected: list[tuple[str, str]]  # (state, title prefix)
    reason: str


# fmt: off
CASES = [
    Case(1, {}, healths(OK, OK, OK), [], "a new healthy group: nothing to say"),
    Case(2, {key(0): OK, key(1): OK, key(2): OK}, healths(STALL, STALL, STALL), [("firing", "STALL: group sink")],
         "three partitions stall together: one alert for the group, not three"),
    Case(3, {key(0): STALL, key(1): STALL, key(2): STALL}, healths(STALL, STALL, STALL), [],
         "still stalled a minute later: no repeat"),
    Case(4, {key(0): STALL, key(1): OK}, healths(STOP, OK), [("firing", "STOP: group sink")],
         "from one alerting status to a worse one: a new alert"),
    Case(5, {key(0): STALL, key(1): OK}, healths(OK, OK), [("resolved", "resolved: group sink on local is OK again")],
         "back to OK: a resolve"),
    Case(6, {key(0): STALL}, healths(WARN), [("resolved", "resolved: group sink on local is WARN again")],
         "down to WARN, which does not alert: the alert resolves"),
    Case(7, {key(0): OK}, healths(WARN), [], "WARN alone never pages"),
    Case(8, {}, healths(EXPIRY), [("firing", "EXPIRY_RISK: group sink")],
         "first sight of a group already at risk of losing data: fire"),
    Case(9, {key(0): OK}, healths(REWIND, OK), [("firing", "REWIND: group sink")], "a rewind pages (warning)"),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=[f"case{c.number}" for c in CASES])
def test_group_alert_table(case: Case) -> None:
    alerts = alerts_for(group_changes(case.before, case.now), [])
    assert [
        (a.state.value, a.title[: len(prefix)]) for a, (_, prefix) in zip(alerts, case.expected, strict=False)
    ] == case.expected, case.reason
    assert len(alerts) == len(case.expected), case.reason


def test_a_group_alert_lists_the_affected_partitions_and_their_lag() -> None:
    [alert] = alerts_for(group_changes({}, healths(STALL, OK, STALL)), [])
    assert alert.title == "STALL: group sink on local: 2 partition(s), orders[0] lag 0, orders[2] lag 20"
    assert [p["status"] for p in alert.details["partitions"]] == ["STALL", "OK", "STALL"]
    assert alert.key == "group:local/sink:STALL:60000"


def test_each_offset_window_fires_once_with_its_range() -> None:
    window = OffsetWindow(key(1), WindowKind.SKIP, 100, 5100, 120_000, 100, 5100)
    [alert] = alerts_for([], [window])
    assert (alert.kind, alert.severity.value, alert.details["from_offset"], alert.details["to_offset"]) == (
        "offset_window",
        "critical",
        100,
        5100,
    )
    assert "5000 records" in alert.title
