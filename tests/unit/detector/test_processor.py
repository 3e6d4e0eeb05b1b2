"""The stateful processor under Spark's TwsTester: verdicts on time, emitted once, state dropped when decided."""

from __future__ import annotations

import json
from typing import Any

from khipu.detector.model import DetectorConfig
from khipu.detector.parse import TRACE_COLUMNS
from khipu.detector.processor import TRACE_FIELDS, VerdictProcessor
from tests.unit.detector.test_decide import STREAM, clean

REGISTRY = type("R", (), {"streams": {"orders": STREAM}})()
CONFIG = DetectorConfig(grace_ms=30_000, max_wait_ms=900_000, recheck_ms=5_000)


class Offsets:
    def __init__(self, committed: dict[tuple[str, str], int]) -> None:
        self.committed = committed

    def __call__(self, cluster: str, group: str, topic: str, partition: int) -> int | None:
        return self.committed.get((group, topic))


def frame(traces: list[Any]) -> list[Any]:
    from pyspark.sql import Row

    rows = [
        (
            t.message_id,
            t.stream,
            t.location,
            t.cluster,
            t.type.value,
            t.timestamp_ms,
            t.topic,
            t.partition,
            t.offset,
            t.group,
            t.emitter_id,
            t.emitter_seq,
            t.sampling_percent,
            None,
        )
        for t in traces
    ]
    return [Row(**dict(zip(TRACE_FIELDS, row, strict=True))) for row in rows]


def new_tester(committed: dict[tuple[str, str], int]) -> Any:
    from pyspark.sql.streaming.tws_tester import TwsTester

    processor = VerdictProcessor(REGISTRY, Offsets(committed), CONFIG)  # type: ignore[arg-type]
    return TwsTester(processor, timeMode="ProcessingTime", outputMode="Update")


PAST = {("proc", "in"): 6, ("s1", "out"): 8, ("s2", "out"): 8}


def test_a_delivered_message_is_decided_when_its_grace_ends_and_its_state_is_dropped() -> None:
    tws = new_tester(PAST)
    tws.setProcessingTime(10_000)
    first = tws.test("m1", frame(clean()))
    assert len(first) == 0  # commits seen past just now: wait for the grace
    assert len(json.loads(tws.peekValueState("message", "m1")[0])) == 5
    out = tws.setProcessingTime(40_000)  # the timer at 10 s + 30 s grace fires
    assert sorted(row["verdict"] for row in out) == ["DELIVERED"] * 5
    assert tws.peekValueState("message", "m1") is None


def test_a_skipped_message_is_reported_lost_once_with_its_cause() -> None:
    tws = new_tester(PAST)
    tws.setProcessingTime(10_000)
    tws.test("m1", frame(clean(skip={"local/out -> s1"})))
    out = tws.setProcessingTime(40_000)
    lost = [row for row in out if row["verdict"] == "LOST"]
    assert [(row["hop"], row["cause"]) for row in lost] == [("local/out -> s1", "skipped_by_consumer")]
    assert len(tws.setProcessingTime(100_000)) == 0  # decided and dropped: nothing is emitted twice


def test_hops_decided_early_are_emitted_once_while_the_rest_waits() -> None:
    committed = {**PAST, ("s2", "out"): 7}  # s2 lags behind
    tws = new_tester(committed)
    tws.setProcessingTime(10_000)
    tws.test("m1", frame(clean()))
    early = tws.setProcessingTime(40_000)
    assert sorted(row["hop"] for row in early) == ["local/in -> proc", "local/out -> s1", "p -> local/in"]
    assert len(tws.setProcessingTime(45_000)) == 0  # rechecked, nothing new to say
    committed[("s2", "out")] = 8  # s2 catches up
    tws.setProcessingTime(50_000)
    late = tws.setProcessingTime(85_000)
    assert sorted(row["hop"] for row in late) == ["local/out -> s2", "proc -> local/out"]
    assert tws.peekValueState("message", "m1") is None


def test_trace_state_schema_matches_the_parsed_columns() -> None:
    assert TRACE_COLUMNS.count(",") + 1 == len(TRACE_FIELDS)
