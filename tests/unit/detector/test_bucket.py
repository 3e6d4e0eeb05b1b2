"""A bucket of messages judged together says what judging each message alone with decide says.

The reference is the per-message processor Khipu had before buckets: each message its own state,
decide applied whenever new traces arrive or its own next check is due, each hop reported once, the
state dropped when decided. Random messages — traces lost, read twice, written twice, skipped by a
group, arriving over several batches — are fed to both at the same times (batches at least
``recheck_ms`` apart, so a message waiting on a group is looked at in every batch by both), with
committed offsets moving on between batches. Every verdict must be the same, decided at the same time.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.ipc
import pytest

from khipu.detector.bucket import (
    AHEAD,
    MESSAGE_STATE,
    TRACE_STATE,
    BucketJudge,
    BucketState,
    Lookups,
    route_ids,
    routes_fingerprint,
)
from khipu.detector.decide import decide, reported_now, to_report
from khipu.detector.model import (
    CommitHistory,
    DetectorConfig,
    PointerLookup,
    RecordFate,
    RecordState,
    Removal,
    nothing_pointed_at,
)
from khipu.detector.outputs import held_back
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
    owner: team-t
    route:
      producers: [{location: p, writes: [local/in]}]
      consumers:
        - {group: proc, location: proc, reads: [local/in], writes: [local/out]}
        - {group: s1, location: s1, reads: [local/out]}
        - {group: s2, location: s2, reads: [local/out]}
  fanin:
    owner: team-t
    route:
      producers: [{location: q1, writes: [local/f1]}, {location: q2, writes: [local/f2]}]
      consumers: [{group: merge, location: merge, reads: [local/f1, local/f2]}]
""")


@dataclass
class World:
    committed: dict[tuple[str, str, int], int] = field(default_factory=dict)  # (group, topic, partition)
    log_start: dict[tuple[str, int], int] = field(default_factory=dict)
    fates: dict[tuple[str, int], RecordFate] = field(default_factory=dict)  # (topic, offset) -> the log's answer
    # (group, topic, partition) -> when its committed offsets were seen, oldest first
    seen: dict[tuple[str, str, int], list[tuple[int, int]]] = field(default_factory=dict)

    def commit(self, group: str, topic: str, partition: int, offset: int, seen_ms: int) -> None:
        """The group commits ``offset``, seen at ``seen_ms`` (never before an earlier sight)."""
        self.committed[(group, topic, partition)] = offset
        history = self.seen.setdefault((group, topic, partition), [])
        history.append((max([seen_ms, *(t for t, _ in history[-1:])]), offset))

    def history_of(self, cluster: str, group: str, topic: str, partition: int) -> CommitHistory | None:
        seen = self.seen.get((group, topic, partition))
        return CommitHistory.of(seen) if seen else None

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
    reported: dict[str, int | None] = field(default_factory=dict)  # hop id -> copies counted (to_report)
    next_check: int = 0


class OneByOne:
    """The reference: one state per message, decide on new traces or when its next check is due."""

    def __init__(self, registry: Registry) -> None:
        self.registry, self.states = registry, {}  # type: ignore[var-annotated]

    def evaluate(
        self, new: Sequence[Trace], now: int, world: World, pointed_at: PointerLookup = nothing_pointed_at
    ) -> list[Verdict]:
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
                              CONFIG, pointed_at, removed=world.removed, record=world.record,
                              history=world.history_of)  # fmt: skip
            fresh = to_report(decision.verdicts, state.reported)
            out.extend(fresh)
            if decision.done:
                del states[message_id]
                continue
            state.reported = reported_now(state.reported, fresh)
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
        faults = ["none", "lost trace", "skip", "drop", "reread", "retry", "written again"]
        weights = [60, 10, 8, 7, 8, 7, 8]
        if world is not None:
            faults, weights = [*faults, "committed", "aborted", "compacted"], [*weights, 10, 8, 8]
        fault = rng.choices(faults, weights)[0]
        hops = [
            ("p", TraceType.SENT, "in", in_at, None),
            ("proc", TraceType.RECEIVED, "in", in_at, "proc"),
            ("proc", TraceType.SENT, "out", out_at, None),
            ("s1", TraceType.RECEIVED, "out", out_at, "s1"),
            ("s2", TraceType.RECEIVED, "out", out_at, "s2"),
        ]
        later: list[tuple[int, tuple[str, TraceType, str, int, str | None]]] = []  # (batches later, hop)
        if fault == "lost trace":
            hops.pop(rng.randrange(len(hops)))
        elif fault == "skip":
            hops.pop(rng.choice([1, 3, 4]))
        elif fault == "drop":
            hops = hops[:2]
        elif fault == "reread":
            hops.append(rng.choice(hops[3:]))
        elif fault == "written again":  # proc wrote it again (a rebalance); both sinks read the copy, batches later:
            again_at, late = next_offset["out"], rng.randrange(1, 5)  # most while the message is still in flight
            next_offset["out"] += 1
            later = [(late, ("proc", TraceType.SENT, "out", again_at, None))]
            for group in ("s1", "s2"):
                later.append((late + rng.randrange(2), (group, TraceType.RECEIVED, "out", again_at, group)))
            if rng.random() < 0.3:  # and a sink's trace of the first copy was lost
                hops.pop(rng.choice([3, 4]))
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
        for late, (loc, kind, topic, offset, group) in later:
            out.append((batch + late, trace(m, "orders", loc, kind, topic, offset, group, ts + 1_000 * late)))
    return out


