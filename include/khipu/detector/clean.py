"""The rules of :func:`~khipu.detector.decide.decide`, applied at once to many messages whose traces are clean.

At 25,000 traces/s the detector cannot afford a Python call of ``decide`` per message and evaluation.
Almost every message is *clean*: on a simple route (:attr:`khipu.detector.routes.RoutePlan.simple`)
each hop it reached shows exactly one trace, all traces on a topic name the same position, and none is
a resend. For such messages the rules reduce to a few comparisons per hop, done here with numpy over
a grid of messages x hops:

- a read hop whose topic shows the message is settled once its group's committed offset passed the position
  (a group that keeps its offsets outside Kafka: once its receipt did; first seen at ``memo``, which starts at the
  commit history's first sight of it when there is one) and the grace has run out on the clock;
- a write hop is judged once no read hop holding it back (the readers of its topic, and a processor's
  input) is open;
- a topic with no trace, which a processor that wrote the message on must have read, is *implied*;
  its read hops settle ``grace_ms`` after the message was first seen.

Whenever those rules would say anything but DELIVERED — a read hop settled without its receive (LOST,
TRACE_LOST, ABORTED or SUPERSEDED), a write hop judged without its SENT (TRACE_LOST), a processor's input
settled while an output shows nothing (LOST, dropped), an implied read hop settled (TRACE_LOST), an unread
record that may have left the log, the maximum wait reached (PENDING) — or whenever they would ask the log
about a transaction (a transactional write no read_committed receipt proves committed, a read_uncommitted
receipt of a transactional record: it may be ABORTED) — the message is *out of the domain* here and
``decide`` judges it, from then on. Inside the domain this module gives exactly ``decide``'s answer:
the same DELIVERED verdicts (with their latencies), the same hops still open, the same memo of when
each group was first seen past the message. ``tests/unit/detector/test_clean.py`` proves it on the
rule table's clean cases and on random messages of random simple routes.

Arrays: ``n`` messages of one stream, ``H`` hops and ``T`` topics of its :class:`RoutePlan`. Unknown
values (no trace, no committed offset, no log start) are :data:`NONE`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from khipu.detector.model import NONE, DetectorConfig
from khipu.detector.routes import RoutePlan

Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class CleanGrid:
    """What is known of ``n`` messages of one stream, hop by hop (shapes (n, H) and (n, T))."""

    present: Bools  # (n, H) the hop's trace is here (exactly one)
    timestamp_ms: Ints  # (n, H) its time (NONE where absent)
    has_position: Bools  # (n, T) a trace names the message's position on the topic
    partition: Ints  # (n, T)
    offset: Ints  # (n, T)
    first_seen_ms: Ints  # (n,)
    memo_ms: Ints  # (n, H) read hops: when the group was first seen past the position (NONE: not yet)
    emitted: Bools  # (n, H) the hop's verdict was emitted before
    committed: Ints  # (n, H) read hops on a topic with a position: the group's committed offset there
    log_start: Ints  # (n, H) read hops on a topic with a position: the partition's log start
    transactional: Bools  # (n, T) the message's SENT trace on the topic says a transactional producer wrote it
    committed_read: Bools  # (n, T) a read_committed group's receipt on the topic (proof its transaction committed)
    uncommitted: Bools  # (n, H) read hops: the receipt is a read_uncommitted group's
    # (n, H) read hops: when the commit history first saw the group past the position (NONE: it does not show it)
    passed_since_ms: Ints


@dataclass(frozen=True)
class CleanJudgement:
    in_domain: Bools  # (n,) decided here; elsewhere decide judges the message
    deliver: Bools  # (n, H) DELIVERED now (not emitted before)
    done: Bools  # (n,) nothing open: the message's state can go
    memo_ms: Ints  # (n, H) updated memo
    next_check_ms: Ints  # (n,) when looking again can change something


def judge_clean(plan: RoutePlan, grid: CleanGrid, now_ms: int, clock_ms: int, config: DetectorConfig) -> CleanJudgement:
    """``decide`` for clean messages of a simple route, all at once (see the module doc)."""
    n = grid.first_seen_ms.shape[0]
    present, has_position = grid.present, grid.has_position
    first_seen = grid.first_seen_ms
    grace, recheck = config.grace_ms, config.recheck_ms

    implied = np.zeros_like(has_position)
    for processor in plan.processors:  # downstream first: an output's own implication is known
        wrote_on = np.zeros(n, dtype=bool)
        for topic in processor.output_topics:
            wrote_on |= has_position[:, topic] | implied[:, topic]
        implied[:, processor.input_topic] |= ~has_position[:, processor.input_topic] & wrote_on
    reached = has_position | implied

    out = clock_ms - first_seen >= config.max_wait_ms  # timed out: PENDING for what is open
    overdue = clock_ms - first_seen >= grace
    memo = grid.memo_ms.copy()
    settled = np.zeros_like(present)
    open_hops = np.zeros_like(present)
    deliver = np.zeros_like(present)
    next_check = first_seen + config.max_wait_ms

    for hop in range(plan.size):
        if not plan.is_read[hop]:
            continue
        topic = plan.hop_topic[hop]
        positioned = has_position[:, topic]
        offset = grid.offset[:, topic]
        passed = positioned & (grid.committed[:, hop] > offset)
        if not plan.commits_offsets[hop]:  # a group that keeps its offsets outside Kafka: its receipt passes it
            passed |= positioned & present[:, hop]
        # an unread record that may have left the log: decide asks whether it was removed (expired, truncated)
        out |= positioned & ~passed & overdue & (grid.log_start[:, hop] > offset)
        first_seen_past = _first_seen_past(plan, grid, hop, positioned & (grid.committed[:, hop] > offset), now_ms)
        memo[:, hop] = np.where(passed & (memo[:, hop] == NONE), first_seen_past, memo[:, hop])
        seen = memo[:, hop]
        settled_here = passed & (clock_ms - seen >= grace)
        out |= settled_here & ~present[:, hop]  # settled without its receive: LOST or TRACE_LOST
        # a read_uncommitted receipt of a transactional record: whether it committed is the log's to say
        out |= settled_here & present[:, hop] & grid.uncommitted[:, hop] & grid.transactional[:, topic]
        arrived = _arrived_past(plan, hop, present, has_position, implied)
        settled_implied = implied[:, topic] & arrived & (clock_ms >= first_seen + grace)
        out |= settled_implied  # TRACE_LOST: no trace on the topic at all
        settled[:, hop] = settled_here | settled_implied
        open_hops[:, hop] = reached[:, topic] & ~settled[:, hop]
        deliver[:, hop] = settled_here & present[:, hop]
        waiting = passed & ~settled_here
        next_check = np.where(waiting, np.minimum(next_check, seen + grace), next_check)
        unpassed = positioned & ~passed
        next_check = np.where(unpassed, np.minimum(next_check, now_ms + recheck), next_check)
        before_overdue = unpassed & ~overdue
        next_check = np.where(before_overdue, np.minimum(next_check, first_seen + grace), next_check)
        implied_open = implied[:, topic] & arrived & ~settled_implied
        next_check = np.where(
            implied_open, np.minimum(next_check, np.maximum(first_seen + grace, now_ms + 1)), next_check
        )

    for hop in range(plan.size):
        if plan.is_read[hop]:
            continue
        topic = plan.hop_topic[hop]
        blocked = np.zeros(n, dtype=bool)
        for blocker in plan.write_blockers[hop]:
            blocked |= open_hops[:, blocker]
        judged = reached[:, topic] & ~blocked
        out |= judged & ~present[:, hop]  # judged without its SENT: TRACE_LOST
        # a transactional write no read_committed receipt proves committed: the log is asked (it may have aborted)
        out |= judged & present[:, hop] & grid.transactional[:, topic] & ~grid.committed_read[:, topic]
        deliver[:, hop] = judged & present[:, hop]
        open_hops[:, hop] = reached[:, topic] & blocked

    for processor in plan.processors:
        read, source = processor.input_read, processor.input_topic
        for topic, write in zip(processor.output_topics, processor.output_writes, strict=True):
            missing = ~has_position[:, topic] & ~implied[:, topic]
            waiting_for_input = missing & has_position[:, source] & open_hops[:, read]
            open_hops[:, write] |= waiting_for_input
            out |= missing & has_position[:, source] & settled[:, read]  # got it, wrote nothing on: dropped

    deliver &= ~grid.emitted
    done = ~open_hops.any(axis=1)
    return CleanJudgement(~out, deliver & ~out[:, None], done & ~out, memo, np.maximum(next_check, now_ms + 1))


def _first_seen_past(plan: RoutePlan, grid: CleanGrid, read: int, by_commit: Bools, now_ms: int) -> Ints:
    """decide's ``first_seen_past_ms``: where the commit passed the position and the history shows when, at or after
    the record's write (its SENT trace's time), that time (never after now); now elsewhere."""
    topic = plan.hop_topic[read]
    written = np.full(grid.present.shape[0], NONE, dtype=np.int64)
    for write in plan.writers[topic]:  # decide's "when written": the earliest SENT at the position
        stamped = grid.present[:, write]
        earlier = stamped & ((written == NONE) | (grid.timestamp_ms[:, write] < written))
        written = np.where(earlier, grid.timestamp_ms[:, write], written)
    since = grid.passed_since_ms[:, read]
    known = by_commit & (since != NONE) & (written != NONE) & (since >= written)
    return np.where(known, np.minimum(since, now_ms), now_ms)


def _arrived_past(plan: RoutePlan, read: int, present: Bools, has_position: Bools, implied: Bools) -> Bools:
    """decide's ``arrived_past``: the reading group is a processor and something of it shows on an output."""
    index = plan.processor_of_read[read]
    if index < 0:
        return np.zeros(present.shape[0], dtype=bool)
    processor = plan.processors[index]
    shown = np.zeros(present.shape[0], dtype=bool)
    for topic, write in zip(processor.output_topics, processor.output_writes, strict=True):
        shown |= present[:, write] | has_position[:, topic] | implied[:, topic]
    return shown


