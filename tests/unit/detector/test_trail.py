"""How far the detector trails the trace topic, and what a batch skipped: numbered tables of cases with reasons."""

from __future__ import annotations

from typing import NamedTuple

import pyarrow as pa
import pytest

from khipu.detector.packed import RECORD_FIELDS
from khipu.detector.trail import (
    first_read_offsets,
    partition_trails,
    skipped_offsets,
    trail_figures,
    waiting_from,
)
from khipu.store.heartbeat import PartitionTrail, TraceSkip

NOW = 10_000_000


class SkipCase(NamedTuple):
    number: int
    start: int | None  # where the batch started on partition 0 (None: a partition new since the previous batch)
    end: int
    first_read: int | None  # the lowest offset it read there (None: none)
    log_start: int | None  # asked after the batch (None: the broker did not answer for it)
    expected: tuple[int, int] | None  # the skip [from, to) on partition 0
    reason: str


# fmt: off
SKIP_CASES = [
    SkipCase(1, 100, 150, 100, 0, None, "it read from where it started: nothing skipped"),
    SkipCase(2, 100, 150, 130, 130, (100, 130),
             "it read from 130, and the broker no longer has 100..129: removed before it read them"),
    SkipCase(3, 100, 150, None, 150, (100, 150), "it read nothing, and all of its range is gone"),
    SkipCase(4, 100, 150, 101, 50, None,
             "offset 100 not read but the broker still has it (a transaction's commit marker): no skip"),
    SkipCase(5, 100, 150, 140, 120, (100, 120), "only offsets the broker no longer has count, not all it did not read"),
    SkipCase(6, 100, 150, None, 200, (100, 150),
             "the broker removed past the batch's end since: never more than the batch's range"),
    SkipCase(7, None, 150, 140, 140, None, "a partition new since the previous batch: no start to judge from"),
    SkipCase(8, 100, 100, None, 120, None, "a batch with nothing new on it: the next batch that reads on judges it"),
    SkipCase(9, 100, 150, 130, None, None, "the broker did not answer for its log start: not judged"),
]
# fmt: on


@pytest.mark.parametrize("case", SKIP_CASES, ids=[f"case{c.number}" for c in SKIP_CASES])
def test_skipped_offsets_table(case: SkipCase) -> None:
    starts = {} if case.start is None else {0: case.start}
    first = {} if case.first_read is None else {0: case.first_read}
    log_starts = {} if case.log_start is None else {0: case.log_start}
    found = skipped_offsets(7, starts, {0: case.end}, first, log_starts, NOW)
    expected = [] if case.expected is None else [TraceSkip(0, *case.expected, 7, NOW)]
    assert found == expected, case.reason


def test_each_partition_is_judged_on_its_own() -> None:
    found = skipped_offsets(3, {0: 10, 1: 20, 2: 30}, {0: 15, 1: 25, 2: 35}, {0: 10, 2: 33}, {0: 0, 1: 25, 2: 33}, NOW)
    assert [(s.partition, s.from_offset, s.to_offset, s.offsets) for s in found] == [(1, 20, 25, 5), (2, 30, 33, 3)]


def trail(partition: int, read_end: int, log_start: int, log_end: int, oldest_ms: int | None = None) -> PartitionTrail:
    waiting = max(read_end, log_start)
    offset = waiting if oldest_ms is not None and waiting < log_end else None
    return PartitionTrail(partition, read_end, 5, log_start, log_end, NOW - 1_000, offset, oldest_ms)


class FigureCase(NamedTuple):
    number: int
    trails: list[PartitionTrail]
    records_behind: int
    removed_unread: int
    seconds_behind: float | None
    reason: str


# fmt: off
FIGURE_CASES = [
    FigureCase(1, [trail(0, 50, 0, 50), trail(1, 70, 0, 70)], 0, 0, 0.0,
               "every partition read to its log end: nothing behind, in records or in time"),
    FigureCase(2, [trail(0, 50, 0, 80, NOW - 30_000), trail(1, 70, 0, 90, NOW - 45_000)], 50, 0, 45.0,
               "30 and 20 records behind; the oldest record not read is the one appended 45 s ago"),
    FigureCase(3, [trail(0, 50, 0, 80, NOW - 30_000), trail(1, 70, 0, 90)], 50, 0, None,
               "partition 1's oldest record not read has no time (the broker did not answer): not known"),
    FigureCase(4, [trail(0, 50, 0, 50), trail(1, 70, 0, 90, NOW - 2_000)], 20, 0, 2.0,
               "a partition read to its end does not count: the other's oldest record not read is 2 s old"),
    FigureCase(5, [trail(0, 50, 80, 80)], 30, 30, 0.0,
               "the 30 records not read were all removed: behind by them, none waits in the log to grow older"),
    FigureCase(6, [trail(0, 50, 80, 95, NOW - 5_000)], 45, 30, 5.0,
               "30 removed, 15 still there: the oldest of those is what ages"),
    FigureCase(7, [trail(0, 50, 0, 60, NOW + 3_000)], 10, 0, 0.0,
               "a record stamped after now (another host's clock): no negative age"),
]
# fmt: on


@pytest.mark.parametrize("case", FIGURE_CASES, ids=[f"case{c.number}" for c in FIGURE_CASES])
def test_trail_figures_table(case: FigureCase) -> None:
    figures = trail_figures(case.trails)
    assert figures is not None
    assert (figures.records_behind, figures.removed_unread) == (case.records_behind, case.removed_unread), case.reason
    assert figures.seconds_behind(NOW) == case.seconds_behind, case.reason


def test_no_trail_recorded_has_no_figures() -> None:
    assert trail_figures([]) is None


def test_the_oldest_record_waiting_is_at_the_read_end_or_the_log_start_whichever_is_later() -> None:
    assert waiting_from(trail(0, 50, 0, 80)) == 50
    assert waiting_from(trail(0, 50, 60, 80)) == 60  # 50..59 removed: 60 is the oldest one still there
    assert waiting_from(trail(0, 80, 0, 80)) is None
    assert waiting_from(trail(0, 50, 80, 80)) is None  # all removed: none waits


def test_partition_trails_pair_each_batch_end_with_the_brokers_answer() -> None:
    trails = partition_trails(9, {1: 40, 0: 30, 2: 50}, {0: (0, 35), 1: (10, 40)}, NOW)
    assert trails == [PartitionTrail(0, 30, 9, 0, 35, NOW), PartitionTrail(1, 40, 9, 10, 40, NOW)]  # 2: no answer


def test_first_read_offsets_are_the_lowest_per_partition_over_every_line() -> None:
    rows = [  # a batch record's lines share its offset; a row without one (none here in practice) is left out
        {"source_partition": 0, "source_offset": 12},
        {"source_partition": 0, "source_offset": 10},
        {"source_partition": 0, "source_offset": 10},
        {"source_partition": 1, "source_offset": 7},
        {"source_partition": 1, "source_offset": None},
    ]
    table = pa.Table.from_pylist(rows, schema=pa.schema([RECORD_FIELDS.field(n) for n in rows[0]]))
    assert first_read_offsets(table) == {0: 10, 1: 7}
    assert first_read_offsets(RECORD_FIELDS.empty_table()) == {}
