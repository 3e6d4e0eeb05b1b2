"""The commit history a worker keeps of what it was told, and what the rules read from it.

The broker here is a stand-in admin client that answers what the test sets: the history's rules (when an answer
counts as seen, what a rewind does) are about the answers, whatever gave them. The detector's integration tests run
the same lookup against a real broker.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from khipu.detector.committed import WORKER_HISTORIES, CommitHistories, CommittedOffsets
from khipu.detector.model import NONE, CommitHistory
from tests.unit.detector.test_outage import StandInClients


def test_a_history_says_when_the_group_first_went_past_an_offset() -> None:
    history = CommitHistory.of([(1_000, 5), (2_000, 8), (3_000, 8_000)])
    assert [history.passed_since_ms(offset) for offset in (4, 5, 7, 8, 7_999, 8_000)] == [
        1_000,  # committed 5 (next to read) is past 4
        2_000,  # 5 is not past 5: 8 is
        2_000,
        3_000,
        3_000,
        None,  # never past 8,000 in this history
    ]
    offsets = np.asarray([4, 5, 8, 8_000], dtype=np.int64)
    assert history.passed_since_all(offsets).tolist() == [1_000, 2_000, 3_000, NONE]


def test_a_history_that_goes_back_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="goes forward in time and offset"):
        CommitHistory.of([(1_000, 8), (2_000, 5)])
    with pytest.raises(ValueError, match="goes forward in time and offset"):
        CommitHistory.of([(2_000, 5), (1_000, 8)])


def test_only_changes_are_kept_and_a_rewind_starts_the_history_over() -> None:
    histories = CommitHistories(keep_ms=60_000)
    for at, committed in [(1_000, 5), (2_000, 5), (3_000, 9), (4_000, 9)]:
        histories.saw("broker:9092", "g", {("orders", 0): committed}, at)
    history = histories.history("broker:9092", "g", "orders", 0)
    assert history is not None and history.seen_ms.tolist() == [1_000, 3_000]  # the first sight of each offset
    assert history.passed_since_ms(5) == 3_000
    histories.saw("broker:9092", "g", {("orders", 0): 2}, 5_000)  # reset to 2 (or the topic was made again)
    again = histories.history("broker:9092", "g", "orders", 0)
    assert again is not None and again.seen_ms.tolist() == [5_000] and again.passed_since_ms(1) == 5_000
    assert again.passed_since_ms(5) is None  # it is no longer past 5: what it said before no longer holds
    assert histories.history("other:9092", "g", "orders", 0) is None  # another cluster's group is another group
    assert histories.history("broker:9092", "g", "orders", 1) is None


def test_a_partition_an_answer_no_longer_names_is_forgotten_an_empty_answer_says_nothing() -> None:
    histories = CommitHistories()
    histories.saw("b", "g", {("orders", 0): 50, ("audit", 0): 7}, 1_000)
    histories.saw("b", "g", {}, 2_000)  # a group not known, or no answer: nothing is forgotten
    assert histories.history("b", "g", "orders", 0) is not None
    histories.saw("b", "g", {("audit", 0): 9}, 3_000)  # orders was deleted: Kafka drops its committed offsets
    assert histories.history("b", "g", "orders", 0) is None
    histories.saw("b", "g", {("orders", 0): 60, ("audit", 0): 9}, 4_000)  # made again, and read to 60
    again = histories.history("b", "g", "orders", 0)
    assert again is not None and again.passed_since_ms(30) == 4_000  # not 1,000: that was the deleted topic


def test_a_history_keeps_what_it_saw_for_its_keep_time_only() -> None:
    histories = CommitHistories(keep_ms=10_000)
    for at in range(0, 30_001, 1_000):
        histories.saw("b", "g", {("t", 0): at}, at)  # the group moves on every second
    history = histories.history("b", "g", "t", 0)
    assert history is not None and history.seen_ms.tolist() == list(range(20_000, 30_001, 1_000))
    # forgotten: an offset passed long ago reads as passed at the oldest sight kept (later: a longer wait, never a
    # shorter one)
    assert history.passed_since_ms(5_000) == 20_000


class _Admin:
    def __init__(self) -> None:
        self.committed = 5

    def committed_offsets(self, group: str) -> dict[tuple[str, int], int]:
        return {("orders", 0): self.committed}


def test_the_lookup_records_each_answer_at_the_time_it_came_back() -> None:
    admin, clock = _Admin(), [1_000]
    histories = CommitHistories()

    def now() -> int:
        clock[0] += 10  # the clock moves while the broker answers
        return clock[0]

    lookup = CommittedOffsets(StandInClients(admin), cache_ms=2_000, clock_ms=now, histories=histories)  # type: ignore[arg-type]
    assert lookup("local", "g", "orders", 0) == 5
    admin.committed = 9
    clock[0] = 2_500  # within the cache: not asked, nothing new seen
    assert lookup("local", "g", "orders", 0) == 5
    clock[0] = 4_000
    assert lookup("local", "g", "orders", 0) == 9
    history = lookup.history("local", "g", "orders", 0)
    # asked at 1,010 and answered at 1,020; asked at 4,010 and answered at 4,020: each offset counts from the answer
    assert history is not None and history.seen_ms.tolist() == [1_020, 4_020] and history.committed.tolist() == [5, 9]
    assert lookup.history("elsewhere", "g", "orders", 0) is None  # no connection names it


def test_a_lookup_shipped_to_a_worker_uses_that_workers_history() -> None:
    lookup = CommittedOffsets(StandInClients(_Admin()))  # type: ignore[arg-type]
    assert lookup.histories is WORKER_HISTORIES
    shipped = pickle.loads(pickle.dumps(lookup))
    assert shipped.histories is WORKER_HISTORIES  # the process's own, not a copy of the sender's
    own = CommitHistories()
    kept = pickle.loads(pickle.dumps(CommittedOffsets(StandInClients(_Admin()), histories=own)))  # type: ignore[arg-type]
    assert kept.histories is not WORKER_HISTORIES and isinstance(kept.histories, CommitHistories)