HOP_IDS = RoutePlans.of(REGISTRY).described()["hop"]


RECEIPTS = ("DELIVERED", "DUPLICATE", "TRACE_LOST")  # the verdicts that count a hop's traced copies


def report(v: Mapping[str, Any] | Verdict) -> tuple[Any, ...]:
    """(message, hop, the state that reported it, kind, copies): what reported_again looks at."""
    message_id, hop, kind, _, count, *_ = key(v)
    first_seen = v["first_seen_ms"] if isinstance(v, Mapping) else v.first_seen_ms
    return message_id, hop, int(first_seen), kind, count


def reported_again(reports: Sequence[tuple[Any, ...]]) -> int:
    """How many reports (:func:`report`, in the order made) were of a hop the same state reported before; each must
    be what decide.to_report allows: a receipt counting more traced copies than the hop's previous receipt, or a
    receipt where a LOST was reported. (A state
    started by traces arriving after the message was decided reports afresh: the store settles that.)"""
    copies: dict[tuple[str, str, int], int | str] = {}  # the copies a receipt counted, or the verdict
    again = 0
    for message_id, hop, first_seen, kind, count in reports:
        if (message_id, hop, first_seen) in copies:
            before = copies[(message_id, hop, first_seen)]
            changed = before == "LOST" or (isinstance(before, int) and count > before)
            assert kind in RECEIPTS and changed, (message_id, hop, kind, count, before)
            again += 1
        copies[(message_id, hop, first_seen)] = count if kind in RECEIPTS else kind
    return again


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
    lookups = Lookups(
        world.committed_of, world.start_of, removed=world.removed, record=world.record, history=world.history_of
    )
    expected: list[tuple[Any, ...]] = []
    got: list[tuple[Any, ...]] = []
    reports: list[tuple[Any, ...]] = []
    expected_reports: list[tuple[Any, ...]] = []
    clean = judged = 0
    now = 100_000
    for step in range(40):
        new = [t for batch, t in arrivals if batch == step]
        for group, topic in (("proc", "in"), ("s1", "out"), ("s2", "out"), ("merge", "f1"), ("merge", "f2")):
            if rng.random() < 0.6:  # the groups commit on, now and then, past what they read
                current = world.committed.get((group, topic, 0), 0)
                # seen before this evaluation (a detector behind on the trace topic), or only now
                seen = now - rng.choice([0, 0, 10_000, 40_000])
                world.commit(group, topic, 0, current + rng.randrange(0, 60), seen)
        if step == 25:
            world.log_start[("out", 0)] = 3  # retention moved past the first records of out
        from_alone = alone.evaluate(new, now, world)
        expected += [key(v) for v in from_alone]
        evaluation = bucket.evaluate(state, rows_of(new, REGISTRY) if new else None, now, lookups)
        state = BucketState.decode(evaluation.state.encode())  # as Spark keeps it between batches
        rows = evaluation.verdicts.to_dict("records")
        got += [key(row) for row in rows]
        reports += [report(row) for row in rows]
        expected_reports += [report(v) for v in from_alone]
        clean += evaluation.clean_messages
        judged += evaluation.judged_messages
        now += rng.choice([5_000, 7_000, 20_000])
    again = reported_again(reports)  # a hop reported again only when more copies reached it
    assert again == reported_again(expected_reports)
    print(f"seed {seed}: {len(got)} verdicts, {again} of them a hop reported again with more copies")
    assert Counter(got) == Counter(expected)  # the same verdicts, as often (a None beside a number does not sort)
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
    owner: team-t
    route:
      producers: [{location: a, writes: [local/a]}]
      consumers: [{group: ga, location: ga, reads: [local/a]}]
  orders:
    owner: team-t
    route:
      producers: [{location: p, writes: [local/in]}]
      consumers:
        - {group: proc, location: proc, reads: [local/in], writes: [local/out]}
        - {group: s1, location: s1, reads: [local/out]}
        - {group: s2, location: s2, reads: [local/out]}
        - {group: s3, location: s3, reads: [local/out]}
  fanin:
    owner: team-t
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
    assert Counter(got) == Counter(expected)  # the same verdicts, as often (a None beside a number does not sort)
    assert any(v[1] == "local/out -> s3" for v in got)  # the new group's hop judged for messages kept before


