"""The stateful processor under Spark's TwsTester (pandas mode): one state per bucket of messages, verdicts on
time and once, state dropped when decided; it reads its records packed by bucket and yields what it decides only,
packed too (the records reach the writer beside it)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pyarrow as pa

from khipu.detector.bucket import VERDICT_FIELDS, BucketState
from khipu.detector.model import CommitHistory, CommitHistoryLookup, DetectorConfig, no_history
from khipu.detector.outputs import expand_verdicts
from khipu.detector.packed import JUDGED, RECORD_FIELDS, RECORDS, by_bucket, unpack
from khipu.detector.processor import VerdictProcessor
from khipu.detector.records import MARK, TRACE
from khipu.detector.routes import RoutePlans, trace_hop_key
from khipu.trace.model import Trace
from tests.routes import PROC_IN, PROC_OUT, S1, S2, SRC
from tests.unit.detector.test_decide import STREAM, clean, recv

REGISTRY = type("R", (), {"streams": {"orders": STREAM}})()
CONFIG = DetectorConfig(grace_ms=30_000, max_wait_ms=900_000, recheck_ms=5_000)
HOPS = RoutePlans.of(REGISTRY).hop_keys()  # type: ignore[arg-type]


class Offsets:
    def __init__(self, committed: dict[tuple[str, str], int]) -> None:
        self.committed = committed

    def __call__(self, cluster: str, group: str, topic: str, partition: int) -> int | None:
        return self.committed.get((group, topic))


def frame(traces: list[Trace], message_id: str = "m1", marks: int = 0) -> pd.DataFrame:
    """The processor's input for these traces and some emitter marks: their records packed by bucket, as the job
    packs them in Spark (khipu.detector.job.judged_and_records)."""
    rows: list[dict[str, Any]] = []
    for t in traces:
        rows.append(
            {
                "bucket": 0,
                "kind": TRACE,
                "message_id": message_id,
                "stream": t.stream,
                "location": t.location,
                "cluster": t.cluster,
                "type": t.type.value,
                "timestamp_ms": t.timestamp_ms,
                "topic": t.topic,
                "partition": t.partition,
                "offset": t.offset,
                "group": t.group,
                "emitter_id": t.emitter_id,
                "emitter_seq": t.emitter_seq,
                "sampling_percent": t.sampling_percent,
                "attributes": None,
                "hop": HOPS.get(trace_hop_key(t), -1),
            }
        )
    for n in range(marks):
        rows.append({"bucket": 0, "kind": MARK, "location": "s1", "emitter_id": "s1-e", "emitter_seq": 90 + n,
                     "timestamp_ms": 5, "received": '[{"topic": "in", "partition": 0, "offset": 3}]'})  # fmt: skip
    return by_bucket(pa.Table.from_pylist(rows, schema=RECORD_FIELDS), RECORDS).to_pandas()


def new_tester(committed: dict[tuple[str, str], int], history: CommitHistoryLookup = no_history) -> Any:
    from pyspark.sql.streaming.tws_tester import TwsTester

    processor = VerdictProcessor(REGISTRY, Offsets(committed), CONFIG, history=history)  # type: ignore[arg-type]
    return TwsTester(processor, timeMode="ProcessingTime", outputMode="Update")


def verdicts(out: pd.DataFrame) -> pd.DataFrame:
    """The verdict rows, their hops spelt out as the writer does."""
    if not len(out):
        return out
    table = unpack(out[out["kind"] == JUDGED]["blob"], VERDICT_FIELDS)
    return expand_verdicts(table, RoutePlans.of(REGISTRY).described()).to_pandas()  # type: ignore[arg-type]


def in_flight(tws: Any) -> int:
    stored = tws.peekValueState("bucket", 0)
    return 0 if stored is None else len(BucketState.decode(bytes(stored[0])).messages)


PAST = {("proc", "in"): 6, ("s1", "out"): 8, ("s2", "out"): 8}


def test_a_delivered_message_is_decided_when_its_grace_ends_and_its_state_is_dropped() -> None:
    tws = new_tester(PAST)
    tws.setProcessingTime(10_000)
    first = tws.testInPandas(0, frame(clean()))
    assert len(verdicts(first)) == 0  # commits seen past just now: wait for the grace
    assert in_flight(tws) == 1
    out = tws.setProcessingTime(40_000)  # the bucket's timer at 10 s + 30 s grace fires
    assert sorted(verdicts(out)["verdict"]) == ["DELIVERED"] * 5
    assert set(verdicts(out)["judged_by"]) == {"clean"}
    assert tws.peekValueState("bucket", 0) is None  # nothing in flight: no state at all


def test_a_message_read_after_its_commits_were_seen_waits_the_grace_from_the_commits() -> None:
    """The detector behind on the trace topic: the groups' commits were seen past the message 45 s before the
    batch that reads it (the history a worker keeps), so its grace has run out at its first evaluation."""

    def history(cluster: str, group: str, topic: str, partition: int) -> CommitHistory | None:
        return CommitHistory.of([(15_000, PAST[(group, topic)])])

    tws = new_tester(PAST, history)
    tws.setProcessingTime(60_000)
    out = verdicts(tws.testInPandas(0, frame(clean())))
    assert sorted(out["verdict"]) == ["DELIVERED"] * 5 and set(out["judged_by"]) == {"clean"}
    assert tws.peekValueState("bucket", 0) is None  # decided at once: nothing held in flight


def test_only_what_it_decides_leaves_it_marks_are_left_to_the_records_beside_it() -> None:
    tws = new_tester(PAST)
    tws.setProcessingTime(10_000)
    out = tws.testInPandas(0, frame(clean(), marks=2))
    assert list(out["kind"]) == [JUDGED] and out["blob"].iloc[0] is None  # nothing decided; nothing echoed back
    assert list(out["in_flight"]) == [1] and int(out["state_bytes"].iloc[0]) > 0  # the marks are not messages
    later = tws.setProcessingTime(40_000)
    assert list(later["kind"]) == [JUDGED] and list(later["in_flight"]) == [0]
    decided = unpack(later["blob"], VERDICT_FIELDS)
    assert decided.num_rows == 5 and set(decided.column("message_id").to_pylist()) == {"m1"}


def test_a_skipped_message_is_reported_lost_once_with_its_cause_by_the_rules() -> None:
    tws = new_tester(PAST)
    tws.setProcessingTime(10_000)
    tws.testInPandas(0, frame(clean(skip={S1})))
    out = verdicts(tws.setProcessingTime(40_000))
    lost = out[out["verdict"] == "LOST"]
    assert [(row.hop, row.cause, row.judged_by) for row in lost.itertuples()] == [(S1, "skipped_by_consumer", "decide")]
    assert len(verdicts(tws.setProcessingTime(100_000))) == 0  # decided and dropped: nothing is emitted twice
    assert in_flight(tws) == 0


def test_hops_decided_early_are_emitted_once_while_the_rest_waits() -> None:
    committed = {**PAST, ("s2", "out"): 7}  # s2 lags behind
    tws = new_tester(committed)
    tws.setProcessingTime(10_000)
    tws.testInPandas(0, frame(clean()))
    early = verdicts(tws.setProcessingTime(40_000))
    assert sorted(early["hop"]) == [PROC_IN, S1, SRC]
    assert len(verdicts(tws.setProcessingTime(45_000))) == 0  # rechecked, nothing new to say
    committed[("s2", "out")] = 8  # s2 catches up
    tws.setProcessingTime(50_000)
    late = verdicts(tws.setProcessingTime(85_000))
    assert sorted(late["hop"]) == [S2, PROC_OUT]
    assert in_flight(tws) == 0


def test_many_messages_share_a_bucket_clean_ones_judged_together_a_duplicate_by_the_rules() -> None:
    tws = new_tester(PAST)
    tws.setProcessingTime(10_000)
    batch = pd.concat(
        [frame(clean(), message_id=f"m{n}") for n in range(20)]
        + [frame([*clean(), recv("s2", "out", 7, 1500)], message_id="dup")],
        ignore_index=True,
    )
    tws.testInPandas(0, batch)
    assert in_flight(tws) == 21
    out = verdicts(tws.setProcessingTime(40_000))
    assert len(out) == 21 * 5
    assert set(out[out["message_id"] != "dup"]["judged_by"]) == {"clean"}
    dup = out[out["message_id"] == "dup"].set_index("hop")
    assert (dup.loc[S2, "verdict"], dup.loc[S2, "cause"], dup.loc[S2, "count"]) == ("DUPLICATE", "rewind_replay", 2)
    assert in_flight(tws) == 0


def test_latencies_of_clean_messages_are_the_rules() -> None:
    tws = new_tester(PAST)
    tws.setProcessingTime(10_000)
    tws.testInPandas(0, frame(clean()))
    out = verdicts(tws.setProcessingTime(40_000)).set_index("hop")
    assert (out.loc[PROC_IN, "latency_ms"], out.loc[PROC_OUT, "latency_ms"], out.loc[S2, "latency_ms"]) == (
        100,
        100,
        200,
    )
    assert (out.loc[S1, "e2e_latency_ms"], out.loc[S2, "e2e_latency_ms"]) == (300, 400)
    assert pd.isna(out.loc[SRC, "latency_ms"])
