"""A rescale's hand-over without Spark: a bucket's state cut by the new count and put back together, the slices made
from the old states as the rescale's Spark job makes them, the manifest, and the processor taking the slices as its
initial state (Spark's TwsTester) and deciding every message as a processor that was never rescaled does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from khipu.detector.bucket import BucketJudge, BucketState, route_ids, routes_fingerprint
from khipu.detector.checkpoint import HANDOVER_FILE
from khipu.detector.handover import (
    HANDOVER_SCHEMA,
    OLD_STATE_SCHEMA,
    Handover,
    Rekeyed,
    merge_states,
    pending_handover,
    read_handover,
    split_state,
    wake_ms,
    write_handover,
)
from khipu.detector.launch import DetectorJobError
from khipu.detector.routes import RoutePlans
from khipu.detector.xxhash64 import spark_bucket
from khipu.storage.location import Location
from tests.routes import S1
from tests.unit.detector.test_decide import clean, recv
from tests.unit.detector.test_processor import CONFIG, PAST, REGISTRY, frame, new_tester, verdicts

IDS = [f"order-{n:03d}" for n in range(40)]


def state_of(ids: list[str], now_ms: int = 10_000) -> BucketState:
    """A bucket holding these messages in flight, as the processor keeps it: their traces judged once at ``now_ms``
    (the groups not yet past: nothing decided), so each has its row, memo and next check."""
    judge = BucketJudge(RoutePlans.of(REGISTRY), CONFIG)  # type: ignore[arg-type]
    tws = new_tester({key: 0 for key in PAST})
    tws.setProcessingTime(now_ms)
    tws.testInPandas(0, pd.concat([frame(clean(), message_id=m) for m in ids], ignore_index=True))
    stored = tws.peekValueState("bucket", 0)
    state = BucketState.decode(bytes(stored[0]))
    assert state.routes == judge.fingerprint and state.messages.num_rows == len(ids)
    return state


def messages_of(state: BucketState) -> dict[str, dict[str, Any]]:
    return {row["message_id"]: row for row in state.messages.to_pylist()}


def traces_of(state: BucketState) -> list[tuple[Any, ...]]:
    return sorted(tuple(row.values()) for row in state.traces.to_pylist())


def test_a_state_cut_by_the_new_count_puts_each_message_with_its_traces_where_its_id_hashes() -> None:
    state = state_of(IDS)
    parts = split_state(state, 8)
    assert len(parts) > 4  # 40 ids over 8 buckets: most buckets take some
    for bucket, part in parts.items():
        ids = part.messages.column("message_id")
        assert set(spark_bucket(ids, 8).tolist()) == {bucket}  # every message where its later traces arrive
        assert set(part.traces.column("message_id").to_pylist()) == set(ids.to_pylist())
        assert part.routes == state.routes
    assert sorted(m for part in parts.values() for m in part.messages.column("message_id").to_pylist()) == IDS
    assert sum(part.traces.num_rows for part in parts.values()) == state.traces.num_rows == 5 * len(IDS)


def test_slices_merged_again_are_the_state_they_were_cut_from() -> None:
    state = state_of(IDS)

    def must_not_restate(part: BucketState) -> BucketState:
        raise AssertionError("slices kept under one set of routes need no restating")

    merged = merge_states(list(split_state(state, 5).values()), must_not_restate)
    assert messages_of(merged) == messages_of(state)
    assert traces_of(merged) == traces_of(state)
    assert merged.routes == state.routes
    assert BucketState.decode(merged.encode()).messages.num_rows == len(IDS)  # kept as the processor keeps it


def test_slices_kept_under_different_routes_are_each_restated_under_the_current_ones() -> None:
    """A registry change since: one old bucket was evaluated again (its state restated), another was not."""
    judge = BucketJudge(RoutePlans.of(REGISTRY), CONFIG)  # type: ignore[arg-type]
    current = state_of(IDS[:10])
    earlier = {"orders": list(reversed(route_ids(RoutePlans.of(REGISTRY))["orders"]))}  # the hops in another order
    old = BucketState(state_of(IDS[10:20]).traces, state_of(IDS[10:20]).messages, routes_fingerprint(earlier))
    restated: list[str | None] = []

    def restate(part: BucketState) -> BucketState:
        restated.append(part.routes)
        return judge.restated(part)

    merged = merge_states([current, old], restate)
    assert sorted(restated, key=str) == sorted([current.routes, old.routes], key=str)  # each slice asked
    assert merged.routes == judge.fingerprint and sorted(messages_of(merged)) == IDS[:20]
    moved = messages_of(merged)[IDS[10]]
    assert moved["next_check_ms"] == 0  # restated: looked at again at once, as an evaluation would have


def test_a_bucket_wakes_when_the_first_of_its_messages_wants_looking_at() -> None:
    early, late = state_of(IDS[:3], now_ms=10_000), state_of(IDS[3:6], now_ms=50_000)
    merged = merge_states([late, early], BucketJudge(RoutePlans.of(REGISTRY), CONFIG).restated)  # type: ignore[arg-type]
    assert wake_ms(early) == min(messages_of(early)[m]["next_check_ms"] for m in IDS[:3]) > 10_000
    assert wake_ms(merged) == wake_ms(early) < wake_ms(late)
    assert wake_ms(BucketState.empty()) is None


def test_the_rekeying_job_cuts_every_old_state_into_one_slice_per_new_bucket_it_shares_messages_with() -> None:
    olds = {3: state_of(IDS[:25]), 7: state_of(IDS[25:])}
    batch = pa.RecordBatch.from_pydict(
        {"from_bucket": [3, 7, 9], "blob": [olds[3].encode(), olds[7].encode(), None]}, schema=OLD_STATE_SCHEMA
    )
    out = pa.Table.from_batches(list(Rekeyed(4)(iter([batch]))), schema=HANDOVER_SCHEMA)
    rows = out.to_pylist()
    assert len({(r["from_bucket"], r["bucket"]) for r in rows}) == len(rows)  # one slice per old and new bucket
    assert sum(r["messages"] for r in rows) == len(IDS)
    for row in rows:
        part = BucketState.decode(row["blob"])
        ids = part.messages.column("message_id").to_pylist()
        assert len(ids) == row["messages"] and set(spark_bucket(pa.array(ids), 4).tolist()) == {row["bucket"]}
        assert set(ids) <= set(olds[row["from_bucket"]].messages.column("message_id").to_pylist())


def test_the_manifest_reads_back_as_written_and_gives_the_old_batch_end_as_starting_offsets(tmp_path: Path) -> None:
    query = Location.of(tmp_path / "khipu_detector.1")
    handover = Handover(
        source="file:///x/khipu_detector", from_buckets=4, buckets=8, batch=11, replayed=True, topic="khipu.traces",
        offsets={1: 40, 0: 35, 2: 7}, shuffle_partitions=6, messages=23, slices=9, rescaled_ms=1_795_000_000_000,
    )  # fmt: skip
    assert read_handover(query) is None
    write_handover(query, handover)
    assert read_handover(query) == handover
    assert json.loads(handover.starting_offsets("khipu.traces")) == {"khipu.traces": {"0": 35, "1": 40, "2": 7}}
    with pytest.raises(DetectorJobError, match=r"'trace topic': got 'other'; expected 'khipu.traces'"):
        handover.starting_offsets("other")
    (tmp_path / "khipu_detector.1" / HANDOVER_FILE).write_text('{"source": 1}')
    with pytest.raises(DetectorJobError, match=HANDOVER_FILE):
        read_handover(query)


def test_a_hand_over_is_pending_until_the_new_checkpoint_commits_its_first_batch(tmp_path: Path) -> None:
    query = Location.of(tmp_path / "khipu_detector.1")
    handover = Handover("file:///x", 4, 8, 3, False, "t", {0: 5}, 4, 1, 1, 0)
    write_handover(query, handover)
    (tmp_path / "khipu_detector.1" / "offsets").mkdir()
    (tmp_path / "khipu_detector.1" / "offsets" / "0").write_text("v1\n{}\n{}")
    assert pending_handover(query) == handover  # batch 0 started, not committed: its replay takes it again
    (tmp_path / "khipu_detector.1" / "commits").mkdir()
    (tmp_path / "khipu_detector.1" / "commits" / "0").write_text("v1\n{}")
    assert pending_handover(query) is None


def test_a_processor_given_the_slices_decides_every_message_as_one_never_rescaled() -> None:
    """One bucket holding 30 messages mid-flight (some with traces still to come, one to be skipped, one read twice)
    is cut into four slices and handed to two new buckets, each slice in a call of its own (Spark may cut a key's
    initial state); then both processors see the same traces and clock: the same verdicts, at the same times."""
    ids = [f"m{n}" for n in range(30)]
    committed = dict(PAST)
    whole = new_tester(committed)
    whole.setProcessingTime(10_000)

    def first(m: str) -> list[Any]:
        traces = clean(skip={S1}) if m == "m7" else clean()
        return traces[:2] if int(m[1:]) % 3 == 0 else traces

    def rest(m: str) -> list[Any]:
        later = clean()[2:] if int(m[1:]) % 3 == 0 else []
        return [*later, recv("s2", "out", 7, 1500)] if m == "m4" else later

    whole.testInPandas(0, pd.concat([frame(first(m), message_id=m) for m in ids], ignore_index=True))
    kept = BucketState.decode(bytes(whole.peekValueState("bucket", 0)[0]))
    slices = [(bucket % 2, part) for bucket, part in sorted(split_state(kept, 4).items())]
    from pyspark.sql.streaming.tws_tester import TwsTester

    from khipu.detector.processor import VerdictProcessor
    from tests.unit.detector.test_processor import Offsets

    processor = VerdictProcessor(REGISTRY, Offsets(committed), CONFIG)  # type: ignore[arg-type]
    rescaled = TwsTester(
        processor, timeMode="ProcessingTime", outputMode="Update",
        initialStatePandas=[(bucket, pd.DataFrame({"blob": [part.encode()]})) for bucket, part in slices],
    )  # fmt: skip
    assert len(slices) > 2  # some new bucket got more than one call
    assert sorted(m for b in (0, 1) for m in messages_of(held(rescaled, b))) == sorted(ids)

    found: dict[str, list[pd.DataFrame]] = {"whole": [], "rescaled": []}
    rescaled.setProcessingTime(10_000)
    for now in (20_000, 40_000, 60_000, 100_000):
        whole.setProcessingTime(now - 5_000)
        found["whole"].append(verdicts(whole.setProcessingTime(now)))
        rescaled.setProcessingTime(now - 5_000)
        found["rescaled"].append(verdicts(rescaled.setProcessingTime(now)))
        if now == 20_000:
            late = [m for m in ids if rest(m)]
            found["whole"].append(
                verdicts(whole.testInPandas(0, pd.concat([frame(rest(m), message_id=m) for m in late])))
            )
            for bucket in (0, 1):
                mine = [m for m in late if spark_bucket(pa.array([m]), 2)[0] == bucket]
                found["rescaled"].append(
                    verdicts(rescaled.testInPandas(bucket, pd.concat([frame(rest(m), message_id=m) for m in mine])))
                )
    decided = {name: decisions(frames) for name, frames in found.items()}
    assert decided["rescaled"] == decided["whole"]
    kinds = {(v[2], v[3]) for v in decided["whole"]}
    assert {("DELIVERED", None), ("LOST", "skipped_by_consumer"), ("DUPLICATE", "rewind_replay")} <= kinds
    assert {v[0] for v in decided["whole"]} == set(ids)  # every message decided
    assert held(rescaled, 0).messages.num_rows == held(rescaled, 1).messages.num_rows == 0


def held(tws: Any, bucket: int) -> BucketState:
    stored = tws.peekValueState("bucket", bucket)
    return BucketState.empty() if stored is None else BucketState.decode(bytes(stored[0]))


def decisions(frames: list[pd.DataFrame]) -> list[tuple[Any, ...]]:
    rows = [r for f in frames if len(f) for r in f.to_dict("records")]
    keys = ("message_id", "hop", "verdict", "cause", "count", "decided_ms", "latency_ms")
    return sorted((tuple(None if pd.isna(r[k]) else r[k] for k in keys) for r in rows), key=str)
