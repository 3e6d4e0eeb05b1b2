"""The verdict of every hop a message reached, from its traces, its route and committed offsets.

A pure function: the traces gathered so far, the stream's route, the lookups (committed offsets and
their history, pointers, removals from the log), the memo of when each group was first seen past the message,
and ``now`` come in; verdicts, whether the message is decided, the updated memo and when to look
again go out. The streaming detector's stateful processor and the reconciliation batch both
apply it: there is one implementation of the rules.

It reads like :mod:`khipu.health.rules`: small named predicates over the facts of one hop, and an
ordered rule table per hop kind in which the first rule that holds gives the verdict.

When a hop is settled (ready to be judged):

- A read hop (topic -> group) once the group's committed offset has passed every position of
  the message on that topic and ``grace_ms`` has gone by since that was first seen (on the read-to
  clock: every trace written before then has been read). "First seen" is the commit history's first
  sight of the group past it, when the history kept shows it at or after the record's write, else the
  evaluation's: a detector reading the message late does not add its own lateness to the wait. Until
  then the message is simply on its way, however long that takes (up to ``max_wait_ms``). A record
  that left the log before the group got to it (the partition's log start passed it while the
  group's committed offset had not) is settled the same way: the group can never read it (on a compacted
  topic only once the group has gone past: a later record of its key it reads makes it SUPERSEDED).
- A write hop once the hops reading its topic are settled (and, for a processor, its input
  read); past ``max_wait_ms`` a write hop with SENT traces is judged on them.
- A topic no trace shows the message on, but which a processor evidently read it from (it wrote
  the message on, and that topic is its only input), once the trace topic has been read
  ``grace_ms`` past the time the detector first saw the message (its traces there, had they been
  written, would have been read by then). Other groups reading it wait, then go to reconciliation.

Every hop the message reached goes through its kind's table (:data:`READ_RULES`, :data:`WRITE_RULES`):
the first rule that holds gives its verdict, or says it waits. A hop still open ``max_wait_ms`` after the
first trace is PENDING (handed to reconciliation); an open one waits; a settled one gets what its
evidence says. Hops past a loss get no verdict: the message never got there (a processor's output is
judged only once an input read of it got the message, or is still open).

**A resent record** (Khipu's resend of a confirmed loss; its RECEIVED traces carry the resend id and
the lost hop as attributes) is evidence of its own kind. Resent for one group's read hop, its position
is that group's alone: the other groups reading the topic pass over it and are not judged on it.
Resent for a write hop, it is an ordinary record on the topic for every reader. Once the hop the
resend names is settled on it, its verdict is RESENT (not DELIVERED, not a duplicate of the original);
hops past it are judged as usual (a processor given the resent record that drops it again: LOST).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from khipu.detector.model import (
    CommitHistoryLookup,
    CommittedLookup,
    DetectorConfig,
    PointerLookup,
    RecordFate,
    RecordLookup,
    RecordState,
    Removal,
    RemovalLookup,
    no_history,
    nothing_asked,
    nothing_pointed_at,
    nothing_removed,
    removal_cause,
)
from khipu.registry.model import ConsumerSpec, Hop, HopKind, Stream, TopicRef
from khipu.trace.model import Trace, TraceType
from khipu.tracing.headers import ATTRIBUTE_RESEND_HOP, ATTRIBUTE_RESEND_ID
from khipu.verdicts.model import RECEIPT_KINDS, Cause, Verdict, VerdictKind

Position = tuple[int, int]  # (partition, offset)
UNDECIDED = frozenset({RecordState.OPEN, RecordState.UNAVAILABLE})  # what the log cannot tell yet: the hop waits


@dataclass(frozen=True, slots=True)
class Decision:
    verdicts: tuple[Verdict, ...]
    done: bool
    passed_at: Mapping[str, int] = field(default_factory=dict)
    next_check_ms: int | None = None


class LookupUnavailable(RuntimeError):
    """A lookup could not ask (its cluster or the store did not answer): the message waits and is looked at
    again, never judged on an answer nobody gave. Raised by the pointer and removal lookups; a committed-offset
    lookup that cannot ask answers None (not known: the hop waits), never "not committed"."""


@dataclass(frozen=True, slots=True)
class Lookups:
    """What the rules may ask of the world beyond the traces (all side-effect free)."""

    committed: CommittedLookup
    pointed_at: PointerLookup = nothing_pointed_at
    removed: RemovalLookup = nothing_removed
    record: RecordLookup = nothing_asked
    history: CommitHistoryLookup = no_history  # when committed offsets were seen: a commit seen before its message


# -- the evidence: a message's traces, by hop and by position ---------------------------------------------


@dataclass(frozen=True, slots=True)
class Evidence:
    sent: Mapping[Hop, tuple[Trace, ...]]
    received: Mapping[Hop, tuple[Trace, ...]]
    positions: Mapping[TopicRef, Mapping[Position, int | None]]  # position -> when written (None: not seen)
    targeted: Mapping[Hop, Mapping[Position, int | None]] = field(default_factory=dict)  # resent for one group
    resent: Mapping[str, tuple[Trace, ...]] = field(default_factory=dict)  # lost hop id -> its resend's traces
    resent_at: Mapping[TopicRef, frozenset[Position]] = field(default_factory=dict)  # positions of resent records
    sent_at: Mapping[TopicRef, Mapping[Position, Trace]] = field(default_factory=dict)  # the SENT trace there
    # positions a read_committed group received: such a receipt proves the record's transaction committed
    committed_reads: Mapping[TopicRef, frozenset[Position]] = field(default_factory=dict)

    def written_on(self, topic: TopicRef) -> bool:
        """The message is on ``topic`` at a position its route wrote (not only as Khipu's resend)."""
        resent = self.resent_at.get(topic, frozenset())
        return any(position not in resent for position in self.positions.get(topic, {}))

    def positions_for(self, hop: Hop) -> Mapping[Position, int | None]:
        """The message's positions a read hop is judged on: the topic's, and a resend meant for its group."""
        targeted = self.targeted.get(hop)
        shared = self.positions.get(hop.topic, {})
        return {**shared, **targeted} if targeted else shared

    def topics(self) -> set[TopicRef]:
        return {*self.positions, *(hop.topic for hop in self.targeted)}


def resend_of(trace: Trace) -> tuple[str, str] | None:
    """(resend id, lost hop id) of a resent record's RECEIVED trace; None for any other trace."""
    resend_id, hop = trace.attributes.get(ATTRIBUTE_RESEND_ID), trace.attributes.get(ATTRIBUTE_RESEND_HOP)
    return (resend_id, hop) if resend_id and hop and trace.type is TraceType.RECEIVED else None


def gather(traces: Sequence[Trace]) -> Evidence:
    sent: dict[Hop, list[Trace]] = {}
    received: dict[Hop, list[Trace]] = {}
    positions: dict[TopicRef, dict[Position, int | None]] = {}
    targeted: dict[Hop, dict[Position, int | None]] = {}
    resent: dict[str, list[Trace]] = {}
    resent_at: dict[TopicRef, set[Position]] = {}
    sent_at: dict[TopicRef, dict[Position, Trace]] = {}
    committed_reads: dict[TopicRef, set[Position]] = {}
    for trace in sorted(traces, key=lambda t: (t.timestamp_ms, t.emitter_id, t.emitter_seq)):
        hop = Hop.of_trace(trace)
        position = (trace.partition, trace.offset)
        if trace.type is TraceType.SENT:
            at = positions.setdefault(hop.topic, {})
            sent.setdefault(hop, []).append(trace)
            at[position] = trace.timestamp_ms if at.get(position) is None else at[position]
            sent_at.setdefault(hop.topic, {}).setdefault(position, trace)
            continue
        received.setdefault(hop, []).append(trace)
        if not trace.read_uncommitted:
            committed_reads.setdefault(hop.topic, set()).add(position)
        resend = resend_of(trace)
        if resend is not None:
            resent.setdefault(resend[1], []).append(trace)
            resent_at.setdefault(hop.topic, set()).add(position)
        mine_only = resend is not None and resend[1] == hop.id  # resent for this group's read hop alone
        (targeted.setdefault(hop, {}) if mine_only else positions.setdefault(hop.topic, {})).setdefault(position, None)
    return Evidence(
        {hop: tuple(ts) for hop, ts in sent.items()},
        {hop: tuple(ts) for hop, ts in received.items()},
        positions,
        targeted,
        {hop: tuple(ts) for hop, ts in resent.items()},
        {topic: frozenset(at) for topic, at in resent_at.items()},
        sent_at,
        {topic: frozenset(at) for topic, at in committed_reads.items()},
    )


# -- the moment of judgement: everything fixed for one evaluation -----------------------------------------


@dataclass(frozen=True, slots=True)
class Moment:
    message_id: str
    stream: Stream
    evidence: Evidence
    lookups: Lookups
    config: DetectorConfig
    now_ms: int
    clock_ms: int  # now, or the time up to which the trace topic is read, if earlier
    first_seen_ms: int
    implied: tuple[TopicRef, ...]  # topics the message evidently passed with no trace there
    source_sent_ms: int | None
    fates: dict[tuple[TopicRef, Position], RecordFate] = field(default_factory=dict)  # asked once per evaluation

    @property
    def timed_out(self) -> bool:
        """Past the maximum wait: what is open goes PENDING; write hops are judged on the SENT there is."""
        return self.clock_ms - self.first_seen_ms >= self.config.max_wait_ms

    @property
    def transaction_timed_out(self) -> bool:
        """Past the maximum wait and Kafka's own bound on a transaction (``open_transaction_wait_ms``): a hop waiting on
        one goes PENDING. A slow commit never shows as PENDING; a hanging transaction still leaves the state."""
        return self.clock_ms - self.first_seen_ms >= self.config.max_wait_ms + self.config.open_transaction_wait_ms

    def fate(self, topic: TopicRef, position: Position) -> RecordFate:
        """The record at a position of the message, as its log tells it (asked of the cluster once per evaluation;
        with the key hash of the SENT trace there, to look for a later record of its key)."""
        key = (topic, position)
        if key not in self.fates:
            sent = self.evidence.sent_at.get(topic, {}).get(position)
            key_hash = sent.key_hash if sent is not None else None
            self.fates[key] = self.lookups.record(topic.cluster, topic.topic, position[0], position[1], key_hash)
        return self.fates[key]

    def transaction_outcome(self, topic: TopicRef, position: Position) -> RecordState:
        """VISIBLE, ABORTED or OPEN for a record written in a transaction (VISIBLE for any other): a read_committed
        receipt proves the commit; otherwise the log is asked (UNAVAILABLE: the cluster could not be asked; a log
        that has no answer, e.g. the record left it since, counts as VISIBLE: it was written)."""
        sent = self.evidence.sent_at.get(topic, {}).get(position)
        if sent is None or not sent.transactional or position in self.evidence.committed_reads.get(topic, ()):
            return RecordState.VISIBLE
        state = self.fate(topic, position).state
        return state if state in UNDECIDED or state is RecordState.ABORTED else RecordState.VISIBLE

    @property
    def overdue(self) -> bool:
        """On its way longer than the grace: worth asking whether an unread record left the log."""
        return self.clock_ms - self.first_seen_ms >= self.config.grace_ms


def verdict(
    moment: Moment,
    hop: Hop,
    *,
    kind: VerdictKind,
    detail: str,
    cause: Cause | None = None,
    count: int = 0,
    at: Position | None = None,
    trace: Trace | None = None,
    latency_ms: int | None = None,
) -> Verdict:
    observed = trace.timestamp_ms if trace else None
    source = moment.source_sent_ms
    return Verdict(
        message_id=moment.message_id,
        stream=moment.stream.name,
        hop=hop.id,
        hop_kind=hop.kind.value,
        kind=kind,
        cause=cause,
        count=count,
        topic=hop.topic.topic,
        partition=at[0] if at else None,
        offset=at[1] if at else None,
        group=hop.group,
        location=hop.location,
        observed_ms=observed,
        latency_ms=latency_ms,
        e2e_latency_ms=observed - source if observed is not None and source is not None else None,
        decided_ms=moment.now_ms,
        detail=detail,
        first_seen_ms=moment.first_seen_ms,
    )


# -- what the route says of a message ---------------------------------------------------------------------


def implied_topics(stream: Stream, evidence: Evidence) -> tuple[TopicRef, ...]:
    """Topics the message evidently passed though no trace shows it there: the single input of a
    processor that wrote it on (its SENT traces, or the message seen on an output only it writes)."""
    route = stream.route
    implied: list[TopicRef] = []

    def wrote_on(processor: ConsumerSpec, out: TopicRef) -> bool:
        if Hop.write(processor.location, out) in evidence.sent:
            return True
        only_writer = route.writers_of(out) == (Hop.write(processor.location, out),)
        return only_writer and (evidence.written_on(out) or out in implied)

    changed = True
    while changed:
        changed = False
        for processor in (c for c in route.consumers if c.is_processor and len(c.reads) == 1):
            source = processor.reads[0]
            if source in evidence.positions or Hop.read(source, processor.group) in evidence.targeted:
                continue
            if source in implied:
                continue
            if any(wrote_on(processor, out) for out in processor.writes):
                implied.append(source)
                changed = True
    return tuple(implied)


def arrived_past(moment: Moment, hop: Hop) -> bool:
    """A processor that writes on what it received: its SENT traces (or the message on its outputs)
    prove it got the message."""
    processor = moment.stream.route.reader(hop.topic, hop.group or "")
    if processor is None or not processor.is_processor:
        return False
    evidence = moment.evidence
    return any(
        Hop.write(processor.location, out) in evidence.sent or evidence.positions.get(out) or out in moment.implied
        for out in processor.writes
    )


def memo_key(hop: Hop, position: Position) -> str:
    """The memo's key of a read hop at one of the message's positions (``hop id|partition|offset``): when its
    group was first seen past that position."""
    return f"{hop.id}|{position[0]}|{position[1]}"


# -- read hops --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadProgress:
    """Whether a read hop is settled, and if not, when to look again."""

    settled: bool
    next_check_ms: tuple[int, ...] = ()
    removals: Mapping[Position, Removal] = field(default_factory=dict)
    passed_at: Mapping[str, int] = field(default_factory=dict)  # memo entries for the hop's positions


def implied_read_settles_ms(moment: Moment) -> int:
    """The message's traces on an implied topic, had they been written, are read by then."""
    return moment.first_seen_ms + moment.config.grace_ms


def first_seen_past_ms(moment: Moment, hop: Hop, position: Position) -> int:
    """When the group's commit was first seen past a position it is past now: the first time the commit history
    kept of it shows it past (the commit came at or before then), when that is at or after the record's own write;
    now otherwise. A history that saw the group past the offset before the record there was written (a topic made
    again, a broker that answered at the same address before) says nothing of this record, and neither does one
    when the write time is not known: the wait then starts now, as without a history. So a detector that reads the
    message late (behind on the trace topic) waits the grace from the commit, not from its own late reading."""
    assert hop.group is not None
    written = moment.evidence.positions_for(hop).get(position)
    if written is None:
        return moment.now_ms
    history = moment.lookups.history(hop.topic.cluster, hop.group, hop.topic.topic, position[0])
    since = history.passed_since_ms(position[1]) if history is not None else None
    return moment.now_ms if since is None or since < written else min(moment.now_ms, since)


def read_progress(moment: Moment, hop: Hop, memo: Mapping[str, int]) -> ReadProgress:
    """Settled once the group's committed offset passed every position of the message (or the record left
    the log first; for a group that keeps its offsets outside Kafka, once it received the record there) and the
    grace has gone by since that was first seen. A hop of an implied topic (no trace
    says where the message sat) is settled once the trace topic is read the grace past the message's first
    sight: its traces there, had they been written, would have been read by then."""
    assert hop.group is not None
    lookups, config = moment.lookups, moment.config
    positions = moment.evidence.positions_for(hop)
    if not positions:
        if not arrived_past(moment, hop):  # nothing to compare committed offsets with
            return ReadProgress(False)
        settles = implied_read_settles_ms(moment)
        settled = moment.clock_ms >= settles
        return ReadProgress(settled, () if settled else (max(settles, moment.now_ms + 1),))
    settled = True
    checks: list[int] = []
    removals: dict[Position, Removal] = {}
    passed_at: dict[str, int] = {}
    # a group that keeps its offsets outside Kafka never commits past a record: its receipt passes it instead
    received = (
        set()
        if moment.stream.route.commits_offsets(hop)
        else {(t.partition, t.offset) for t in moment.evidence.received.get(hop, ())}
    )
    for partition, offset in sorted(positions):
        committed = lookups.committed(hop.topic.cluster, hop.group, hop.topic.topic, partition)
        passed = (committed is not None and committed > offset) or (partition, offset) in received
        # a record the group has not reached is asked after (it may have left the log) only once the message
        # has been on its way longer than the grace: most are passed by then, and asking costs
        if not passed and moment.overdue:
            gone = lookups.removed(hop.topic.cluster, hop.group, hop.topic.topic, partition, offset)
            # out of the log before the group got to it: final too, but on a compacted topic (compact,delete), where
            # a later record of its key the group reads is what it is owed, only once the group has gone past
            if gone is not None:
                fate = moment.fate(hop.topic, (partition, offset))
                if not fate.compacted_topic and fate.state is not RecordState.UNAVAILABLE:
                    removals[(partition, offset)] = gone
        if passed or (partition, offset) in removals:
            key = memo_key(hop, (partition, offset))
            seen = memo.get(key)
            if seen is None:
                by_commit = committed is not None and committed > offset
                seen = first_seen_past_ms(moment, hop, (partition, offset)) if by_commit else moment.now_ms
            passed_at[key] = seen
            if moment.clock_ms - seen < config.grace_ms:
                settled = False
                checks.append(seen + config.grace_ms)
        else:
            settled = False
            checks.append(moment.now_ms + config.recheck_ms)
    return ReadProgress(settled, tuple(checks), removals, passed_at)


@dataclass(frozen=True, slots=True)
class ReadFacts:
    """A read hop: what its traces and the world say."""

    hop: Hop
    settled: bool
    receives: tuple[Trace, ...]
    positions: Mapping[Position, int | None]
    at: Position | None  # the first receive's position, else the message's first position on the topic
    arrived_past: bool
    resent: tuple[Trace, ...]  # the RECEIVED traces of Khipu's resend for a loss at this hop
    pointed: Position | None  # a position the group's location says it received (pointer or mark)
    removal: Removal | None  # the record at ``at`` left the log before the group read it
    timed_out: bool
    fate: RecordFate | None = None  # no receipt: the record at ``at`` as its log tells it
    receipts_aborted: bool = False  # every receipt was of a record whose transaction aborted (read_uncommitted)
    reprocessed: bool = False  # read again by an exactly-once processor that wrote each output once
    waits_on_transaction: bool = False  # open while Kafka has not decided a transaction it depends on
    waits_on_the_log: bool = False  # open because the cluster could not be asked: asked again at the next check

    @property
    def reads_per_position(self) -> Mapping[Position, int]:
        counts: dict[Position, int] = {}
        for trace in self.receives:
            counts[(trace.partition, trace.offset)] = counts.get((trace.partition, trace.offset), 0) + 1
        return counts


def uncommitted_receipts(moment: Moment, hop: Hop) -> list[RecordState]:
    """The transaction outcome of each position a read_uncommitted group received (it may read a record whose
    transaction later aborts, or has not ended)."""
    receives = moment.evidence.received.get(hop, ())
    positions = {(t.partition, t.offset) for t in receives if t.read_uncommitted}
    return [moment.transaction_outcome(hop.topic, position) for position in sorted(positions)]


def reprocessing(moment: Moment, hop: Hop) -> RecordState | None:
    """A processor that reads its input again is reprocessing after an aborted transaction (exactly-once: its
    offsets commit with its output) when every write of the message it made was transactional and each output
    holds it at most once: VISIBLE then, OPEN while one of its transactions is undecided (UNAVAILABLE while the log
    cannot be asked), None otherwise."""
    route = moment.stream.route
    processor = route.reader(hop.topic, hop.group or "")
    if processor is None or not processor.is_processor:
        return None
    writes = [(out, moment.evidence.sent.get(Hop.write(processor.location, out), ())) for out in processor.writes]
    sents = [t for _, traces in writes for t in traces]
    if not sents or not all(t.transactional for t in sents):
        return None
    outcomes = {
        out: [moment.transaction_outcome(out, (t.partition, t.offset)) for t in traces] for out, traces in writes
    }
    for state in (RecordState.UNAVAILABLE, RecordState.OPEN):
        if any(o is state for found in outcomes.values() for o in found):
            return state
    once = all(sum(o is RecordState.VISIBLE for o in found) <= 1 for found in outcomes.values())
    return RecordState.VISIBLE if once else None


def read_facts(moment: Moment, hop: Hop, progress: ReadProgress) -> ReadFacts:
    assert hop.group is not None
    positions = moment.evidence.positions_for(hop)
    receives = moment.evidence.received.get(hop, ())
    at = (receives[0].partition, receives[0].offset) if receives else min(positions) if positions else None
    arrived = arrived_past(moment, hop)
    settled, timed_out = progress.settled, moment.timed_out
    # a read_uncommitted receipt proves nothing of its transaction: the log says whether it committed
    outcomes = uncommitted_receipts(moment, hop) if settled or timed_out else []
    read_twice = bool(receives) and len(receives) > len({(t.partition, t.offset) for t in receives})
    again = reprocessing(moment, hop) if read_twice and (settled or timed_out) else None
    undecided = any(o is RecordState.OPEN for o in outcomes) or again is RecordState.OPEN
    unavailable = any(o is RecordState.UNAVAILABLE for o in outcomes) or again is RecordState.UNAVAILABLE
    fate = None
    if not settled and timed_out and at is not None and not receives:
        # past the maximum wait and the group has not gone past it: held at the last stable offset by a transaction
        # not decided (its own or another producer's), or written in one that aborted (a read_committed group
        # commits past it only once it reads a record after it): the log says which
        fate = moment.fate(hop.topic, at)
        undecided = fate.state is RecordState.OPEN
        if fate.state is RecordState.ABORTED:
            settled = True
    if undecided:  # waiting on Kafka to decide a transaction: not late, and Kafka bounds the wait
        settled, timed_out = False, moment.transaction_timed_out
    if unavailable:
        settled = False
    receipts_aborted = (
        bool(outcomes) and all(t.read_uncommitted for t in receives) and all(o is RecordState.ABORTED for o in outcomes)
    )
    pointed = removal = None  # asked of the world only when the rules before them do not already hold
    if settled and not receives and not arrived and at is not None:
        location = moment.stream.route.location_of(hop.group)
        if location is not None:
            pointed = next(
                (
                    position
                    for position in sorted(positions)
                    if moment.lookups.pointed_at(location, hop.topic.cluster, hop.topic.topic, *position)
                ),
                None,
            )
        if pointed is None:
            fate = moment.fate(hop.topic, at)
            if fate.state is RecordState.UNAVAILABLE:  # never a LOST for want of asking: wait, ask again
                settled, unavailable = False, True
            else:
                removal = progress.removals.get(at) or moment.lookups.removed(
                    hop.topic.cluster, hop.group, hop.topic.topic, *at
                )
    resent_here = moment.evidence.resent.get(hop.id, ())
    return ReadFacts(
        hop, settled, receives, positions, at, arrived, resent_here, pointed, removal, timed_out,
        fate, receipts_aborted, again is RecordState.VISIBLE, undecided, unavailable,
    )  # fmt: skip


# -- the rules every hop starts with: a resend that arrived, then an open hop (PENDING past the maximum wait)


def resend_arrived(facts: ReadFacts | WriteFacts) -> bool:
    return facts.settled and bool(facts.resent)


def open_past_max_wait(facts: ReadFacts | WriteFacts) -> bool:
    return not facts.settled and facts.timed_out


def still_open(facts: ReadFacts | WriteFacts) -> bool:
    return not facts.settled


def no_trace_on_topic(facts: ReadFacts) -> bool:
    """Implied: no trace shows the message on the topic, a processor reading it wrote it on."""
    return facts.at is None


def received_only_aborted(facts: ReadFacts) -> bool:
    """A read_uncommitted group received the message, but every record it got was of a transaction that aborted."""
    return facts.receipts_aborted


def reread_by_exactly_once_processor(facts: ReadFacts) -> bool:
    return facts.reprocessed


def received_once(facts: ReadFacts) -> bool:
    return len(facts.receives) == 1


def same_offset_read_twice(facts: ReadFacts) -> bool:
    return bool(facts.receives) and max(facts.reads_per_position.values()) > 1


def read_at_several_offsets(facts: ReadFacts) -> bool:
    return len(facts.receives) > 1


def later_hop_shows_arrival(facts: ReadFacts) -> bool:
    return not facts.receives and facts.arrived_past


def group_points_at_it(facts: ReadFacts) -> bool:
    return not facts.receives and facts.pointed is not None


def written_in_aborted_transaction(facts: ReadFacts) -> bool:
    """Never received, and its log says its transaction aborted: no read_committed group ever sees it."""
    return not facts.receives and facts.fate is not None and facts.fate.state is RecordState.ABORTED


def compacted_away(facts: ReadFacts) -> bool:
    """Never received, and log compaction removed it (a later record of its key supersedes it): gone from the
    middle of a compacted topic's log, or below the log start of a compact,delete topic whose log still holds a
    later record of its key."""
    fate = facts.fate
    if facts.receives or fate is None:
        return False
    return fate.state is RecordState.COMPACTED or (fate.state is RecordState.GONE and fate.later_of_key is not None)


def removed_before_read(facts: ReadFacts) -> bool:
    return not facts.receives and facts.removal is not None


def never_received(facts: ReadFacts) -> bool:
    return not facts.receives


def _receive_latency(moment: Moment, facts: ReadFacts) -> int | None:
    written_ms = facts.positions.get(facts.at) if facts.at is not None else None
    return facts.receives[0].timestamp_ms - written_ms if written_ms is not None else None


def _delivered(moment: Moment, facts: ReadFacts) -> Verdict:
    return verdict(
        moment,
        facts.hop,
        kind=VerdictKind.DELIVERED,
        count=1,
        at=facts.at,
        trace=facts.receives[0],
        latency_ms=_receive_latency(moment, facts),
        detail="received once",
    )


def _duplicate_read(cause: Cause, detail: Callable[[ReadFacts], str]) -> Callable[[Moment, ReadFacts], Verdict]:
    def build(moment: Moment, facts: ReadFacts) -> Verdict:
        return verdict(
            moment,
            facts.hop,
            kind=VerdictKind.DUPLICATE,
            cause=cause,
            count=len(facts.receives),
            at=facts.at,
            trace=facts.receives[0],
            latency_ms=_receive_latency(moment, facts),
            detail=detail(facts),
        )

    return build


def _aborted_receipt(moment: Moment, facts: ReadFacts) -> Verdict:
    return verdict(
        moment,
        facts.hop,
        kind=VerdictKind.ABORTED,
        count=len(facts.receives),
        at=facts.at,
        trace=facts.receives[0],
        detail=f"group {facts.hop.group} reads uncommitted and received offset {facts.at[1] if facts.at else '?'}, "
        "but its transaction aborted: for read_committed readers it never existed",
    )


def _aborted_unread(moment: Moment, facts: ReadFacts) -> Verdict:
    assert facts.at is not None and facts.fate is not None
    return verdict(
        moment,
        facts.hop,
        kind=VerdictKind.ABORTED,
        at=facts.at,
        detail=f"offset {facts.at[1]} was written in a transaction that aborted: group {facts.hop.group} reads "
        f"committed records only and was never to see it ({facts.fate.detail})",
    )


def _superseded(moment: Moment, facts: ReadFacts) -> Verdict:
    assert facts.at is not None and facts.fate is not None
    fate, offset = facts.fate, facts.at[1]
    sent = moment.evidence.sent_at.get(facts.hop.topic, {}).get(facts.at)
    if fate.state is RecordState.GONE:
        why = f"retention removed offset {offset}, and offset {fate.later_of_key} holds a later record of its key"
    elif fate.later_of_key is not None:
        why = f"log compaction removed offset {offset}: offset {fate.later_of_key} holds a later record of its key"
    elif sent is not None and sent.tombstone:
        why = f"offset {offset} was a tombstone; compaction removes tombstones once delete.retention.ms has passed"
    elif sent is not None and sent.transactional:
        why = (
            f"the log cleaner removed offset {offset} and no later record of its key is left: either the later one "
            "was a tombstone, removed since, or its transaction aborted (the cleaner removes those records too)"
        )
    else:
        why = (
            f"log compaction removed offset {offset}; no record of its key is left either: the later one was a "
            "tombstone, itself removed after delete.retention.ms"
        )
    return verdict(
        moment,
        facts.hop,
        kind=VerdictKind.SUPERSEDED,
        cause=Cause.COMPACTED,
        at=facts.at,
        detail=f"{why}; group {facts.hop.group} reads the topic's latest value per key, as compaction promises",
    )


def _trace_lost_implied(moment: Moment, facts: ReadFacts) -> Verdict:
    return verdict(
        moment,
        facts.hop,
        kind=VerdictKind.TRACE_LOST,
        detail=f"no trace on {facts.hop.topic} at all, but {facts.hop.group} wrote the message on: it got it",
    )


def _trace_lost_arrived(moment: Moment, facts: ReadFacts) -> Verdict:
    return verdict(
        moment,
        facts.hop,
        kind=VerdictKind.TRACE_LOST,
        at=facts.at,
        detail="no RECEIVED trace, but a later hop shows the group got the message",
    )


def _trace_lost_pointed(moment: Moment, facts: ReadFacts) -> Verdict:
    assert facts.pointed is not None
    location = moment.stream.route.location_of(facts.hop.group or "")
    return verdict(
        moment,
        facts.hop,
        kind=VerdictKind.TRACE_LOST,
        at=facts.pointed,
        detail=f"no RECEIVED trace, but {location} received it: a later trace or mark of its emitter points "
        f"back to offset {facts.pointed[1]}",
    )


def _lost_removed(moment: Moment, facts: ReadFacts) -> Verdict:
    assert facts.removal is not None and facts.at is not None
    cause, why = removal_cause(facts.positions.get(facts.at), facts.removal)
    return verdict(
        moment,
        facts.hop,
        kind=VerdictKind.LOST,
        cause=cause,
        at=facts.at,
        detail=f"offset {facts.at[1]} left the log before group {facts.hop.group} read it: {why}",
    )


def _lost_skipped(moment: Moment, facts: ReadFacts) -> Verdict:
    assert facts.at is not None
    return verdict(
        moment,
        facts.hop,
        kind=VerdictKind.LOST,
        cause=Cause.SKIPPED_BY_CONSUMER,
        at=facts.at,
        detail=f"group {facts.hop.group} committed past offset {facts.at[1]} and never received it",
    )


def _resent(moment: Moment, facts: ReadFacts | WriteFacts) -> Verdict:
    """RESENT: the resent copy of a confirmed loss arrived at the hop (its group received it, or, for a write
    hop, a reader of the topic did)."""
    first = facts.resent[0]
    attempts = sorted({t.attributes[ATTRIBUTE_RESEND_ID] for t in facts.resent})
    return verdict(
        moment,
        facts.hop,
        kind=VerdictKind.RESENT,
        count=len(attempts),
        at=(first.partition, first.offset),
        trace=first,
        detail=f"resent as {', '.join(attempts)}: {first.group} received it at offset {first.offset}",
    )


def _pending(moment: Moment, facts: ReadFacts | WriteFacts) -> Verdict:
    positions = moment.evidence.positions.get(facts.hop.topic, {})
    return verdict(
        moment,
        facts.hop,
        kind=VerdictKind.PENDING,
        at=min(positions) if positions else None,
        detail=f"undecided {moment.config.max_wait_ms} ms after the first trace: handed to reconciliation",
    )


def _wait(moment: Moment, facts: ReadFacts | WriteFacts) -> None:
    """Not settled: no verdict yet, the message stays in flight."""
    return None


ReadRule = tuple[Callable[[ReadFacts], bool], Callable[[Moment, ReadFacts], Verdict | None]]

# A read hop: the first rule that holds gives its verdict (None: it waits).
READ_RULES: tuple[ReadRule, ...] = (
    (resend_arrived, _resent),
    (open_past_max_wait, _pending),
    (still_open, _wait),
    (no_trace_on_topic, _trace_lost_implied),
    (received_only_aborted, _aborted_receipt),
    (
        reread_by_exactly_once_processor,
        _duplicate_read(
            Cause.REPROCESSED_AFTER_ABORT,
            lambda f: "read again after an aborted transaction: its output was written once (exactly once)",
        ),
    ),
    (received_once, _delivered),
    (same_offset_read_twice, _duplicate_read(Cause.REWIND_REPLAY, lambda f: "the same offset was read more than once")),
    (
        read_at_several_offsets,
        _duplicate_read(Cause.PRODUCER_RETRY, lambda f: f"the id was read at {len(f.reads_per_position)} offsets"),
    ),
    (later_hop_shows_arrival, _trace_lost_arrived),
    (group_points_at_it, _trace_lost_pointed),
    (written_in_aborted_transaction, _aborted_unread),
    (compacted_away, _superseded),
    (removed_before_read, _lost_removed),
    (never_received, _lost_skipped),
)


def judge_read(moment: Moment, facts: ReadFacts) -> Verdict | None:
    return next(build(moment, facts) for holds, build in READ_RULES if holds(facts))


# -- write hops -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WriteFacts:
    hop: Hop
    settled: bool
    sents: tuple[Trace, ...]
    positions: Mapping[Position, int | None]  # the message's positions on the topic, whoever saw them
    on_topic: bool  # a trace shows the message on the topic, or a later hop implies it was there
    input_reads: tuple[Trace, ...]  # a processor's RECEIVED traces on its inputs (empty for a producer)
    inputs_reached: tuple[Hop, ...]  # a processor's input read hops that got the message
    resent: tuple[Trace, ...]  # the RECEIVED traces of Khipu's resend for a loss at this hop
    timed_out: bool
    aborted: frozenset[Position] = frozenset()  # written positions whose transaction aborted
    waits_on_the_log: bool = False  # open until the log tells a transaction's outcome: asked again at the next check
    input_written_ms: int | None = None  # a processor: the timestamp of the input record it first read

    @property
    def written_offsets(self) -> frozenset[Position]:
        """Where the message was written for its readers to see: every SENT position but the aborted ones."""
        return frozenset((t.partition, t.offset) for t in self.sents) - self.aborted

    @property
    def visible_sents(self) -> tuple[Trace, ...]:
        return tuple(t for t in self.sents if (t.partition, t.offset) not in self.aborted)


def processor_inputs(moment: Moment, hop: Hop) -> list[Hop]:
    """The read hops of the processor whose write ``hop`` is (none for a producer's write)."""
    processor = moment.stream.route.processor_writing(hop)
    return [Hop.read(t, processor.group) for t in processor.reads] if processor else []


def write_blocked(moment: Moment, hop: Hop, read_settled: Mapping[Hop, bool]) -> bool:
    """The hops reading the topic (and a processor's input read) are not settled yet; hops the message
    did not reach do not block."""
    readers = [Hop.read(hop.topic, c.group) for c in moment.stream.route.readers_of(hop.topic)]
    return not all(read_settled.get(h, True) for h in [*readers, *processor_inputs(moment, hop)])


def write_facts(
    moment: Moment, hop: Hop, read_settled: Mapping[Hop, bool], reached: set[Hop], on_transaction: set[Hop]
) -> WriteFacts:
    """``on_transaction``: the read hops open only because Kafka has not decided a transaction yet; a write hop they
    hold back waits as long as they do."""
    evidence = moment.evidence
    inputs = processor_inputs(moment, hop)
    reads = tuple(t for h in inputs for t in evidence.received.get(h, ()))
    sents = evidence.sent.get(hop, ())
    blocked = write_blocked(moment, hop, read_settled)
    held_by_transaction = blocked and any(
        h in on_transaction
        for h in [*(Hop.read(hop.topic, c.group) for c in moment.stream.route.readers_of(hop.topic)), *inputs]
    )
    timed_out = moment.transaction_timed_out if held_by_transaction else moment.timed_out
    settled = not blocked or (timed_out and bool(sents))
    aborted: set[Position] = set()
    waits = False
    if settled:  # a transactional write is judged on its transaction's outcome, once Kafka has one
        outcomes = {
            (t.partition, t.offset): moment.transaction_outcome(hop.topic, (t.partition, t.offset)) for t in sents
        }
        aborted = {position for position, outcome in outcomes.items() if outcome is RecordState.ABORTED}
        if any(o is RecordState.OPEN for o in outcomes.values()):
            settled, timed_out, waits = False, moment.transaction_timed_out, True
        elif any(o is RecordState.UNAVAILABLE for o in outcomes.values()):
            settled, waits = False, True
    return WriteFacts(
        hop,
        settled,
        sents,
        evidence.positions.get(hop.topic, {}),
        hop.topic in evidence.positions or hop.topic in moment.implied,
        reads,
        tuple(h for h in inputs if h in reached),
        evidence.resent.get(hop.id, ()),
        timed_out,
        frozenset(aborted),
        waits,
        next(
            (evidence.positions.get(h.topic, {}).get((t.partition, t.offset)) for h in inputs for t in reads[:1]
             if t.topic == h.topic.topic and t.cluster == h.topic.cluster),
            None,
        ),
    )  # fmt: skip


def got_it_and_wrote_nothing(facts: WriteFacts) -> bool:
    """A processor's output shows nothing of the message (no trace, no later hop), and an input read of it got
    the message: a written record would be seen downstream, so no pointer is asked after."""
    return not facts.on_topic and bool(facts.inputs_reached)


def never_sent(facts: WriteFacts) -> bool:
    return not facts.sents


def processor_wrote_only_in_aborted_transactions(facts: WriteFacts) -> bool:
    """A processor got the message and went past it (its input read is settled), and every write of it to this
    output was in a transaction that aborted: nothing of it reached its readers. (An exactly-once processor reads
    its input again after an abort: it goes past only once a transaction with the output commits.)"""
    return not facts.written_offsets and bool(facts.inputs_reached)


def every_write_aborted(facts: WriteFacts) -> bool:
    return not facts.written_offsets


def written_once(facts: WriteFacts) -> bool:
    return len(facts.written_offsets) == 1


def processor_reread_input(facts: WriteFacts) -> bool:
    reads = [(t.partition, t.offset) for t in facts.input_reads]
    return len(reads) > len(set(reads))


def written_several_times(facts: WriteFacts) -> bool:
    return len(facts.written_offsets) > 1


def _write_latency(facts: WriteFacts) -> int | None:
    """From the processor's first receive to its first write its readers see (none for a producer). A processor
    that carried its input record's timestamp onto its output (Kafka Streams does by default) stamps its write
    with that: no measure of its own latency, and no clock skew either, so none."""
    if not facts.input_reads:
        return None
    written = facts.visible_sents[0].timestamp_ms
    if written == facts.input_written_ms:
        return None
    return written - facts.input_reads[0].timestamp_ms


def _aborted_attempts(facts: WriteFacts) -> str:
    return f"; {len(facts.aborted)} earlier attempt(s) in aborted transactions" if facts.aborted else ""


def _aborted_write(moment: Moment, facts: WriteFacts) -> Verdict:
    first = facts.sents[0]
    where = ", ".join(str(offset) for _, offset in sorted(facts.aborted))
    return verdict(
        moment,
        facts.hop,
        kind=VerdictKind.ABORTED,
        count=len(facts.aborted),
        at=(first.partition, first.offset),
        trace=first,
        detail=f"written at offset {where} in a transaction that aborted: read_committed readers never see it",
    )


def _lost_dropped(moment: Moment, facts: WriteFacts) -> Verdict:
    processor = moment.stream.route.processor_writing(facts.hop)
    assert processor is not None
    where = ", ".join(str(h.topic) for h in facts.inputs_reached)
    wrote = (
        f"wrote it to {facts.hop.topic} only in transactions that aborted (offset "
        f"{', '.join(str(offset) for _, offset in sorted(facts.aborted))})"
        if facts.aborted
        else f"wrote nothing to {facts.hop.topic}"
    )
    return verdict(
        moment,
        facts.hop,
        kind=VerdictKind.LOST,
        cause=Cause.DROPPED_IN_PROCESSOR,
        at=min(facts.aborted) if facts.aborted else None,
        detail=f"{processor.group} got it from {where}, committed past it, and {wrote}",
    )


def _trace_lost_write(moment: Moment, facts: WriteFacts) -> Verdict:
    return verdict(
        moment,
        facts.hop,
        kind=VerdictKind.TRACE_LOST,
        at=min(facts.positions) if facts.positions else None,
        detail=f"no SENT trace, but the message was seen on {facts.hop.topic}"
        if facts.positions
        else f"no trace on {facts.hop.topic} at all, but a processor reading it wrote the message on",
    )


def _written(moment: Moment, facts: WriteFacts) -> Verdict:
    first = facts.visible_sents[0]
    return verdict(
        moment,
        facts.hop,
        kind=VerdictKind.DELIVERED,
        count=1,
        at=(first.partition, first.offset),
        trace=first,
        latency_ms=_write_latency(facts),
        detail=f"written once{_aborted_attempts(facts)}",
    )


def _duplicate_write(cause: Cause) -> Callable[[Moment, WriteFacts], Verdict]:
    def build(moment: Moment, facts: WriteFacts) -> Verdict:
        first = facts.visible_sents[0]
        return verdict(
            moment,
            facts.hop,
            kind=VerdictKind.DUPLICATE,
            cause=cause,
            count=len(facts.written_offsets),
            at=(first.partition, first.offset),
            trace=first,
            latency_ms=_write_latency(facts),
            detail=f"written at {len(facts.written_offsets)} offsets{_aborted_attempts(facts)}",
        )

    return build


WriteRule = tuple[Callable[[WriteFacts], bool], Callable[[Moment, WriteFacts], Verdict | None]]

# A write hop: the first rule that holds gives its verdict (None: it waits).
WRITE_RULES: tuple[WriteRule, ...] = (
    (resend_arrived, _resent),
    (open_past_max_wait, _pending),
    (still_open, _wait),
    (got_it_and_wrote_nothing, _lost_dropped),
    (never_sent, _trace_lost_write),
    (processor_wrote_only_in_aborted_transactions, _lost_dropped),
    (every_write_aborted, _aborted_write),
    (written_once, _written),
    (processor_reread_input, _duplicate_write(Cause.REWIND_REPLAY)),
    (written_several_times, _duplicate_write(Cause.PRODUCER_RETRY)),
)


def judge_write(moment: Moment, facts: WriteFacts) -> Verdict | None:
    return next(build(moment, facts) for holds, build in WRITE_RULES if holds(facts))


# -- which hops a message reached -------------------------------------------------------------------------


def read_hops_reached(moment: Moment) -> list[Hop]:
    """The read hops of every topic the message is on (a trace says so, or a later hop implies it), and those a
    resend meant for one group targets; not the others' of a topic only such a resend is on."""
    evidence, route = moment.evidence, moment.stream.route
    hops = []
    for topic in sorted({*evidence.topics(), *moment.implied}, key=str):
        for reader in route.readers_of(topic):
            hop = Hop.read(topic, reader.group)
            if topic in evidence.positions or hop in evidence.targeted or topic in moment.implied:
                hops.append(hop)
    return hops


def write_hops_reached(moment: Moment, read_settled: Mapping[Hop, bool], reached: set[Hop]) -> list[Hop]:
    """The write hops to judge: into every topic the message is on, those with SENT traces (or the one writer,
    when no writer's trace arrived); a processor's outputs the message is not on, once an input read of it got
    the message or is still open (what happened there is the question); and a write hop a resend names."""
    evidence, route = moment.evidence, moment.stream.route
    hops: list[Hop] = []
    for topic in sorted({*evidence.positions, *moment.implied}, key=str):
        writers = route.writers_of(topic)
        hops += [h for h in writers if h in evidence.sent] or (list(writers) if len(writers) == 1 else [])
    for processor in (c for c in route.consumers if c.is_processor):
        inputs = [h for h in (Hop.read(t, processor.group) for t in processor.reads) if evidence.positions_for(h)]
        if any(h in reached or not read_settled.get(h, True) for h in inputs):
            hops += [
                Hop.write(processor.location, out)
                for out in processor.writes
                if out not in evidence.positions and out not in moment.implied
            ]
    hops += [h for h in route.hops if h.kind is HopKind.WRITE and h.id in evidence.resent]
    return list(dict.fromkeys(hops))


# -- the whole message ------------------------------------------------------------------------------------


def decide(
    message_id: str,
    stream: Stream,
    traces: Sequence[Trace],
    committed: CommittedLookup,
    passed_at: Mapping[str, int],
    first_seen_ms: int,
    now_ms: int,
    config: DetectorConfig,
    pointed_at: PointerLookup = nothing_pointed_at,
    read_to_ms: int | None = None,
    removed: RemovalLookup = nothing_removed,
    record: RecordLookup = nothing_asked,
    history: CommitHistoryLookup = no_history,
) -> Decision:
    """Judge every hop the message reached (see the module doc).

    ``read_to_ms``: every trace produced before this time has been read (the detector is caught
    up to it). Grace and maximum wait run on ``min(now_ms, read_to_ms)``: a detector behind on the
    trace topic sees committed offsets ahead of the traces it has read, and must not conclude
    from traces it has not read yet. ``removed`` says whether a record left its log before a group
    got to it (expiry or truncation; see :class:`khipu.detector.model.Removal`); ``record`` what the log says of
    the record at a position (its transaction's outcome, or compaction: :class:`khipu.detector.model.RecordFate`),
    asked only where the traces cannot tell. ``history``: when the groups' committed offsets were seen
    (:class:`khipu.detector.model.CommitHistory`): a commit seen before the message was read starts its grace.
    """
    evidence = gather(traces)
    sources = [t for hop, ts in evidence.sent.items() if stream.route.is_source(hop) for t in ts]
    moment = Moment(
        message_id=message_id,
        stream=stream,
        evidence=evidence,
        lookups=Lookups(committed, pointed_at, removed, record, history),
        config=config,
        now_ms=now_ms,
        clock_ms=now_ms if read_to_ms is None else min(now_ms, read_to_ms),
        first_seen_ms=first_seen_ms,
        implied=implied_topics(stream, evidence),
        source_sent_ms=min((t.timestamp_ms for t in sources), default=None),
    )
    judged: dict[Hop, Verdict] = {}
    open_hops: list[Hop] = []
    checks: list[int] = []
    # new entries go first; the caller's memo (only read) may answer any key
    memo: ChainMap[str, int] = ChainMap({}, cast(MutableMapping[str, int], passed_at))
    read_settled: dict[Hop, bool] = {}
    on_transaction: set[Hop] = set()

    for hop in read_hops_reached(moment):
        progress = read_progress(moment, hop, memo)
        memo.update(progress.passed_at)
        facts = read_facts(moment, hop, progress)
        read_settled[hop] = facts.settled
        checks.extend(progress.next_check_ms)
        if facts.waits_on_transaction:
            on_transaction.add(hop)
        if facts.waits_on_transaction or facts.waits_on_the_log:
            checks.append(moment.now_ms + config.recheck_ms)
        found = judge_read(moment, facts)
        if found is None:
            open_hops.append(hop)
        else:
            judged[hop] = found

    reached = {hop for hop, v in judged.items() if v.kind in RECEIPT_KINDS or v.kind is VerdictKind.RESENT}
    for hop in write_hops_reached(moment, read_settled, reached):
        facts_of_write = write_facts(moment, hop, read_settled, reached, on_transaction)
        if facts_of_write.waits_on_the_log:
            checks.append(moment.now_ms + config.recheck_ms)
        found = judge_write(moment, facts_of_write)
        if found is None:
            open_hops.append(hop)
        else:
            judged[hop] = found

    done = not open_hops
    next_check = None if done else min([*checks, first_seen_ms + config.max_wait_ms])
    return Decision(tuple(judged.values()), done, {**passed_at, **memo.maps[0]}, next_check)


# -- what a message in flight reports -------------------------------------------------------------------

REPORTED_LOST = -1  # what reported_now keeps of a hop reported LOST (a receipt traced later contradicts it)


def to_report(verdicts: Sequence[Verdict], reported: Mapping[str, int | None]) -> list[Verdict]:
    """What one evaluation of a message still in flight reports, given what earlier ones reported (hop id -> the
    traced copies its receipt counted: DELIVERED 1, a DUPLICATE its count, TRACE_LOST 0; REPORTED_LOST for a LOST;
    None for anything else). A hop's verdict is reported the first time it is decided, and again when a receipt
    traced since changes what was said: the message was written again (an at-least-once processor after its
    rebalance) and the copy reached a hop already decided while the message was still in flight. Its DELIVERED is
    then a DUPLICATE (or a DUPLICATE of more); its TRACE_LOST, DELIVERED; its LOST (the first copy's trace lost, no
    pointer to it), a receipt, which the store turns into RETRACTED at once, saying what the hop got. Anything
    else stays as reported (Kafka's ABORTED and SUPERSEDED are final)."""

    def changed_by_receipt(v: Verdict) -> bool:
        before = reported[v.hop]
        if v.kind not in RECEIPT_KINDS or before is None:
            return False
        return before == REPORTED_LOST or v.count > before

    return [v for v in verdicts if v.hop not in reported or changed_by_receipt(v)]


def reported_now(reported: Mapping[str, int | None], verdicts: Sequence[Verdict]) -> dict[str, int | None]:
    """What has been reported of a message once ``verdicts`` (from :func:`to_report`) are too."""

    def kept(v: Verdict) -> int | None:
        if v.kind in RECEIPT_KINDS:
            return v.count
        return REPORTED_LOST if v.kind is VerdictKind.LOST else None

    return {**reported, **{v.hop: kept(v) for v in verdicts}}
