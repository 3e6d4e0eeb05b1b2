import pytest

from khipu.detector.outputs import batch_phases


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
