"""A bucket of messages judged together says what judging each message alone with decide says.

The reference is the per-message processor Khipu had before buckets: each message its own state,
decide applied whenever new traces arrive or its own next check is due, each hop reported once, the
state dropped when decided. Random messages — traces lost, read twice, written twice, skipped by a
group, arriving over several batches — are fed to both at the same times (batches at least
``recheck_ms`` apart, so a message waiting on a group is looked at in every batch by both), with
committed offsets moving on between batches. Every verdict must be the same, decided at the same time.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.ipc
import pytest

from khipu.detector.bucket import TRACE_STATE, BucketJudge, BucketState, Lookups, route_ids, routes_fingerprint
from khipu.detector.decide import decide
from khipu.detector.model import DetectorConfig, RecordFate, RecordState, Removal
from khipu.detector.routes import RoutePlans, trace_hop_key
from khipu.registry import parse_registry
from khipu.registry.model import Registry
from khipu.trace.model import Trace, TraceType
from khipu.verdicts.model import Verdict

CONFIG = DetectorConfig(grace_ms=30_000, max_wait_ms=300_000, recheck_ms=5_000)
REGISTRY = parse_registry("""
version: 1
clusters: {local: {}}
streams:
  orders:
    owner: t
    route:
      producers: [{location: p, writes: [local/in]}]
      consumers:
        - {group: proc, location: proc, reads: [local/in], writes: [local/out]}
        - {group: s1, location: s1, reads: [local/out]}
        - {group: s2, location: s2, reads: [local/out]}
  fanin:
    owner: t
    route:
      producers: [{location: q1, writes: [local/f1]}, {location: q2, writes: [local/f2]}]
      consumers: [{group: merge, location: merge, reads: [local/f1, local/f2]}]
