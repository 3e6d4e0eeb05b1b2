"""How far the trace topic is read, as a time, after a micro-batch: a numbered table of cases with reasons."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

from khipu.detector.clock import read_to_ms, source_offsets


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