def test_a_state_kept_before_trace_format_3_is_judged_after_an_upgrade() -> None:
    """A bucket's state written by an earlier version (its traces without the key hash and flags, its messages
    without what was reported of them) is read by this one: new traces join it and the old ones are judged as
    traces without them."""
    rng = random.Random(7)
    arrivals = random_messages(rng, 40)
    world = World()
    judge = BucketJudge(RoutePlans.of(REGISTRY), CONFIG)
    lookups = Lookups(world.committed_of, world.start_of, removed=world.removed)
    first = judge.evaluate(BucketState.empty(), rows_of([t for b, t in arrivals if b == 0], REGISTRY), 100_000, lookups)
    older = first.state.traces.drop_columns(["key_hash", "tombstone", "transactional", "read_uncommitted"])
    sink = pa.BufferOutputStream()
    for table in (older, first.state.messages.drop_columns(["reported"])):
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    kept = BucketState.decode(bytes(sink.getvalue()))  # as Spark hands the previous version's blob back
    assert kept.traces.schema == TRACE_STATE and kept.traces.num_rows == first.state.traces.num_rows
    assert kept.traces.column("transactional").null_count == kept.traces.num_rows
    assert kept.messages.schema == MESSAGE_STATE  # and its messages without what was reported of them
    later = judge.evaluate(kept, rows_of([t for b, t in arrivals if b == 1], REGISTRY), 105_000, lookups)
    again = judge.evaluate(first.state, rows_of([t for b, t in arrivals if b == 1], REGISTRY), 105_000, lookups)
    assert later.verdicts.to_dict("records") == again.verdicts.to_dict("records")  # judged as if never upgraded