@dataclass(frozen=True)
class DeliveredCells:
    """The DELIVERED verdicts of :attr:`CleanJudgement.deliver`, column by column (one entry per verdict)."""

    message: Ints  # row index into the grid
    hop: Ints  # local hop index
    partition: Ints
    offset: Ints
    observed_ms: Ints
    latency_ms: Ints  # NONE: not known
    e2e_latency_ms: Ints  # NONE: not known


def delivered_cells(plan: RoutePlan, grid: CleanGrid, deliver: Bools) -> DeliveredCells:
    """Where each DELIVERED verdict sits and its latencies, as ``decide`` computes them: a read hop from the
    write of its record (the SENT trace at that position), a processor's write from its receive, every hop
    from the source's write."""
    ts, present = grid.timestamp_ms, grid.present
    message, hop = np.nonzero(deliver)
    topic = np.asarray(plan.hop_topic, dtype=np.int64)[hop]
    observed = ts[message, hop]
    source = np.full(ts.shape[0], NONE, dtype=np.int64)
    for write in plan.source_writes:  # the earliest SENT of a source
        source = np.where(present[:, write] & ((source == NONE) | (ts[:, write] < source)), ts[:, write], source)
    # the hop the latency is measured from: a read hop's topic writer; a processor's write, its input read
    previous = np.full(plan.size, -1, dtype=np.int64)
    for local in range(plan.size):
        if plan.is_read[local]:
            previous[local] = plan.writers[plan.hop_topic[local]][0]
    for processor in plan.processors:
        for write in processor.output_writes:
            previous[write] = processor.input_read
    # a processor's write stamped with its input record's own timestamp (carried on): no latency of its own
    input_writer = np.full(plan.size, -1, dtype=np.int64)
    for processor in plan.processors:
        for write in processor.output_writes:
            input_writer[write] = plan.writers[processor.input_topic][0]
    before = previous[hop]
    has_before = before >= 0
    before_index = np.where(has_before, before, 0)
    known = has_before & present[message, before_index]
    carrier = input_writer[hop]
    carrier_index = np.where(carrier >= 0, carrier, 0)
    carried = (carrier >= 0) & present[message, carrier_index] & (ts[message, carrier_index] == observed)
    latency = np.where(known & ~carried, observed - ts[message, before_index], NONE)
    e2e = np.where(source[message] != NONE, observed - source[message], NONE)
    return DeliveredCells(
        message=message.astype(np.int64),
        hop=hop.astype(np.int64),
        partition=grid.partition[message, topic],
        offset=grid.offset[message, topic],
        observed_ms=observed,
        latency_ms=latency,
        e2e_latency_ms=e2e,
    )
