import pyarrow as pa
import pytest

from khipu.detector.bucket import AHEAD
from khipu.detector.outputs import batch_phases, held_back

# hop 0: a write hop; hop 1: group s1 (at location s1) reading c1/out; hop 2: group s2 reading c2/out
HOPS = {"pointer_location": [None, "s1", "s2"], "cluster": ["c1", "c1", "c2"], "topic": ["out", "out", "out"]}
POINTED = [("s1", "c1", "out", 0, 7), ("s2", "c2", "out", 3, 9)]


@pytest.mark.parametrize(
    ("duration_ms", "said"),
    [
        (  # Spark's phases, longest first; what they leave of the trigger's clock is "other"
            {"triggerExecution": 5000, "addBatch": 4200, "latestOffset": 30, "queryPlanning": 250, "walCommit": 20},
            "5000 ms in all: addBatch 4200, other 500, queryPlanning 250, latestOffset 30, walCommit 20",
        ),
        (  # phases that overlap say more than the whole: nothing is left over, never a negative "other"
            {"triggerExecution": 100, "addBatch": 90, "getBatch": 20},
            "100 ms in all: addBatch 90, getBatch 20, other 0",
        ),
        ({"addBatch": 70, "walCommit": 5}, "75 ms in all: addBatch 70, walCommit 5, other 0"),  # no trigger: summed
        ({}, "0 ms in all: other 0"),
    ],
)
def test_a_batch_says_where_its_time_went(duration_ms: dict[str, int], said: str) -> None:
    assert batch_phases(duration_ms) == said


@pytest.mark.parametrize(
    ("row", "held", "reason"),
    [
        ((1, "LOST", 0, 7, AHEAD), True, "a LOST decided ahead whose record s1 points at in this batch"),
        ((2, "LOST", 3, 9, AHEAD), True, "the same on another cluster: its own cluster and location"),
        ((1, "LOST", 0, 7, "decide"), False, "decided on the finished batches' clock: pointers stored, it stands"),
        ((1, "LOST", 0, 8, AHEAD), False, "another offset: nothing points at it"),
        ((2, "LOST", 0, 7, AHEAD), False, "s1's pointer says nothing of s2's hop"),
        ((1, "DELIVERED", 0, 7, AHEAD), False, "only a LOST waits on pointers"),
        ((0, "LOST", 0, 7, AHEAD), False, "a write hop: no group points at it"),
        ((1, "LOST", None, None, AHEAD), False, "no record position: nothing to point at"),
    ],
)
def test_a_lost_decided_ahead_is_held_back_when_the_batch_points_at_its_record(
    row: tuple[int, str, int | None, int | None, str], held: bool, reason: str
) -> None:
    names = ("hop", "verdict", "partition", "offset", "judged_by")
    other = (1, "DELIVERED", 0, 1, "clean")  # a neighbour that is never held
    table = pa.Table.from_pylist([dict(zip(names, other, strict=True)), dict(zip(names, row, strict=True))])
    assert [bool(h) for h in held_back(table, POINTED, HOPS)] == [False, held], reason


def test_nothing_is_held_back_without_a_pointer_in_the_batch() -> None:
    table = pa.Table.from_pylist([{"hop": 1, "verdict": "LOST", "partition": 0, "offset": 7, "judged_by": AHEAD}])
    assert not held_back(table, [], HOPS).any()