@pytest.mark.parametrize(
    ("first_trace_lost", "pointer", "s1_reports"),
    [
        (False, False, [("DELIVERED", None, 1), ("DUPLICATE", "producer_retry", 2)]),
        (True, True, [("TRACE_LOST", None, 0), ("DELIVERED", None, 1)]),
        (True, False, [("LOST", "skipped_by_consumer", 0), ("DELIVERED", None, 1)]),
    ],
)
def test_copies_that_reach_a_reported_hop_while_the_message_is_in_flight_are_reported_at_once(
    first_trace_lost: bool, pointer: bool, s1_reports: list[tuple[Any, ...]]
) -> None:
    """The CI case of the one-broker freeze: an at-least-once processor, dropped from its group, wrote the message
    again while the message was still in flight (s2 had not committed past it yet), after s1's verdict had been
    reported; s1 then read the copy too. s1's hop is reported again, by the bucket and the one-message reference
    alike: a DUPLICATE of two copies; or, when s1's first RECEIVED trace was lost, DELIVERED, the one receipt traced,
    where s1 was reported TRACE_LOST (its emitter's later trace pointed back at it, as in a route-cluster freeze run)
    or LOST (nothing pointed back: the store retracts it, settle case 42). Each hop's last report is what decide
    says with every trace, as reconciliation would."""
    world = World()
    seq = iter(range(100))

    def trace(loc: str, kind: TraceType, topic: str, offset: int, group: str | None, at: int) -> Trace:
        return Trace("m", "orders", loc, "local", kind, at, topic, 0, offset, group, f"{loc}-e", next(seq), 100.0)

    first = [
        trace("p", TraceType.SENT, "in", 0, None, 1_000),
        trace("proc", TraceType.RECEIVED, "in", 0, "proc", 1_010),
        trace("proc", TraceType.SENT, "out", 0, None, 1_020),
        trace("s1", TraceType.RECEIVED, "out", 0, "s1", 1_030),
        trace("s2", TraceType.RECEIVED, "out", 0, "s2", 1_040),
    ]
    if first_trace_lost:
        first.pop(3)

    def pointed_at(location: str, cluster: str, topic: str, partition: int, offset: int) -> bool:
        return pointer and (location, topic, offset) == ("s1", "out", 0)  # s1's next trace points back

    copy = [
        trace("proc", TraceType.SENT, "out", 1, None, 60_000),
        trace("s1", TraceType.RECEIVED, "out", 1, "s1", 60_010),
    ]
    copy_read_by_s2 = [trace("s2", TraceType.RECEIVED, "out", 1, "s2", 95_000)]
    world.committed.update({("proc", "in", 0): 1, ("s1", "out", 0): 1})  # s2 has not committed yet
    alone, bucket = OneByOne(REGISTRY), BucketJudge(RoutePlans.of(REGISTRY), CONFIG)
    lookups = Lookups(world.committed_of, world.start_of, pointed_at, removed=world.removed, record=world.record)
    state = BucketState.empty()
    got: list[dict[str, Any]] = []
    expected: list[Verdict] = []
    s1 = "local/out -> s1"
    now = 100_000
    for step, new in enumerate([first, [], copy, [], copy_read_by_s2, [], []]):
        if step == 2:
            world.committed[("s1", "out", 0)] = 2  # s1 read the copy and committed past it
        if step == 4:
            world.committed[("s2", "out", 0)] = 2
        expected += alone.evaluate(new, now, world, pointed_at)
        evaluation = bucket.evaluate(state, rows_of(new, REGISTRY) if new else None, now, lookups)
        state = BucketState.decode(evaluation.state.encode())
        got += evaluation.verdicts.to_dict("records")
        if step == 1:  # s1's first report, while s2 and the processor's write are still open
            assert [key(r)[2:5] for r in got if key(r)[1] == s1] == s1_reports[:1]
            assert state.messages.num_rows == 1
        now += 35_000
    assert sorted(key(r) for r in got) == sorted(key(v) for v in expected)
    assert reported_again([report(r) for r in got]) == 1
    assert [key(r)[2:5] for r in got if key(r)[1] == s1] == s1_reports
    last = {key(r)[1]: key(r)[2:5] for r in got}

    def with_every_trace(memo: dict[str, int], at: int) -> Any:
        return decide("m", REGISTRY.streams["orders"], [*first, *copy, *copy_read_by_s2], world.committed_of, memo,
                      100_000, at, CONFIG, pointed_at, removed=world.removed, record=world.record)  # fmt: skip

    seen = with_every_trace({}, now)  # the groups first seen past it now; judged once the grace has gone by
    everything = with_every_trace(dict(seen.passed_at), now + CONFIG.grace_ms)
    assert everything.done
    assert last == {v.hop: key(v)[2:5] for v in everything.verdicts}
    assert state.messages.num_rows == 0  # decided: nothing left in flight


