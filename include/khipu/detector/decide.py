"""The verdict of every hop a message reached, from its traces, its route and committed offsets.

A pure function: the traces gathered so far, the stream's route, a committed-offset lookup, the
memo of when each group was first seen past the message, and ``now`` come in; verdicts, whether
the message is decided, the updated memo and when to look again go out. The stateful processor
only gathers inputs and applies it.

Rules (Inca's central idea, sharpened):

- A read hop (topic -> group) is decided only once the group's committed offset has passed every
  position of the message on that topic and ``grace_ms`` has gone by since that was first seen:
  until then the message is simply on its way, however long that takes (up to ``max_wait_ms``).
  A record that left the log before the group got to it (the partition's log start passed it
  while the group's committed offset had not) is final the same way: the group can never read
  it. Then: no RECEIVED -> LOST (or TRACE_LOST when a later hop shows it arrived, or when an
  emitter of the group's location points at the record: a later RECEIVED trace's back-pointer or
  a mark says it was received), skipped by consumer, or expired / truncated when the record was
  removed from the log before the group read it (retention deletes only records older than
  ``retention.ms``, or the oldest of a partition over ``retention.bytes``: a younger one from a
  topic without a size limit, or one of a topic kept forever, was truncated); one -> DELIVERED; more ->
  DUPLICATE, rewind/replay when one offset was read twice, producer retry when the id sits at
  several offsets.
- A write hop with SENT traces is DELIVERED (DUPLICATE when the id was written at several
  offsets), decided when the hops reading its topic are decided (and, for a processor, its input
  read). Without a SENT but with the message seen on its topic: TRACE_LOST. A processor that
  received the message and committed past it, with nothing written on: LOST, dropped in processor
  (a written record is seen downstream, so no pointer lookup is needed there).
- A topic no trace shows the message on, but which a processor evidently read it from (it wrote
  the message on, and that topic is its only input): its hops are TRACE_LOST too, with no
  position (SENT and RECEIVED both lost), once the trace topic has been read ``grace_ms`` past
  the time the detector first saw the message (its traces there, had they been written, would
  have been read by then).
  Other groups reading it wait, then go to reconciliation.
- Hops past a loss get no verdict: the message never got there.
- Still undecided ``max_wait_ms`` after the first trace: PENDING for what is open, and done.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from khipu.detector.model import (
    Cause,
    CommittedLookup,
    DetectorConfig,
    PointerLookup,
    Removal,
    RemovalLookup,
    Verdict,
    VerdictKind,
    nothing_pointed_at,
    nothing_removed,
    removal_cause,
)
from khipu.registry.model import ConsumerSpec, Hop, HopKind, Stream, TopicRef
from khipu.trace.model import Trace, TraceType

Position = tuple[int, int]  # (partition, offset)


@dataclass(frozen=True, slots=True)
class Decision:
    verdicts: tuple[Verdict, ...]
    done: bool
    passed_at: Mapping[str, int] = field(default_factory=dict)
    next_check_ms: int | None = None


@dataclass(slots=True)
class _Evidence:
    sent: dict[Hop, list[Trace]]
    received: dict[Hop, list[Trace]]
    positions: dict[TopicRef, dict[Position, int | None]]  # position -> when written (None: not seen written)


def _gather(traces: Sequence[Trace]) -> _Evidence:
    sent: dict[Hop, list[Trace]] = {}
    received: dict[Hop, list[Trace]] = {}
    positions: dict[TopicRef, dict[Position, int | None]] = {}
    for trace in sorted(traces, key=lambda t: (t.timestamp_ms, t.emitter_id, t.emitter_seq)):
        hop = Hop.of_trace(trace)
        at = positions.setdefault(hop.topic, {})
        position = (trace.partition, trace.offset)
        if trace.type is TraceType.SENT:
            sent.setdefault(hop, []).append(trace)
            at[position] = trace.timestamp_ms if at.get(position) is None else at[position]
        else:
            received.setdefault(hop, []).append(trace)
            at.setdefault(position, None)
    return _Evidence(sent, received, positions)


class _Judge:
    def __init__(
        self,
        message_id: str,
        stream: Stream,
        evidence: _Evidence,
        committed: CommittedLookup,
        passed_at: Mapping[str, int],
        now_ms: int,
        config: DetectorConfig,
        timed_out: bool,
        pointed_at: PointerLookup,
        clock_ms: int,
        removed: RemovalLookup,
        first_seen_ms: int,
    ) -> None:
        self.first_seen_ms = first_seen_ms
        self.pointed_at = pointed_at
        self.removed = removed
        self.clock_ms = clock_ms  # now, or the time up to which the trace topic is read, if earlier
        self.timed_out = timed_out  # past max_wait: write hops are judged on the evidence there is
        self.message_id, self.stream, self.evidence = message_id, stream, evidence
        self.committed, self.now_ms, self.config = committed, now_ms, config
        self.passed_at = dict(passed_at)
        self.verdicts: list[Verdict] = []
        self.open: list[Hop] = []
        self.next_check: list[int] = []
        self.read_final: dict[Hop, bool] = {}
        self.reached: set[Hop] = set()  # read hops the message evidently got to
        source_sents = [t for hop, ts in evidence.sent.items() if self._is_source(hop) for t in ts]
        self.source_sent_ms = min((t.timestamp_ms for t in source_sents), default=None)
        self.implied = self.implied_topics()  # topics it passed with no trace there

    # -- route questions ----------------------------------------------------------------------

    def _is_source(self, hop: Hop) -> bool:
        return any(p.location == hop.location and hop.topic in p.writes for p in self.stream.route.producers)

    def _processor_at(self, location: str | None) -> ConsumerSpec | None:
        return next((c for c in self.stream.route.consumers if c.is_processor and c.location == location), None)

    def writers_of(self, topic: TopicRef) -> list[Hop]:
        route = self.stream.route
        hops = [Hop.write(p.location, topic) for p in route.producers if topic in p.writes]
        hops += [Hop.write(c.location, topic) for c in route.consumers if topic in c.writes]
        return hops

    # -- read hops --------------------------------------------------------------------------

    def read_hop(self, hop: Hop) -> None:
        assert hop.group is not None
        positions = self.evidence.positions.get(hop.topic, {})
        if not positions:  # a topic implied by a later hop: no trace says where the message sat there
            settle_ms = self.first_seen_ms + self.config.grace_ms  # its traces there, if any, are read by then
            if self._arrived_past(hop) and self.clock_ms < settle_ms:
                self.read_final[hop] = False
                self.open.append(hop)
                self.next_check.append(max(settle_ms, self.now_ms + 1))
            elif self._arrived_past(hop):
                self.read_final[hop] = True
                self._verdict(
                    hop,
                    VerdictKind.TRACE_LOST,
                    None,
                    0,
                    None,
                    None,
                    None,
                    f"no trace on {hop.topic} at all, but {hop.group} wrote the message on: it got it",
                )
            else:
                self.read_final[hop] = False
                self.open.append(hop)  # nothing to compare its committed offset with: reconciliation's
            return
        all_final = True
        removals: dict[Position, Removal] = {}
        for partition, offset in sorted(positions):
            committed = self.committed(hop.topic.cluster, hop.group, hop.topic.topic, partition)
            key = f"{hop.id}|{partition}|{offset}"
            passed = committed is not None and committed > offset
            # a record the group has not reached is asked after (it may have left the log) only once the
            # message has been on its way longer than the grace: most are passed by then, and asking costs
            overdue = self.clock_ms - self.first_seen_ms >= self.config.grace_ms
            if (
                not passed
                and overdue
                and (gone := self.removed(hop.topic.cluster, hop.group, hop.topic.topic, partition, offset))
            ):
                removals[(partition, offset)] = gone  # out of the log before the group got to it: final too
            if passed or (partition, offset) in removals:
                seen = self.passed_at.setdefault(key, self.now_ms)
                if self.clock_ms - seen < self.config.grace_ms:
                    all_final = False
                    self.next_check.append(seen + self.config.grace_ms)
            else:
                all_final = False
                self.next_check.append(self.now_ms + self.config.recheck_ms)
        self.read_final[hop] = all_final
        if not all_final:
            self.open.append(hop)
            return
        receives = self.evidence.received.get(hop, [])
        per_position: dict[Position, int] = {}
        for trace in receives:
            per_position[(trace.partition, trace.offset)] = per_position.get((trace.partition, trace.offset), 0) + 1
        first = receives[0] if receives else None
        partition, offset = (first.partition, first.offset) if first else min(positions)
        if not receives:
            location = self._location_of(hop.group)
            if self._arrived_past(hop):
                self._verdict(
                    hop,
                    VerdictKind.TRACE_LOST,
                    None,
                    0,
                    partition,
                    offset,
                    None,
                    "no RECEIVED trace, but a later hop shows the group got the message",
                )
            elif location is not None and (pointed := self._pointed_position(hop, location, positions)):
                partition, offset = pointed
                self._verdict(
                    hop,
                    VerdictKind.TRACE_LOST,
                    None,
                    0,
                    partition,
                    offset,
                    None,
                    f"no RECEIVED trace, but {location} received it: a later trace or mark of its emitter points "
                    f"back to offset {offset}",
                )
            else:
                removal = removals.get((partition, offset)) or self.removed(
                    hop.topic.cluster, hop.group, hop.topic.topic, partition, offset
                )
                if removal is None:
                    cause, detail = Cause.SKIPPED_BY_CONSUMER, f"group {hop.group} committed past offset {offset}"
                    detail += " and never received it"
                else:
                    cause, why = removal_cause(positions.get((partition, offset)), removal)
                    detail = f"offset {offset} left the log before group {hop.group} read it: {why}"
                self._verdict(hop, VerdictKind.LOST, cause, 0, partition, offset, None, detail)
            return
        written_ms = positions.get((first.partition, first.offset)) if first else None
        latency = first.timestamp_ms - written_ms if first and written_ms is not None else None
        if len(receives) == 1:
            self._verdict(hop, VerdictKind.DELIVERED, None, 1, partition, offset, first, "received once", latency)
        elif max(per_position.values()) > 1:
            self._verdict(
                hop,
                VerdictKind.DUPLICATE,
                Cause.REWIND_REPLAY,
                len(receives),
                partition,
                offset,
                first,
                "the same offset was read more than once",
                latency,
            )
        else:
            self._verdict(
                hop,
                VerdictKind.DUPLICATE,
                Cause.PRODUCER_RETRY,
                len(receives),
                partition,
                offset,
                first,
                f"the id was read at {len(per_position)} offsets",
                latency,
            )

    def _location_of(self, group: str) -> str | None:
        return next((c.location for c in self.stream.route.consumers if c.group == group), None)

    def _pointed_position(self, hop: Hop, location: str, positions: Mapping[Position, int | None]) -> Position | None:
        """The first of the message's positions on the hop's topic that an emitter of ``location`` points at."""
        return next(
            (
                (partition, offset)
                for partition, offset in sorted(positions)
                if self.pointed_at(location, hop.topic.cluster, hop.topic.topic, partition, offset)
            ),
            None,
        )

    def implied_topics(self) -> list[TopicRef]:
        """Topics the message evidently passed though no trace shows it there: the single input of a
        processor that wrote it on (its SENT traces, or the message seen on an output only it writes)."""
        implied: list[TopicRef] = []
        changed = True
        while changed:
            changed = False
            for processor in (c for c in self.stream.route.consumers if c.is_processor and len(c.reads) == 1):
                source = processor.reads[0]
                if source in self.evidence.positions or source in implied:
                    continue
                if any(self._wrote_on(processor, out, implied) for out in processor.writes):
                    implied.append(source)
                    changed = True
        return implied

    def _wrote_on(self, processor: ConsumerSpec, out: TopicRef, implied: list[TopicRef]) -> bool:
        if Hop.write(processor.location, out) in self.evidence.sent:
            return True
        only_writer = self.writers_of(out) == [Hop.write(processor.location, out)]
        return only_writer and (out in self.evidence.positions or out in implied)

    def _arrived_past(self, hop: Hop) -> bool:
        """A processor that writes on what it received: its SENT traces prove it got the message."""
        processor = next((c for c in self.stream.route.readers_of(hop.topic) if c.group == hop.group), None)
        if processor is None or not processor.is_processor:
            return False
        return any(
            Hop.write(processor.location, out) in self.evidence.sent
            or self.evidence.positions.get(out)
            or out in self.implied
            for out in processor.writes
        )

    # -- write hops -------------------------------------------------------------------------

    def write_hop(self, hop: Hop) -> None:
        sents = self.evidence.sent.get(hop, [])
        readers = [Hop.read(hop.topic, c.group) for c in self.stream.route.readers_of(hop.topic)]
        processor = self._processor_at(hop.location)
        inputs = [Hop.read(t, processor.group) for t in processor.reads] if processor else []
        blocked = not all(self.read_final.get(h, True) for h in [*readers, *inputs])  # hops not reached do not block
        if blocked and not (self.timed_out and sents):
            self.open.append(hop)
            return
        positions = self.evidence.positions.get(hop.topic, {})
        if not sents:
            partition, offset = min(positions) if positions else (None, None)
            self._verdict(
                hop,
                VerdictKind.TRACE_LOST,
                None,
                0,
                partition,
                offset,
                None,
                f"no SENT trace, but the message was seen on {hop.topic}"
                if positions
                else f"no trace on {hop.topic} at all, but a processor reading it wrote the message on",
            )
            return
        first = sents[0]
        offsets = {(t.partition, t.offset) for t in sents}
        latency = None
        if processor:
            received = [t for h in inputs for t in self.evidence.received.get(h, [])]
            latency = first.timestamp_ms - received[0].timestamp_ms if received else None
        if len(offsets) == 1:
            self._verdict(
                hop, VerdictKind.DELIVERED, None, 1, first.partition, first.offset, first, "written once", latency
            )
            return
        cause = Cause.PRODUCER_RETRY
        if processor:
            input_reads = [(t.partition, t.offset) for h in inputs for t in self.evidence.received.get(h, [])]
            if len(input_reads) > len(set(input_reads)):
                cause = Cause.REWIND_REPLAY
        self._verdict(
            hop,
            VerdictKind.DUPLICATE,
            cause,
            len(offsets),
            first.partition,
            first.offset,
            first,
            f"written at {len(offsets)} offsets",
            latency,
        )

    def missing_processor_write(self, processor: ConsumerSpec, output: TopicRef) -> None:
        """A processor got the message (its read hop was reached) and wrote nothing on to ``output``."""
        hop = Hop.write(processor.location, output)
        inputs = [Hop.read(t, processor.group) for t in processor.reads if Hop.read(t, processor.group) in self.reached]
        if not inputs:
            return
        where = ", ".join(str(h.topic) for h in inputs)
        self._verdict(
            hop,
            VerdictKind.LOST,
            Cause.DROPPED_IN_PROCESSOR,
            0,
            None,
            None,
            None,
            f"{processor.group} got it from {where}, committed past it, and wrote nothing to {output}",
        )

    # -- output -----------------------------------------------------------------------------

    def _verdict(
        self,
        hop: Hop,
        kind: VerdictKind,
        cause: Cause | None,
        count: int,
        partition: int | None,
        offset: int | None,
        trace: Trace | None,
        detail: str,
        latency: int | None = None,
    ) -> None:
        observed = trace.timestamp_ms if trace else None
        e2e = observed - self.source_sent_ms if observed is not None and self.source_sent_ms is not None else None
        if hop.kind is HopKind.READ and kind in (VerdictKind.DELIVERED, VerdictKind.DUPLICATE, VerdictKind.TRACE_LOST):
            self.reached.add(hop)
        self.verdicts.append(
            Verdict(
                message_id=self.message_id,
                stream=self.stream.name,
                hop=hop.id,
                hop_kind=hop.kind.value,
                kind=kind,
                cause=cause,
                count=count,
                topic=hop.topic.topic,
                partition=partition,
                offset=offset,
                group=hop.group,
                location=hop.location,
                observed_ms=observed,
                latency_ms=latency,
                e2e_latency_ms=e2e,
                decided_ms=self.now_ms,
                detail=detail,
            )
        )

    def pending(self, hop: Hop) -> None:
        positions = self.evidence.positions.get(hop.topic, {})
        partition, offset = min(positions) if positions else (None, None)
        self._verdict(
            hop,
            VerdictKind.PENDING,
            None,
            0,
            partition,
            offset,
            None,
            f"undecided {self.config.max_wait_ms} ms after the first trace: handed to reconciliation",
        )


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
) -> Decision:
    """Judge every hop the message reached (see the module doc).

    ``read_to_ms``: every trace produced before this time has been read (the detector is caught
    up to it). Grace and maximum wait run on ``min(now_ms, read_to_ms)``: a detector behind on the
    trace topic sees committed offsets ahead of the traces it has read, and must not conclude
    from traces it has not read yet. ``removed`` says whether a record left its log before a group
    got to it (expiry or truncation; see :class:`khipu.detector.model.Removal`).
    """
    evidence = _gather(traces)
    clock = now_ms if read_to_ms is None else min(now_ms, read_to_ms)
    timed_out = clock - first_seen_ms >= config.max_wait_ms
    judge = _Judge(
        message_id,
        stream,
        evidence,
        committed,
        passed_at,
        now_ms,
        config,
        timed_out,
        pointed_at,
        clock,
        removed,
        first_seen_ms,
    )
    route = stream.route
    reached = sorted([*evidence.positions, *judge.implied], key=str)
    for topic in reached:
        for reader in route.readers_of(topic):
            judge.read_hop(Hop.read(topic, reader.group))
    for topic in reached:
        writers = judge.writers_of(topic)
        with_evidence = [h for h in writers if h in evidence.sent]
        for hop in with_evidence or (writers if len(writers) == 1 else []):
            judge.write_hop(hop)
    for processor in (c for c in route.consumers if c.is_processor):
        inputs = [Hop.read(t, processor.group) for t in processor.reads if t in evidence.positions]
        missing = [out for out in processor.writes if out not in evidence.positions]
        if any(h in judge.open for h in inputs):  # not yet known whether it got there: wait with it
            judge.open.extend(Hop.write(processor.location, out) for out in missing)
            continue
        for output in missing:
            judge.missing_processor_write(processor, output)
    if judge.open and timed_out:
        for hop in judge.open:
            judge.pending(hop)
        judge.open.clear()
    done = not judge.open
    next_check = None if done else min([*judge.next_check, first_seen_ms + config.max_wait_ms])
    return Decision(tuple(judge.verdicts), done, judge.passed_at, next_check)
