"""How far the trace topic is read, as a time, after a micro-batch: a numbered table of cases with reasons."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

from khipu.detector.clock import read_to_ms, running_read_to_ms, source_offsets


class Case(NamedTuple):
    number: int
    end: dict[int, int]
    latest: dict[int, int] | None
    newest_read: dict[int, int]
    expected: int | None
    reason: str


START = 100_000
# fmt: off
CASES = [
    Case(1, {0: 50, 1: 70}, {0: 50, 1: 70}, {}, START,
         "every partition read to its end as the batch began: everything written before it is read"),
    Case(2, {0: 50, 1: 70}, {0: 50, 1: 900}, {0: 99_000, 1: 60_000}, 60_000,
         "partition 1 is a backlog read up to a record written at 60 s: the topic is read to then"),
    Case(3, {0: 50, 1: 70}, {0: 80, 1: 900}, {0: 99_000, 1: 60_000}, 60_000,
         "both behind: the earlier of what each was read to"),
    Case(4, {0: 50, 1: 70}, {0: 50, 1: 900}, {0: 99_000}, None,
         "partition 1 behind and nothing of it read yet: not known (the previous answer stands)"),
    Case(5, {0: 50}, None, {0: 99_500}, 99_500,
         "the latest offsets not reported: only what was read counts"),
    Case(6, {0: 50}, {0: 90}, {0: 150_000}, START,
         "a record stamped after the batch began (a fast clock): never past the batch's start"),
    Case(7, {}, {}, {}, None, "no partition: nothing known"),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=[f"case{c.number}" for c in CASES])
def test_read_to_table(case: Case) -> None:
    assert read_to_ms(START, case.end, case.latest, case.newest_read) == case.expected, case.reason


class RunningCase(NamedTuple):
    number: int
    previous_end: int | None
    starts: dict[int, int] | None
    ends: dict[int, int]
    max_offsets: int | None
    expected: int | None
    reason: str


ENDED = 250_000  # when the previous batch's writer returned
# fmt: off
RUNNING_CASES = [
    RunningCase(1, ENDED, {0: 50, 1: 70}, {0: 150, 1: 170}, 1_000, ENDED,
                "200 offsets under a limit of 1,000: cut nowhere, every partition read to what it held after then"),
    RunningCase(2, ENDED, {0: 50, 1: 70}, {0: 550, 1: 570}, 1_000, None,
                "1,000 offsets, the limit: the source may have cut a partition short of its latest offset"),
    RunningCase(10, ENDED, {0: 50, 1: 70}, {0: 549, 1: 570}, 1_000, None,
                "999 offsets: the topic held 1,000 and 1,001 past them, each share of the limit rounded down "
                "(499.75 -> 499, 500.25 -> 500): cut, though under the limit"),
    RunningCase(11, ENDED, {0: 50, 1: 70}, {0: 549, 1: 569}, 1_000, None,
                "998 offsets, the limit less one a partition: a share rounded down in floating point may make it"),
    RunningCase(12, ENDED, {0: 50, 1: 70}, {0: 548, 1: 569}, 1_000, ENDED,
                "997 offsets: a cut batch of two partitions spans at least 998, so this one read all there was"),
    RunningCase(3, ENDED, {0: 50, 1: 70}, {0: 5_050, 1: 5_070}, None, ENDED,
                "no limit: every batch reads to the latest offsets"),
    RunningCase(4, None, {0: 50}, {0: 60}, 1_000, None,
                "no previous batch in this process (a restart): not known when this one was planned"),
    RunningCase(5, ENDED, None, {0: 60}, 1_000, None,
                "the previous batch's ends unreadable: its span not known"),
    RunningCase(6, ENDED, {0: 50}, {0: 60, 1: 990}, 1_000, None,
                "a partition new since the previous batch counts from offset 0: 10 + 990 offsets, past 998"),
    RunningCase(7, ENDED, {0: 50}, {0: 60, 1: 985}, 1_000, ENDED,
                "a partition new since the previous batch counts from offset 0: 995 offsets, under 998"),
    RunningCase(8, ENDED, {0: 50}, {0: 50}, 1_000, ENDED,
                "nothing new (a batch for timers): the topic held nothing past where it was read"),
    RunningCase(9, ENDED, {0: 50}, {}, 1_000, None, "no partition: nothing known"),
]
# fmt: on


@pytest.mark.parametrize("case", RUNNING_CASES, ids=[f"case{c.number}" for c in RUNNING_CASES])
def test_running_read_to_table(case: RunningCase) -> None:
    assert running_read_to_ms(case.previous_end, case.starts, case.ends, case.max_offsets) == case.expected, case.reason


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"khipu.traces": {"0": 12, "1": 40}}', {0: 12, 1: 40}),
        ({"khipu.traces": {"2": 7}}, {2: 7}),
        ('{"other": {"0": 1}}', None),
        ("not json", None),
        (None, None),
    ],
)
def test_source_offsets_read_spark_progress(raw: Any, expected: dict[int, int] | None) -> None:
    assert source_offsets(raw, "khipu.traces") == expected