@pytest.mark.parametrize("pointer_in_the_batch", [False, True])
def test_a_lost_decided_on_the_running_batchs_clock_is_decided_again_on_the_pointers_stored_after_it(
    pointer_in_the_batch: bool,
) -> None:
    """s1's RECEIVED trace never arrives; s1 committed past the message. The finished batches have read to
    before the commit was seen plus the grace, the running one will have read past it: the LOST comes a batch
    earlier than on the finished batches' clock, marked as decided ahead, and the message stays for one more
    evaluation. The writer holds it back when a record of the running batch points at s1's record (that pointer
    is stored after the batch); the next evaluation then finds the pointer and reports TRACE_LOST, which the store
    keeps as the hop's verdict. Without such a record the LOST stands and is not reported twice."""
    world = World()
    seq = iter(range(100))

    def trace(loc: str, kind: TraceType, topic: str, group: str | None, at: int) -> Trace:
        return Trace("m", "orders", loc, "local", kind, at, topic, 0, 0, group, f"{loc}-e", next(seq), 100.0)

    traces = [
        trace("p", TraceType.SENT, "in", None, 1_000),
        trace("proc", TraceType.RECEIVED, "in", "proc", 1_010),
        trace("proc", TraceType.SENT, "out", None, 1_020),
        trace("s2", TraceType.RECEIVED, "out", "s2", 1_040),
    ]
    world.committed.update({("proc", "in", 0): 1, ("s1", "out", 0): 1, ("s2", "out", 0): 1})
    stored_pointers: set[tuple[str, str, str, int, int]] = set()

    def pointed_at(location: str, cluster: str, topic: str, partition: int, offset: int) -> bool:
        return (location, cluster, topic, partition, offset) in stored_pointers

    clocks = {"read": 0, "running": 0}
    ahead = Lookups(world.committed_of, world.start_of, pointed_at, removed=world.removed, record=world.record,
                    read_to=lambda now: clocks["read"], running_read_to=lambda now: clocks["running"])  # fmt: skip
    behind = dataclasses.replace(ahead, running_read_to=None)
    plans = RoutePlans.of(REGISTRY)
    bucket = BucketJudge(plans, CONFIG)
    s1 = "local/out -> s1"

    seen = bucket.evaluate(BucketState.empty(), rows_of(traces, REGISTRY), 100_000, ahead)  # s1 first seen past it
    assert seen.verdicts.empty
    clocks.update(read=110_000, running=131_000)  # read to 10 s past the sight; the running batch: 31 s past it
    on_the_finished_clock = bucket.evaluate(seen.state, None, 131_000, behind)
    assert s1 not in {key(r)[1] for r in on_the_finished_clock.verdicts.to_dict("records")}  # waits a batch more
    decided = bucket.evaluate(seen.state, None, 131_000, ahead)
    lost = [r for r in decided.verdicts.to_dict("records") if key(r)[1] == s1]
    assert [(key(r)[2], key(r)[3], r["judged_by"]) for r in lost] == [("LOST", "skipped_by_consumer", AHEAD)]
    assert decided.state.messages.num_rows == 1  # every hop decided, yet kept for the next batch
    assert decided.next_check_ms == 131_001

    # the writer: s1's next RECEIVED trace, in the same batch, points back at offset 0 of local/out
    pointed = [("s1", "local", "out", 0, 0)] if pointer_in_the_batch else []
    table = pa.Table.from_pandas(decided.verdicts, preserve_index=False)
    held = held_back(table, pointed, plans.described())
    assert [bool(h) for h, r in zip(held, decided.verdicts.to_dict("records"), strict=True) if key(r)[1] == s1] == [
        pointer_in_the_batch
    ]
    stored_pointers.update(pointed)  # stored by the writer after that batch

    clocks.update(read=131_000, running=134_000)
    again = bucket.evaluate(BucketState.decode(decided.state.encode()), None, 134_000, ahead)
    reported = [(key(r)[1], key(r)[2], r["judged_by"]) for r in again.verdicts.to_dict("records")]
    assert reported == ([(s1, "TRACE_LOST", "decide")] if pointer_in_the_batch else [])
    assert again.state.messages.num_rows == 0


def test_a_state_given_in_many_chunks_is_kept_as_one_record_batch_per_table() -> None:
    """Every batch adds the new traces as a chunk of their own, and the state is decoded, grown and encoded again:
    kept as it came, its chunks would only grow in number, and so would the time to write them."""
    chunks = [
        pa.Table.from_pylist([{"message_id": f"m{n}", "stream": "orders", "hop": 0}], schema=TRACE_STATE)
        for n in range(40)
    ]
    state = BucketState(pa.concat_tables(chunks), MESSAGE_STATE.empty_table())
    assert state.traces.column("message_id").num_chunks == 40
    blob = state.encode()
    stream = pyarrow.ipc.open_stream(pa.BufferReader(blob))
    assert sum(1 for _ in stream) == 1  # the traces: one record batch
    again = BucketState.decode(blob)
    assert again.traces.column("message_id").to_pylist() == [f"m{n}" for n in range(40)]
