"""Burrow's evaluation rules as a numbered table of cases, each with the reason its answer is right.

Window entries are (committed offset, minute, lag); snapshots one minute apart. Recent log-end
offsets are newest first. min_window=2, min_stop_ms=90 s throughout.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest

from khipu.health.rules import OffsetObservation, PartitionStatus, evaluate_partition, group_status

M = 60_000  # one minute in ms
OK, WARN, REWIND, STALL, STOP = (
    PartitionStatus.OK,
    PartitionStatus.WARN,
    PartitionStatus.REWIND,
    PartitionStatus.STALL,
    PartitionStatus.STOP,
)


def window(*entries: tuple[int, int, int | None]) -> list[OffsetObservation]:
    return [OffsetObservation(offset, minute * M, lag) for offset, minute, lag in entries]


class Case(NamedTuple):
    number: int
    window: list[OffsetObservation]
    recent_log_ends: list[int]
    current_lag: int
    now_ms: int
    expected: PartitionStatus
    fired: tuple[PartitionStatus, ...]
    reason: str


# fmt: off
FALLING_BEHIND = window((10, 0, 40), (20, 1, 50), (30, 2, 60))  # log ends 50, 70, 90

CASES = [
    Case(1, window((10, 0, 5), (20, 1, 4), (30, 2, 3)), [33, 24, 15], 3, 2 * M + 1, OK, (),
         "offset moving, lag decreasing, last commit 1 ms ago: healthy"),
    Case(2, window((10, 0, 5), (10, 1, 6), (10, 2, 7)), [17, 16, 15], 0, 2 * M + 1, OK, (),
         "current lag zero: never an error, whatever the window says"),
    Case(3, window((10, 0, 0), (10, 1, 2), (10, 2, 4)), [14, 12, 10], 4, 2 * M + 1, OK, (),
         "lag was zero inside the window: the movement rules are skipped"),
    Case(4, window((10, 0, 3), (10, 1, 5), (10, 2, 7)), [17, 15, 13], 7, 2 * M + 1, STALL, (STALL, WARN),
         "offset stuck at 10, lag growing, group live: stalled; the lag warning fires too, STALL is worse"),
    Case(5, FALLING_BEHIND, [90, 70, 50], 60, 2 * M + 1, WARN, (WARN,),
         "offset moving, lag 40 -> 50 -> 60 never decreases, and 30 is short of every recent log end: behind"),
    Case(6, window((10, 0, 5), (20, 1, 6), (30, 2, 8)), [38, 26, 15], 8, 2 * M + 1, OK, (),
         "lag creeps 5 -> 6 -> 8 but committed 30 is past the log end of a minute ago (26): keeping up"),
    Case(7, window((10, 0, 5), (20, 1, 6), (25, 2, 4)), [29, 26, 15], 4, 2 * M + 1, OK, (),
         "lag went down in the last interval: catching up, no warning"),
    Case(8, window((30, 0, 5), (20, 1, 20), (25, 2, 18)), [43, 40, 35], 18, 2 * M + 1, REWIND, (REWIND,),
         "committed offset went from 30 back to 20: a rewind; lag 20 -> 18 decreased, so no warning"),
    Case(9, window((30, 0, 5), (20, 1, 20), (20, 2, 25)), [45, 40, 35], 25, 2 * M + 1, REWIND, (REWIND, WARN),
         "rewind then lag growing: both fire, REWIND is the worse"),
    Case(10, FALLING_BEHIND, [120, 110, 100], 90, 7 * M, STOP, (STOP, WARN),
         "last commit 5 min ago, window spans 2 min, log end ran on past it: stopped; STOP outranks WARN"),
    Case(11, window((10, 0, 5), (20, 1, 6), (30, 2, 8)), [50, 46, 42, 38, 26, 15], 20, 5 * M + 1, OK, (),
         "silent 3 min (> the 2 min span) but 30 reached a log end of the last minutes (26): not STOP yet"),
    Case(12, window((10, 0, 0), (20, 1, 2), (30, 2, 8)), [38, 32, 31], 8, 7 * M, STOP, (STOP,),
         "STOP is judged before the zero-lag exception: a consumer that was fine, then vanished"),
    Case(13, FALLING_BEHIND, [90, 70, 50], 60, 4 * M, WARN, (WARN,),
         "2 min of silence does not exceed the 2 min span: not stopped, only the warning"),
    Case(14, window((10, 0, 5)), [15], 5, 1000, OK, (),
         "one observation cannot show movement, and 1 s of silence is below min_stop_ms"),
    Case(15, window((10, 0, 5)), [15], 5, 3 * M, STOP, (STOP,),
         "one observation three minutes old: silent for longer than min_stop_ms"),
    Case(16, window((10, 0, None), (20, 1, None), (30, 2, None)), [40], 10, 2 * M + 1, OK, (),
         "lags unknown and offsets moving: no rule has evidence to fire"),
    Case(17, window((10, 0, 5), (10, 1, None), (10, 2, 9)), [19], 9, 2 * M + 1, STALL, (STALL, WARN),
         "offset stuck; the unknown lag is skipped and 5 -> 9 did not decrease"),
    Case(18, [], [20], 10, 5 * M, OK, (),
         "no observations while the group was live: nothing to judge"),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=[f"case{c.number}" for c in CASES])
def test_partition_status_rule_table(case: Case) -> None:
    evaluation = evaluate_partition(
        case.window, case.recent_log_ends, case.current_lag, case.now_ms, min_window=2, min_stop_ms=90_000
    )
    assert (evaluation.status, evaluation.fired) == (case.expected, case.fired), case.reason


def test_statuses_are_ordered_by_severity() -> None:
    assert OK < WARN < REWIND < STALL < STOP < PartitionStatus.EXPIRY_RISK


def test_group_is_as_healthy_as_its_worst_partition() -> None:
    assert group_status([OK, STALL, WARN]) is STALL
    assert group_status([]) is OK


def test_the_evaluation_says_why() -> None:
    case = CASES[3]  # case 4: the stall
    evaluation = evaluate_partition(case.window, case.recent_log_ends, case.current_lag, case.now_ms)
    assert "did not move" in evaluation.reason
