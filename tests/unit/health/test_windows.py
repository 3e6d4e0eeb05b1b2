"""Offset windows between two snapshots: rewinds, skips and records lost to retention."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from khipu.health.windows import WindowKind, detect_windows, typical_advance
from khipu.offsets.model import PartitionSnapshot


def snap(minute: int, committed: int | None, log_start: int = 0, log_end: int = 10_000) -> PartitionSnapshot:
    return PartitionSnapshot(minute * 60_000, "c", "g", "t", 0, committed, log_start, log_end)


class Case(NamedTuple):
    number: int
    previous: PartitionSnapshot
    current: PartitionSnapshot
    usual_advance: float | None
    expected: list[tuple[WindowKind, int, int]]
    reason: str


CASES = [
    Case(1, snap(0, 100), snap(1, 150), 50, [], "an ordinary advance: no window"),
    Case(2, snap(0, 500), snap(1, 200), 50, [(WindowKind.REWIND, 200, 500)], "went back 300: those are re-read"),
    Case(
        3,
        snap(0, 100),
        snap(1, 5100),
        50,
        [(WindowKind.SKIP, 100, 5100)],
        "5000 records in a minute from a group that moves 50: a skip (and over the 1000 minimum)",
    ),
    Case(4, snap(0, 100), snap(1, 600), 50, [], "10x the usual pace but under the 1000-record minimum: not a skip"),
    Case(5, snap(0, 100), snap(1, 1300), 200, [], "6x a usual advance of 200: under the factor of 10"),
    Case(
        6,
        snap(0, 100),
        snap(1, 2100),
        None,
        [(WindowKind.SKIP, 100, 2100)],
        "never seen moving before: the minimum alone decides",
    ),
    Case(
        7,
        snap(0, 100, log_start=50),
        snap(1, 100, log_start=400),
        0,
        [(WindowKind.EXPIRED, 100, 400)],
        "log start passed the committed offset: 300 records aged out unread",
    ),
    Case(
        8,
        snap(0, 100, log_start=400),
        snap(1, 100, log_start=450),
        0,
        [],
        "already expired at the previous snapshot: reported once, not every minute",
    ),
    Case(9, snap(0, None), snap(1, 100), 50, [], "first commit ever: nothing to compare"),
]


@pytest.mark.parametrize("case", CASES, ids=[f"case{c.number}" for c in CASES])
def test_window_table(case: Case) -> None:
    windows = detect_windows(case.previous, case.current, case.usual_advance, skip_factor=10, skip_min_records=1000)
    assert [(w.kind, w.from_offset, w.to_offset) for w in windows] == case.expected, case.reason
    assert all(w.detected_ms == case.current.snapshot_ms for w in windows)


def test_usual_advance_is_the_median_forward_move() -> None:
    history = [snap(0, 0), snap(1, 10), snap(2, 40), snap(3, 40), snap(4, 50), snap(5, 30)]
    assert typical_advance(history) == 10  # moves 10, 30, 10: median 10; standing still and going back ignored
