"""The vectorised judge of clean messages gives exactly decide's answer wherever it answers.

Two proofs: the rule table's cases whose traces are clean (tests/unit/detector/test_decide.py), and
thousands of random messages on random simple routes — random hops missing, random committed offsets,
memos, log starts, clocks — each judged both ways.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest

from khipu.detector.bucket import BucketJudge, BucketState, Lookups
from khipu.detector.clean import CleanGrid, delivered_cells, judge_clean
from khipu.detector.decide import decide, memo_key, resend_of
from khipu.detector.model import (
    NONE,
    UNKNOWN_FATE,
    CommitHistory,
    DetectorConfig,
    RecordFate,
    RecordState,
    Removal,
)
from khipu.detector.routes import RoutePlan, RoutePlans
from khipu.registry import parse_registry
from khipu.registry.model import Hop, HopKind, Registry, Stream, TopicRef
from khipu.trace.model import Trace, TraceType
from khipu.verdicts.model import VerdictKind
from tests.routes import FAN_OUT_REGISTRY
from tests.unit.detector.test_bucket import rows_of
from tests.unit.detector.test_decide import CASES, CONFIG, STREAM

Position = tuple[int, int]


@dataclass(frozen=True)
class World:
    """What the lookups answer: committed offsets per (group, topic), log starts per topic."""

    committed: Mapping[tuple[str, str], int | None]
    log_start: Mapping[str, int | None]
    fates: Mapping[tuple[str, int], RecordFate] = field(default_factory=dict)  # (topic, offset) -> the log's answer
    # (group, topic) -> when its committed offsets were seen: ((time, committed), ...), oldest first
    history: Mapping[tuple[str, str], tuple[tuple[int, int], ...]] = field(default_factory=dict)

    def history_of(self, cluster: str, group: str, topic: str, partition: int) -> CommitHistory | None:
        seen = self.history.get((group, topic))
        return CommitHistory.of(seen) if seen else None

    def committed_of(self, cluster: str, group: str, topic: str, partition: int) -> int | None:
        return self.committed.get((group, topic))

    def removed(self, cluster: str, group: str, topic: str, partition: int, offset: int) -> Removal | None:
        start = self.log_start.get(topic)
        return Removal(start, 0, None) if start is not None and start > offset else None

    def record(self, cluster: str, topic: str, partition: int, offset: int, key: str | None) -> RecordFate:
        return self.fates.get((topic, offset), UNKNOWN_FATE)


def grid_of(
    plan: RoutePlan,
    messages: Sequence[Sequence[Trace]],
    world: World,
    memos: Sequence[Mapping[str, int]],
    first_seen_ms: Sequence[int],
    emitted: Sequence[set[str]],
) -> CleanGrid | None:
    """The grid of clean messages (None when one is not clean: the judge would not be asked)."""
    n, hops, topics = len(messages), plan.size, len(plan.topics)
    index = {hop: i for i, hop in enumerate(plan.hops)}
    present = np.zeros((n, hops), dtype=bool)
    ts = np.full((n, hops), NONE, dtype=np.int64)
    has_position = np.zeros((n, topics), dtype=bool)
    partition = np.full((n, topics), NONE, dtype=np.int64)
    offset = np.full((n, topics), NONE, dtype=np.int64)
    memo = np.full((n, hops), NONE, dtype=np.int64)
    committed = np.full((n, hops), NONE, dtype=np.int64)
    passed_since = np.full((n, hops), NONE, dtype=np.int64)
    log_start = np.full((n, hops), NONE, dtype=np.int64)
    done_before = np.zeros((n, hops), dtype=bool)
    transactional = np.zeros((n, topics), dtype=bool)
    committed_read = np.zeros((n, topics), dtype=bool)
    uncommitted = np.zeros((n, hops), dtype=bool)
    for m, traces in enumerate(messages):
        for trace in traces:
            hop = index[Hop.of_trace(trace)]
            if present[m, hop] or resend_of(trace) is not None:
                return None
            present[m, hop], ts[m, hop] = True, trace.timestamp_ms
            topic = plan.hop_topic[hop]
            transactional[m, topic] |= trace.transactional
            uncommitted[m, hop] = trace.read_uncommitted
            committed_read[m, topic] |= trace.type is TraceType.RECEIVED and not trace.read_uncommitted
            if has_position[m, topic] and (partition[m, topic], offset[m, topic]) != (trace.partition, trace.offset):
                return None
            has_position[m, topic] = True
            partition[m, topic], offset[m, topic] = trace.partition, trace.offset
        for hop, h in enumerate(plan.hops):
            done_before[m, hop] = h.id in emitted[m]
            if h.kind is HopKind.READ and has_position[m, plan.hop_topic[hop]]:
                topic = plan.hop_topic[hop]
                key = memo_key(h, (int(partition[m, topic]), int(offset[m, topic])))
                memo[m, hop] = memos[m].get(key, NONE)
                value = world.committed.get((h.group or "", h.topic.topic))
                committed[m, hop] = NONE if value is None else value
                history = world.history_of("local", h.group or "", h.topic.topic, int(partition[m, topic]))
                since = history.passed_since_ms(int(offset[m, topic])) if history is not None else None
                passed_since[m, hop] = NONE if since is None else since
                start = world.log_start.get(h.topic.topic)
                log_start[m, hop] = NONE if start is None else start
    return CleanGrid(
        present=present,
        timestamp_ms=ts,
        has_position=has_position,
        partition=partition,
        offset=offset,
        first_seen_ms=np.asarray(first_seen_ms, dtype=np.int64),
        memo_ms=memo,
        emitted=done_before,
        committed=committed,
        log_start=log_start,
        transactional=transactional,
        committed_read=committed_read,
        uncommitted=uncommitted,
        passed_since_ms=passed_since,
    )


def both_ways(
    stream: Stream,
    traces: Sequence[Trace],
    world: World,
    memo: Mapping[str, int],
    first_seen_ms: int,
    now_ms: int,
    read_to_ms: int | None,
    config: DetectorConfig,
    emitted: set[str] = frozenset(),  # type: ignore[assignment]
) -> tuple[bool, dict[str, tuple[object, ...]], bool, dict[str, int]] | None:
    """(in the domain, the clean judge's verdicts, done, memo) beside decide's, asserted equal when in the
    domain; None when the traces are not clean."""
    plan = RoutePlan.of(stream)
    grid = grid_of(plan, [traces], world, [memo], [first_seen_ms], [set(emitted)])
    if grid is None:
        return None
    clock = now_ms if read_to_ms is None else min(now_ms, read_to_ms)
    judged = judge_clean(plan, grid, now_ms, clock, config)
    expected = decide(
        "m1",
        stream,
        traces,
        world.committed_of,
        memo,
        first_seen_ms,
        now_ms,
        config,
        read_to_ms=read_to_ms,
        removed=world.removed,
        record=world.record,
        history=world.history_of,
    )
    if not judged.in_domain[0]:
        return False, {}, False, {}
    cells = delivered_cells(plan, grid, judged.deliver)
    got = {
        plan.hops[int(hop)].id: (
            int(cells.partition[i]),
            int(cells.offset[i]),
            int(cells.observed_ms[i]),
            None if cells.latency_ms[i] == NONE else int(cells.latency_ms[i]),
            None if cells.e2e_latency_ms[i] == NONE else int(cells.e2e_latency_ms[i]),
        )
        for i, hop in enumerate(cells.hop)
    }
    want = {
        v.hop: (v.partition, v.offset, v.observed_ms, v.latency_ms, v.e2e_latency_ms)
        for v in expected.verdicts
        if v.hop not in emitted
    }
    assert all(v.kind is VerdictKind.DELIVERED for v in expected.verdicts if v.hop not in emitted), expected
    assert all(v.count == 1 and v.cause is None for v in expected.verdicts)
    assert got == want
    assert bool(judged.done[0]) is expected.done
    memo_after = {
        memo_key(h, (int(grid.partition[0, plan.hop_topic[i]]), int(grid.offset[0, plan.hop_topic[i]]))): int(
            judged.memo_ms[0, i]
        )
        for i, h in enumerate(plan.hops)
        if judged.memo_ms[0, i] != NONE
    }
    assert memo_after == dict(expected.passed_at)
    return True, got, bool(judged.done[0]), memo_after


def asks_the_log(traces: Sequence[Trace]) -> bool:
    """A transactional write no read_committed receipt on its topic proves committed, or a read_uncommitted receipt
    of one: whether its transaction committed is the log's to say."""
    written = {t.topic for t in traces if t.type is TraceType.SENT and t.transactional}
    proved = {t.topic for t in traces if t.type is TraceType.RECEIVED and not t.read_uncommitted}
    unproved = {t.topic for t in traces if t.type is TraceType.RECEIVED and t.read_uncommitted}
    return bool(written - proved) or bool(written & unproved)


def passed_unread(traces: Sequence[Trace], committed: Mapping[tuple[str, str], int | None]) -> bool:
    """A group committed past the message's position on a topic it reads without a receipt there: a would-be loss,
    which the clean judge hands to decide (it asks the log)."""
    written = {t.topic: t.offset for t in traces if t.type is TraceType.SENT}
    received = {(t.group, t.topic) for t in traces if t.type is TraceType.RECEIVED}
    return any(
        topic in written and (offset or -1) > written[topic] and (group, topic) not in received
        for (group, topic), offset in committed.items()
    )


def assert_left_to_decide(
    traces: Sequence[Trace], world: World, now_ms: int, registry: Registry = FAN_OUT_REGISTRY
) -> None:
    """The bucket's own check of cleanliness (not this file's ``grid_of``) sends the message to decide: the clean
    judge answers for none of it, decide is called for it, and every verdict it gives is decide's."""
    judge = BucketJudge(RoutePlans.of(registry), CONFIG)
    lookups = Lookups(committed=world.committed_of, removed=world.removed)
    evaluation = judge.evaluate(BucketState.empty(), rows_of(traces, registry), now_ms, lookups)
    assert (evaluation.clean_messages, evaluation.judged_messages) == (0, 1)
    assert set(evaluation.verdicts["judged_by"]) <= {"decide"}


@pytest.mark.parametrize("case", CASES, ids=[f"case{c.number}" for c in CASES])
def test_the_clean_judge_agrees_with_the_rule_table(case: object) -> None:
    """Every case of decide's table whose traces are clean, judged by the clean judge: decide's answer, or
    'not mine' where decide says anything but DELIVERED."""
    committed = dict(case.committed)  # type: ignore[attr-defined]
    removed = dict(case.removed)  # type: ignore[attr-defined]
    starts = {topic: r.log_start for (_, topic), r in removed.items()}
    world = World(committed, starts, case.fates, case.history)  # type: ignore[attr-defined]
    now = case.now_ms  # type: ignore[attr-defined]
    memo: dict[str, int] = {}
    if case.passed_for_ms is not None:  # type: ignore[attr-defined]
        first = decide(
            "m1", case.stream, case.traces, world.committed_of, {}, 1000, now - case.passed_for_ms, CONFIG,  # type: ignore[attr-defined]
            removed=world.removed, record=world.record, history=world.history_of,
        )  # fmt: skip
        memo = dict(first.passed_at)
    answer = both_ways(case.stream, case.traces, world, memo, 1000, now, None, CONFIG)  # type: ignore[attr-defined]
    expected = {hop for hop, (kind, _, _) in case.expected.items()}  # type: ignore[attr-defined]
    everything_delivered = all(kind is VerdictKind.DELIVERED for kind, _, _ in case.expected.values())  # type: ignore[attr-defined]
    if answer is None:  # not clean (a duplicate, a resend, two positions): the bucket hands it to decide
        assert_left_to_decide(case.traces, world, now, case.registry)  # type: ignore[attr-defined]
        return
    in_domain, got, done, _ = answer
    if in_domain:
        assert set(got) == expected and done is case.done  # type: ignore[attr-defined]
    else:
        # the clean judge leaves what is not plainly DELIVERED, a record that may have left the log, what only the log
        # can tell (a transaction's outcome, a would-be loss), and a message past the maximum wait
        why = (
            not everything_delivered,
            bool(removed),
            asks_the_log(case.traces),  # type: ignore[attr-defined]
            passed_unread(case.traces, committed),  # type: ignore[attr-defined]
            now - 1000 >= CONFIG.max_wait_ms,
        )
        assert any(why), case.reason  # type: ignore[attr-defined]


ROUTES = [
    """producers: [{location: p, writes: [local/a]}]
      consumers: [{group: g1, location: l1, reads: [local/a]}]""",
    """producers: [{location: p, writes: [local/in]}]
      consumers:
        - {group: proc, location: proc, reads: [local/in], writes: [local/out]}
        - {group: s1, location: s1, reads: [local/out]}
        - {group: s2, location: s2, reads: [local/out]}""",
    """producers: [{location: p, writes: [local/a]}]
      consumers:
        - {group: x, location: x, reads: [local/a], writes: [local/b]}
        - {group: y, location: y, reads: [local/b], writes: [local/c, local/d]}
        - {group: z, location: z, reads: [local/c]}
        - {group: audit, location: audit, reads: [local/a]}""",
    """producers: [{location: p, writes: [local/a]}]
      consumers:
        - {group: x, location: x, reads: [local/a], writes: [local/b]}
        - {group: w, location: w, reads: [local/a], writes: [local/c]}
        - {group: r, location: r, reads: [local/b]}""",
]


def stream_of(route: str) -> Stream:
    return parse_registry(
        f"version: 1\nclusters: {{local: {{}}}}\nstreams:\n  orders:\n    owner: team-t\n    route:\n      {route}\n"
    ).stream("orders")


def random_message(
    rng: random.Random, stream: Stream, now_ms: int
) -> tuple[list[Trace], World, dict[str, int], set[str]]:
    plan = RoutePlan.of(stream)
    positions = {topic: (rng.randrange(2), rng.randrange(5, 50)) for topic in plan.topics}
    transactional = {topic for topic in plan.topics if rng.random() < 0.2}  # written in a transaction
    carried = rng.random() < 0.2  # processors stamp their writes with their input record's timestamp
    base, traces, seq = rng.randrange(0, 100_000), [], 0
    written: dict[TopicRef, int] = {}
    for i, hop in enumerate(plan.hops):
        if rng.random() < 0.18:  # this hop's trace is missing (lost, or not there yet)
            continue
        partition, offset = positions[hop.topic]
        sent = hop.kind is HopKind.WRITE
        stamped = base + 100 * i + rng.randrange(50)
        processor = stream.route.processor_writing(hop) if sent else None
        if carried and processor is not None and processor.reads[0] in written:
            stamped = written[processor.reads[0]]
        if sent:
            written[hop.topic] = stamped
        traces.append(
            Trace(
                "m1",
                "orders",
                hop.location or hop.group or "",
                "local",
                TraceType.SENT if sent else TraceType.RECEIVED,
                stamped,
                hop.topic.topic,
                partition,
                offset,
                None if sent else hop.group,
                f"e{i}",
                seq,
                100.0,
                transactional=sent and hop.topic in transactional,
                read_uncommitted=not sent and rng.random() < 0.25,
            )
        )
        seq += 1
    committed: dict[tuple[str, str], int | None] = {}
    memo: dict[str, int] = {}
    history: dict[tuple[str, str], tuple[tuple[int, int], ...]] = {}
    shown = {t.topic for t in traces}
    settled = rng.random() < 0.3  # every group long past the message: most hops are decided
    for hop in plan.hops:
        if hop.kind is HopKind.READ:
            partition, offset = positions[hop.topic]
            choices = [offset + 1] if settled else [None, offset - 3, offset, *[offset + 1, offset + 9] * 3]
            now_at = committed[(hop.group or "", hop.topic.topic)] = rng.choice(choices)
            if now_at is not None and rng.random() < 0.5:  # seen before: at the offset, then past it, from then on
                passed = base + rng.choice([-400_000, -5_000, 0, 150, 20_000, 60_000])
                steps = [(passed - 3_000, offset), (passed, offset + 1), (passed + 2_000, max(now_at, offset + 1))]
                history[(hop.group or "", hop.topic.topic)] = tuple(step for step in steps if step[1] <= now_at)
            if hop.topic.topic in shown and (settled or rng.random() < 0.6):  # first seen past it a while ago
                memo[memo_key(hop, (partition, offset))] = now_ms - (
                    300_000 if settled else rng.choice([0, 5_000, 40_000])
                )
    log_start = {hop.topic.topic: rng.choice([None, None, 0, 3, 60]) for hop in plan.hops}
    emitted = {hop.id for hop in plan.hops if rng.random() < 0.1}
    states = [RecordState.VISIBLE] * 3 + [RecordState.ABORTED, RecordState.OPEN, RecordState.COMPACTED]
    fates = {(topic.topic, positions[topic][1]): RecordFate(rng.choice(states)) for topic in plan.topics}
    return traces, World(committed, log_start, fates, history), memo, emitted


@pytest.mark.parametrize("route", range(len(ROUTES)))
def test_the_clean_judge_agrees_with_decide_on_random_messages(route: int) -> None:
    stream = stream_of(ROUTES[route])
    assert RoutePlan.of(stream).simple
    rng = random.Random(1000 + route)
    config = DetectorConfig(grace_ms=30_000, max_wait_ms=900_000, recheck_ms=5_000)
    judged = in_domain = delivered = finished = 0
    for _ in range(3000):
        first_seen = rng.randrange(0, 100_000)
        now = first_seen + rng.choice([0, 10_000, 31_000, 100_000, 400_000, 1_000_000])
        traces, world, memo, emitted = random_message(rng, stream, now)
        if not traces:
            continue
        read_to = rng.choice([None, now, now - 20_000, 0])
        answer = both_ways(stream, traces, world, memo, first_seen, now, read_to, config, emitted)
        assert answer is not None  # generated clean
        judged += 1
        if answer[0]:
            in_domain += 1
            delivered += bool(answer[1])
            finished += answer[2]
    # the domain is most of what is clean, and its answers are not only "wait" (floors, not measures: on the widest
    # route, with the random commit histories, 89 of 3,000 messages finish inside the domain)
    assert in_domain > 0.45 * judged and delivered > 0.05 * judged and finished > 0.025 * judged, (
        judged,
        in_domain,
        delivered,
        finished,
    )


def test_a_route_that_is_not_simple_is_left_to_decide() -> None:
    fan_in = stream_of(
        """producers: [{location: p, writes: [local/a]}, {location: q, writes: [local/b]}]
      consumers: [{group: g, location: g, reads: [local/a, local/b]}]"""
    )
    assert not RoutePlan.of(fan_in).simple
    assert RoutePlan.of(STREAM).simple