""")


@dataclass
class World:
    committed: dict[tuple[str, str, int], int] = field(default_factory=dict)  # (group, topic, partition)
    log_start: dict[tuple[str, int], int] = field(default_factory=dict)
    fates: dict[tuple[str, int], RecordFate] = field(default_factory=dict)  # (topic, offset) -> the log's answer

    def committed_of(self, cluster: str, group: str, topic: str, partition: int) -> int | None:
        return self.committed.get((group, topic, partition))

    def start_of(self, cluster: str, topic: str, partition: int) -> int | None:
        return self.log_start.get((topic, partition))

    def removed(self, cluster: str, group: str, topic: str, partition: int, offset: int) -> Removal | None:
        start = self.log_start.get((topic, partition))
        return Removal(start, 0, None) if start is not None and start > offset else None

    def record(self, cluster: str, topic: str, partition: int, offset: int, key: str | None) -> RecordFate:
        return self.fates.get((topic, offset), RecordFate(RecordState.VISIBLE))


@dataclass
class _Alone:
    traces: list[Trace]
    first_seen: int
    memo: dict[str, int] = field(default_factory=dict)
    emitted: set[str] = field(default_factory=set)
    next_check: int = 0


class OneByOne:
    """The reference: one state per message, decide on new traces or when its next check is due."""

    def __init__(self, registry: Registry) -> None:
        self.registry, self.states = registry, {}  # type: ignore[var-annotated]

    def evaluate(self, new: Sequence[Trace], now: int, world: World) -> list[Verdict]:
        states: dict[str, _Alone] = self.states
        touched = set()
        for trace in new:
            state = states.setdefault(trace.message_id, _Alone([], now))
            state.traces.append(trace)
            touched.add(trace.message_id)
        out: list[Verdict] = []
        for message_id in sorted(states):
            state = states[message_id]
            if message_id not in touched and now < state.next_check:
                continue
            stream = self.registry.streams.get(state.traces[0].stream)
            assert stream is not None
            decision = decide(message_id, stream, state.traces, world.committed_of, state.memo, state.first_seen, now,
                              CONFIG, removed=world.removed, record=world.record)  # fmt: skip
            fresh = [v for v in decision.verdicts if v.hop not in state.emitted]
            out.extend(fresh)
            if decision.done:
                del states[message_id]
                continue
            state.emitted |= {v.hop for v in fresh}
            state.memo = dict(decision.passed_at)
            state.next_check = max(int(decision.next_check_ms or now), now + 1)
        return out


def rows_of(traces: Sequence[Trace], registry: Registry) -> pd.DataFrame:
    keys = RoutePlans.of(registry).hop_keys()
    rows = []
    for t in traces:
        skip = ("hop", "type", "attributes", "kafka_timestamp_ms")  # the last: the trace record's, not the trace's
        plain = {name: getattr(t, name) for name in TRACE_STATE.names if name not in skip}
        rows.append(
            {
                **plain,
                "type": t.type.value,
                "attributes": json.dumps(dict(t.attributes)) if t.attributes else None,
                "hop": keys.get(trace_hop_key(t), -1),
            }
        )
    return pd.DataFrame(rows, columns=list(TRACE_STATE.names))


def random_messages(rng: random.Random, count: int, world: World | None = None) -> list[tuple[int, Trace]]:
    """(the batch it arrives in, trace) for ``count`` messages with random faults; with a ``world``, Kafka's own
    semantics too: transactions (committed, aborted, proc reading uncommitted) and compaction (the world's log
    answers for them)."""
    out: list[tuple[int, Trace]] = []
    seq = iter(range(1_000_000))
    next_offset: dict[str, int] = {"in": 0, "out": 0, "f1": 0, "f2": 0}

    def trace(
        m: str, stream: str, loc: str, kind: TraceType, topic: str, offset: int, group: str | None, at: int
    ) -> Trace:
        return Trace(m, stream, loc, "local", kind, at, topic, 0, offset, group, f"{loc}-e", next(seq), 100.0)

    for n in range(count):
        m, batch, ts = f"m{n:04d}", rng.randrange(0, 4), 1_000 * n
        if rng.random() < 0.1:  # a fan-in message: decide alone
            topic = rng.choice(["f1", "f2"])
            offset = next_offset[topic]
            next_offset[topic] += 1
            out.append(
                (batch, trace(m, "fanin", "q1" if topic == "f1" else "q2", TraceType.SENT, topic, offset, None, ts))
            )
            if rng.random() < 0.8:
                out.append(
                    (
                        batch + rng.randrange(2),
                        trace(m, "fanin", "merge", TraceType.RECEIVED, topic, offset, "merge", ts + 5),
                    )
                )
            continue
        in_at, out_at = next_offset["in"], next_offset["out"]
        next_offset["in"] += 1
        next_offset["out"] += 1
        faults, weights = ["none", "lost trace", "skip", "drop", "reread", "retry"], [60, 10, 8, 7, 8, 7]
        if world is not None:
            faults, weights = [*faults, "committed", "aborted", "compacted"], [*weights, 10, 8, 6]
        fault = rng.choices(faults, weights)[0]
        hops = [
            ("p", TraceType.SENT, "in", in_at, None),
            ("proc", TraceType.RECEIVED, "in", in_at, "proc"),
            ("proc", TraceType.SENT, "out", out_at, None),
            ("s1", TraceType.RECEIVED, "out", out_at, "s1"),
            ("s2", TraceType.RECEIVED, "out", out_at, "s2"),
        ]
        if fault == "lost trace":
            hops.pop(rng.randrange(len(hops)))
        elif fault == "skip":
            hops.pop(rng.choice([1, 3, 4]))
        elif fault == "drop":
            hops = hops[:2]
        elif fault == "reread":
            hops.append(rng.choice(hops[3:]))
        elif fault == "retry":
            hops.append(("p", TraceType.SENT, "in", next_offset["in"], None))
            next_offset["in"] += 1
        elif fault == "aborted" and world is not None:  # p's transaction aborted: a read_committed proc never sees it
            world.fates[("in", in_at)] = RecordFate(RecordState.ABORTED)
            hops = hops[:1] if rng.random() < 0.6 else hops  # else proc reads uncommitted, and wrote it on
        elif fault == "compacted" and world is not None:  # s1 started after the cleaner removed out@out_at
            world.fates[("out", out_at)] = RecordFate(RecordState.COMPACTED, later_of_key=out_at + 50)
            hops.pop(3)
        for i, (loc, kind, topic, offset, group) in enumerate(hops):
            arrives = batch + (rng.randrange(3) if rng.random() < 0.3 else 0)
            made = trace(m, "orders", loc, kind, topic, offset, group, ts + 10 * i)
            if fault in ("committed", "aborted") and topic == "in":
                uncommitted = kind is TraceType.RECEIVED and (fault == "aborted" or rng.random() < 0.5)
                made = made._replace(transactional=kind is TraceType.SENT, read_uncommitted=uncommitted)
            out.append((arrives, made))
    return out


HOP_IDS = RoutePlans.of(REGISTRY).described()["hop"]


def key(v: Mapping[str, Any] | Verdict, hop_ids: Sequence[str] = HOP_IDS) -> tuple[Any, ...]:
    if isinstance(v, Mapping):  # the bucket's row: its hop by number
        v = {**v, "hop": hop_ids[int(v["hop"])]}
    get = (lambda name: v[name]) if isinstance(v, Mapping) else (lambda name: getattr(v, name))
    kind = get("verdict") if isinstance(v, Mapping) else v.kind.value
    cause = get("cause") if isinstance(v, Mapping) else (v.cause.value if v.cause else None)

    def plain(x: Any) -> Any:
        return None if x is None or pd.isna(x) else int(x)

    return (get("message_id"), get("hop"), kind, cause, int(get("count")), plain(get("partition")),
            plain(get("offset")), plain(get("observed_ms")), plain(get("latency_ms")), plain(get("e2e_latency_ms")),
            int(get("decided_ms")))  # fmt: skip


@pytest.mark.parametrize("seed", range(6))
def test_a_bucket_judges_every_message_as_decide_alone_does(seed: int) -> None:
    rng = random.Random(seed)
    world = World()
    arrivals = random_messages(rng, 120, world)
    alone, bucket = OneByOne(REGISTRY), BucketJudge(RoutePlans.of(REGISTRY), CONFIG)
    state = BucketState.empty()
    lookups = Lookups(world.committed_of, world.start_of, removed=world.removed, record=world.record)
    expected: list[tuple[Any, ...]] = []
    got: list[tuple[Any, ...]] = []
    clean = judged = 0
    now = 100_000
    for step in range(40):
        new = [t for batch, t in arrivals if batch == step]
        for group, topic in (("proc", "in"), ("s1", "out"), ("s2", "out"), ("merge", "f1"), ("merge", "f2")):
            if rng.random() < 0.6:  # the groups commit on, now and then, past what they read
                current = world.committed.get((group, topic, 0), 0)
                world.committed[(group, topic, 0)] = current + rng.randrange(0, 60)
        if step == 25:
            world.log_start[("out", 0)] = 3  # retention moved past the first records of out
        expected += [key(v) for v in alone.evaluate(new, now, world)]
        evaluation = bucket.evaluate(state, rows_of(new, REGISTRY) if new else None, now, lookups)
        state = BucketState.decode(evaluation.state.encode())  # as Spark keeps it between batches
        got += [key(row) for row in evaluation.verdicts.to_dict("records")]
        clean += evaluation.clean_messages
        judged += evaluation.judged_messages
        now += rng.choice([5_000, 7_000, 20_000])
    assert len(got) == len(set(got))  # no hop reported twice
    assert sorted(got) == sorted(expected)
    assert len(expected) > 300 and clean > judged  # most of the work was the clean judge's
    kinds = {v[2] for v in expected}
    assert {"ABORTED", "SUPERSEDED", "DELIVERED", "LOST"} <= kinds  # Kafka's semantics were in the mix


# the registry changed under the detector: a stream sorting first gained hops (every global hop number moved),
# orders gained a group reading its output, fan-in lost its second producer's topic
CHANGED = parse_registry("""
version: 1
clusters: {local: {}}
streams:
  aaa:
    owner: t
    route:
      producers: [{location: a, writes: [local/a]}]
      consumers: [{group: ga, location: ga, reads: [local/a]}]
  orders:
    owner: t
    route:
      producers: [{location: p, writes: [local/in]}]
      consumers:
        - {group: proc, location: proc, reads: [local/in], writes: [local/out]}
        - {group: s1, location: s1, reads: [local/out]}
        - {group: s2, location: s2, reads: [local/out]}
        - {group: s3, location: s3, reads: [local/out]}
  fanin:
    owner: t
    route:
      producers: [{location: q1, writes: [local/f1]}]
      consumers: [{group: merge, location: merge, reads: [local/f1]}]
""")


@pytest.mark.parametrize("seed", range(3))
def test_state_kept_under_earlier_routes_is_judged_under_the_new_ones_as_decide_alone_judges_it(seed: int) -> None:
    rng = random.Random(seed)
    arrivals = random_messages(rng, 120)
    world = World()
    before, after = RoutePlans.of(REGISTRY), RoutePlans.of(CHANGED)
    earlier = {routes_fingerprint(route_ids(before)): route_ids(before)}
    alone, bucket = OneByOne(REGISTRY), BucketJudge(before, CONFIG)
    state = BucketState.empty()
    lookups = Lookups(world.committed_of, world.start_of, removed=world.removed)
    expected: list[tuple[Any, ...]] = []
    got: list[tuple[Any, ...]] = []
    registry, hop_ids, now, moved, restated = REGISTRY, HOP_IDS, 100_000, 0, None
    for step in range(40):
        if step == 3:  # the detector restarts with the new registry, its state as it was
            registry, hop_ids = CHANGED, after.described()["hop"]
            alone.registry, bucket = CHANGED, BucketJudge(after, CONFIG, earlier)
            for kept in alone.states.values():  # after a registry change every message is looked at again at once
                kept.next_check = 0
            moved = len(state.messages)
        new = [t for batch, t in arrivals if batch == step]
        for group, topic in (("proc", "in"), ("s1", "out"), ("s2", "out"), ("s3", "out"), ("merge", "f1")):
            if rng.random() < 0.6:
                current = world.committed.get((group, topic, 0), 0)
                world.committed[(group, topic, 0)] = current + rng.randrange(0, 60)
        expected += [key(v) for v in alone.evaluate(new, now, world)]
        evaluation = bucket.evaluate(state, rows_of(new, registry) if new else None, now, lookups)
        state = BucketState.decode(evaluation.state.encode())
        if step == 3:
            restated = state.routes
        got += [key(row, hop_ids) for row in evaluation.verdicts.to_dict("records")]
        now += rng.choice([5_000, 7_000, 20_000])
    assert moved > 50  # messages in flight across the change
    assert restated == routes_fingerprint(route_ids(after))  # kept under the new routes from then on
    assert len(got) == len(set(got))
    assert sorted(got) == sorted(expected)
    assert any(v[1] == "local/out -> s3" for v in got)  # the new group's hop judged for messages kept before


def test_a_state_kept_before_trace_format_3_is_judged_after_an_upgrade() -> None:
    """A bucket's state written by the previous version (its traces without the key hash and flags) is read by
    this one: new traces join it and the old ones are judged as traces without them."""
    rng = random.Random(7)
    arrivals = random_messages(rng, 40)
    world = World()
    judge = BucketJudge(RoutePlans.of(REGISTRY), CONFIG)
    lookups = Lookups(world.committed_of, world.start_of, removed=world.removed)
    first = judge.evaluate(BucketState.empty(), rows_of([t for b, t in arrivals if b == 0], REGISTRY), 100_000, lookups)
    older = first.state.traces.drop_columns(["key_hash", "tombstone", "transactional", "read_uncommitted"])
    sink = pa.BufferOutputStream()
    for table in (older, first.state.messages):
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    kept = BucketState.decode(bytes(sink.getvalue()))  # as Spark hands the previous version's blob back
    assert kept.traces.schema == TRACE_STATE and kept.traces.num_rows == first.state.traces.num_rows
    assert kept.traces.column("transactional").null_count == kept.traces.num_rows
    later = judge.evaluate(kept, rows_of([t for b, t in arrivals if b == 1], REGISTRY), 105_000, lookups)
    again = judge.evaluate(first.state, rows_of([t for b, t in arrivals if b == 1], REGISTRY), 105_000, lookups)
    assert later.verdicts.to_dict("records") == again.verdicts.to_dict("records")  # judged as if never upgraded
