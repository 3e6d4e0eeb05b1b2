"""How a new judgement of a hop combines with the verdict already stored for it.

The streaming detector drops a message's state once it is decided; a trace of that message
arriving later (a group that rewinds minutes after, a processor that held the message past the
maximum wait) starts a fresh state that is judged on the late traces alone. Stored as it comes,
that judgement would overwrite a verdict decided on complete evidence with one decided on less:
a DELIVERED write hop turned into a false TRACE_LOST, a duplicate never reported. So:

- **Late evidence never makes a verdict worse.** A detector judgement from a fresh state (its
  ``first_seen_ms`` differs from the stored verdict's) is late evidence: it replaces the stored
  verdict only where it adds to it (a PENDING it shows was passed, a TRACE_LOST a trace now shows), turns it
  into what both together say where the detector can tell at once (a LOST contradicted by a receipt: RETRACTED; the same
  record read again: DUPLICATE, rewind/replay; the id received or written again at another offset: DUPLICATE,
  by a retry, or by replay when the same late state shows its processor read its input again), and otherwise
  leaves it as it is. Either way the verdict is marked ``late_evidence``, and the next reconciliation
  re-decides the message with all its traces. (A state still in flight reports a hop again when a receipt traced
  since changes it, :func:`khipu.detector.decide.to_report`: taken as the same state's judgement, but a LOST it
  contradicts is RETRACTED all the same.)
- **Reconciliation decides with all the traces it reads**, so its judgement replaces the stored
  one, in final form: a LOST still missing past the horizon is CONFIRMED_LOST; a stored LOST the
  full evidence contradicts is RETRACTED (saying what the hop really got and which trace showed
  it). Never worse either: a PENDING never replaces a decided verdict, and a stored receipt (or a
  duplicate's count) is never turned into less by a read that lacks a trace the stored one saw.

- **Kafka's own semantics are final.** ABORTED (a transaction that aborted) and SUPERSEDED (compacted behind
  a later record of its key) are never undone: the record they are about may leave the log since, and a judge
  that can no longer ask the log must not turn them into a loss. A provisional loss the full evidence shows to
  be one of them becomes it (the history says it was not a loss).
- **A resend closes a confirmed loss.** The detector's RESENT (the resent copy arrived) replaces a loss or
  an UNRECOVERABLE; the resend task's UNRECOVERABLE replaces a CONFIRMED_LOST. Reconciliation never
  turns either back into a loss: its window's traces predate the resend.

A changed verdict keeps the time it was first decided (its metrics minute); the history records
when and why it changed.

Each rule is a small named predicate over (stored, judged); the first that holds gives the result
(:data:`DETECTOR_RULES`, :data:`RECONCILIATION_RULES`). :func:`settle` returns ``None`` when
nothing stored would change, so applying the same judgement twice changes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from khipu.verdicts.model import (
    FINAL_KINDS,
    KAFKA_SEMANTICS_KINDS,
    LOSS_KINDS,
    RECEIPT_KINDS,
    RESEND_KINDS,
    Cause,
    Verdict,
    VerdictKind,
)


class Judge(StrEnum):
    DETECTOR = "detector"
    RECONCILIATION = "reconciliation"
    RESEND = "resend"  # the resend task: a confirmed loss it cannot recover is UNRECOVERABLE


@dataclass(frozen=True, slots=True)
class Change:
    """What to store for a hop, and why (the verdict's history keeps the reason)."""

    verdict: Verdict
    reason: str
    previous: Verdict | None = None  # what was stored before


def clock(ms: int | None) -> str:
    """A time as a stream owner reads it: 2026-11-23 10:02:07 UTC."""
    if ms is None:
        return "an unknown time"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def shown_by(judged: Verdict) -> str:
    """The trace (or inference) a judgement rests on, in words."""
    trace = "SENT" if judged.hop_kind == "write" else "RECEIVED"
    where = f" at offset {judged.offset}" if judged.offset is not None else ""
    if judged.observed_ms is not None:
        return f"{trace} trace at {clock(judged.observed_ms)}{where}"
    return f"{judged.kind.value}{where}: {judged.detail}"


Rule = tuple[Callable[[Verdict | None, Verdict], bool], Callable[[Verdict | None, Verdict], Change | None]]


# -- the streaming detector's judgements -------------------------------------------------------------------


def nothing_stored(stored: Verdict | None, judged: Verdict) -> bool:
    return stored is None


def same_state(stored: Verdict | None, judged: Verdict) -> bool:
    """Judged from the same detector state as the stored verdict (a batch replayed after a restart, or a
    PENDING hop decided on): the judgement has at least the evidence the stored verdict had. (A verdict
    settled from late evidence records the late state's ``first_seen_ms``: a replay of it lands here.)"""
    return (
        stored is not None
        and stored.decided_by == Judge.DETECTOR
        and stored.first_seen_ms is not None
        and stored.first_seen_ms == judged.first_seen_ms
    )


def loss_contradicted(stored: Verdict | None, judged: Verdict) -> bool:
    return stored is not None and stored.kind in LOSS_KINDS and judged.kind in RECEIPT_KINDS


def resend_arrived(stored: Verdict | None, judged: Verdict) -> bool:
    return (
        judged.kind is VerdictKind.RESENT
        and stored is not None
        and (stored.kind in LOSS_KINDS or stored.kind is VerdictKind.UNRECOVERABLE)
    )


def _take_resent(stored: Verdict | None, judged: Verdict) -> Change | None:
    assert stored is not None  # keeps the cause: why it was lost stays known after it is recovered
    resent = dataclasses.replace(_in_first_minute(stored, judged), cause=stored.cause, late_evidence=False)
    return Change(resent, f"resent: {judged.detail}")


def stored_is_final(stored: Verdict | None, judged: Verdict) -> bool:
    return stored is not None and stored.kind in FINAL_KINDS


def pending_received(stored: Verdict | None, judged: Verdict) -> bool:
    """A PENDING hop that late traces show was passed. (A LOST from a fresh state is not taken: the group's
    RECEIVED trace may have been in the state that was dropped.)"""
    return stored is not None and stored.kind is VerdictKind.PENDING and judged.kind in RECEIPT_KINDS


def trace_found(stored: Verdict | None, judged: Verdict) -> bool:
    """A TRACE_LOST hop (it happened, no trace showed it) that a late trace shows: the receipt it now shows is what
    the rules say of the hop with that trace (a group that read the record again after a rebalance, its first
    RECEIVED trace lost)."""
    return (
        stored is not None
        and stored.kind is VerdictKind.TRACE_LOST
        and judged.kind in (VerdictKind.DELIVERED, VerdictKind.DUPLICATE)
    )


def same_record_read_again(stored: Verdict | None, judged: Verdict) -> bool:
    """A group received the record again (it rewound): the stored receipt and the late one are at the
    same position of the same read hop."""
    receipts = (VerdictKind.DELIVERED, VerdictKind.DUPLICATE)
    return (
        stored is not None
        and judged.hop_kind == "read"
        and stored.kind in receipts
        and judged.kind in receipts
        and stored.offset is not None
        and (stored.partition, stored.offset) == (judged.partition, judged.offset)
    )


def received_at_another_position(stored: Verdict | None, judged: Verdict) -> bool:
    """The hop got the message again at another position after it was decided: the id sits at two offsets of the
    topic (a write hop: written again; a read hop: the group read the second copy)."""
    receipts = (VerdictKind.DELIVERED, VerdictKind.DUPLICATE)
    return (
        stored is not None
        and stored.kind in receipts
        and judged.kind in receipts
        and stored.offset is not None
        and judged.offset is not None
        and (stored.partition, stored.offset) != (judged.partition, judged.offset)
    )


def _take(stored: Verdict | None, judged: Verdict) -> Change | None:
    if stored is not None and _same(stored, judged):
        return None
    return Change(_in_first_minute(stored, judged), "decided" if stored is None else f"decided again: {judged.detail}")


def _take_replay(stored: Verdict | None, judged: Verdict) -> Change | None:
    """The same state again: a verdict already settled from late evidence stays as settled (a replayed
    batch must not count a re-read twice); otherwise the judgement is taken."""
    assert stored is not None
    if stored.late_evidence:
        return None
    return _take(stored, judged)


def _in_first_minute(stored: Verdict | None, verdict: Verdict) -> Verdict:
    """A verdict keeps the time it was first decided (its metrics minute); the history keeps each change."""
    return verdict if stored is None else dataclasses.replace(verdict, decided_ms=stored.decided_ms)


def _retract(stored: Verdict | None, judged: Verdict) -> Change | None:
    assert stored is not None
    late = judged.decided_by == Judge.DETECTOR
    retracted = dataclasses.replace(
        _in_first_minute(stored, judged),
        kind=VerdictKind.RETRACTED,
        evidence_kind=judged.evidence_kind or judged.kind,
        late_evidence=late,
        detail=f"{stored.kind.value} at {clock(stored.decided_ms)} retracted: {shown_by(judged)}",
    )
    return None if _same(stored, retracted) else Change(retracted, f"retracted: {shown_by(judged)}")


def _keep_with_late_evidence(stored: Verdict | None, judged: Verdict) -> Change | None:
    assert stored is not None
    if stored.late_evidence:
        return None
    return Change(
        dataclasses.replace(stored, late_evidence=True),
        f"late evidence ({judged.kind.value} from traces that came after it was decided) kept for reconciliation",
    )


def _decide_pending(stored: Verdict | None, judged: Verdict) -> Change | None:
    decided = dataclasses.replace(_in_first_minute(stored, judged), late_evidence=True)
    return Change(decided, f"late evidence decided it: {judged.detail}")


def _late_duplicate(stored: Verdict, judged: Verdict, cause: Cause, detail: str, reason: str) -> Change:
    """The stored receipt made a DUPLICATE by a late one: counts added, flagged, and keyed by the late state (a
    replay of that state is recognised as such)."""
    duplicate = dataclasses.replace(
        stored,
        kind=VerdictKind.DUPLICATE,
        cause=cause,
        count=stored.count + judged.count,
        late_evidence=True,
        first_seen_ms=judged.first_seen_ms,
        detail=detail,
    )
    return Change(duplicate, f"{reason}: {shown_by(judged)}")


def _read_again(stored: Verdict | None, judged: Verdict) -> Change | None:
    assert stored is not None
    count = stored.count + judged.count
    detail = f"offset {stored.offset} was read again at {clock(judged.observed_ms)}, after it was decided: "
    return _late_duplicate(stored, judged, Cause.REWIND_REPLAY, f"{detail}{count} reads in all", "read again")


def _at_another_position(stored: Verdict | None, judged: Verdict) -> Change | None:
    """A duplicate at once, with the cause the detector's own rules give the two together: a read hop's id read at
    several offsets is a producer's retry unless one offset was read twice, by the stored verdict or the judgement
    (a re-read comes first when both apply, as in the read rules); the judgement carries a re-read :func:`settle_batch`
    infers (the group had already read every copy written). A write hop is written again by replay when its processor
    read its input record again (the judgement carries that cause, :func:`settle_batch`), else by a retry."""
    assert stored is not None
    if Cause.REWIND_REPLAY in (stored.cause, judged.cause):  # a re-read (or replay) at the hop comes first
        cause = Cause.REWIND_REPLAY
    elif stored.kind is VerdictKind.DUPLICATE and stored.cause is not None:
        cause = stored.cause
    else:
        cause = judged.cause or Cause.PRODUCER_RETRY
    what = "written" if judged.hop_kind == "write" else "read"
    detail = f"{what} again at offset {judged.offset} at {clock(judged.observed_ms)}, after it was decided at offset "
    detail += f"{stored.offset}: {stored.count + judged.count} in all"
    return _late_duplicate(stored, judged, cause, detail, f"{what} again at another offset")


# A detector judgement: the first rule that holds gives what to store.
DETECTOR_RULES: tuple[Rule, ...] = (
    (nothing_stored, _take),
    (loss_contradicted, _retract),  # from the same state too: a receipt traced after the LOST was reported
    (same_state, _take_replay),
    (resend_arrived, _take_resent),
    (stored_is_final, _keep_with_late_evidence),
    (pending_received, _decide_pending),
    (trace_found, _decide_pending),
    (same_record_read_again, _read_again),
    (received_at_another_position, _at_another_position),
    (lambda stored, judged: True, _keep_with_late_evidence),  # judged on less than the stored verdict
)


# -- reconciliation's judgements (all the traces) ----------------------------------------------------------


def resend_settled(stored: Verdict | None, judged: Verdict) -> bool:
    return stored is not None and stored.kind in RESEND_KINDS


def kafka_semantics_settled(stored: Verdict | None, judged: Verdict) -> bool:
    """ABORTED or SUPERSEDED stored: Kafka said so while the record was there to ask about."""
    return stored is not None and stored.kind in KAFKA_SEMANTICS_KINDS


def loss_explained_by_kafka(stored: Verdict | None, judged: Verdict) -> bool:
    """A stored loss (or a hop left PENDING) that all the evidence shows was an aborted transaction, or compaction."""
    undecided = (*LOSS_KINDS, VerdictKind.PENDING)
    return judged.kind in KAFKA_SEMANTICS_KINDS and stored is not None and stored.kind in undecided


def _not_a_loss(stored: Verdict | None, judged: Verdict) -> Change | None:
    assert stored is not None
    explained = _in_first_minute(stored, judged)
    return Change(explained, f"not a loss: {judged.kind.value}: {judged.detail}")


def judged_pending_over_decided(stored: Verdict | None, judged: Verdict) -> bool:
    return stored is not None and stored.kind is not VerdictKind.PENDING and judged.kind is VerdictKind.PENDING


def fewer_receipts_than_stored(stored: Verdict | None, judged: Verdict) -> bool:
    """The stored verdict saw the hop happen (more often) than this judgement does: the archive read lacks
    evidence the stored verdict had (a trace outside the hours read). Never worse: the stored one stays."""
    if stored is None:
        return False
    received = {VerdictKind.DELIVERED, VerdictKind.DUPLICATE, VerdictKind.TRACE_LOST, VerdictKind.RETRACTED}
    if stored.kind in received and judged.kind in LOSS_KINDS:
        return True
    counted = (VerdictKind.DELIVERED, VerdictKind.DUPLICATE)
    return stored.kind in counted and judged.kind in counted and judged.count < stored.count


def still_missing(stored: Verdict | None, judged: Verdict) -> bool:
    return judged.kind is VerdictKind.LOST


def loss_withdrawn(stored: Verdict | None, judged: Verdict) -> bool:
    return stored is not None and stored.kind in (*LOSS_KINDS, VerdictKind.RETRACTED)


def _keep_decided(stored: Verdict | None, judged: Verdict) -> Change | None:
    assert stored is not None
    if not stored.late_evidence:
        return None
    return Change(dataclasses.replace(stored, late_evidence=False), f"reconciled, kept: {judged.kind.value} says less")


def _confirm(stored: Verdict | None, judged: Verdict) -> Change | None:
    confirmed = dataclasses.replace(
        judged,
        kind=VerdictKind.CONFIRMED_LOST,
        evidence_kind=VerdictKind.LOST,
        detail=f"still missing past the reconciliation horizon: {judged.detail}",
    )
    return _take(stored, confirmed)


# A reconciliation judgement: the first rule that holds gives what to store.
RECONCILIATION_RULES: tuple[Rule, ...] = (
    (resend_settled, _keep_decided),
    (kafka_semantics_settled, _keep_decided),
    (loss_explained_by_kafka, _not_a_loss),
    (judged_pending_over_decided, _keep_decided),
    (fewer_receipts_than_stored, _keep_decided),
    (still_missing, _confirm),
    (loss_withdrawn, _retract),
    (lambda stored, judged: True, _take),
)


# -- the resend task's judgements ---------------------------------------------------------------------------


def gives_up_on_confirmed_loss(stored: Verdict | None, judged: Verdict) -> bool:
    return judged.kind is VerdictKind.UNRECOVERABLE and stored is not None and stored.kind is VerdictKind.CONFIRMED_LOST


def _give_up(stored: Verdict | None, judged: Verdict) -> Change | None:
    assert stored is not None
    unrecoverable = dataclasses.replace(
        stored, kind=VerdictKind.UNRECOVERABLE, decided_by=Judge.RESEND.value, detail=judged.detail
    )
    return Change(unrecoverable, judged.detail)


# The resend task's judgement: only a confirmed loss becomes UNRECOVERABLE (a RESENT or a retraction that came
# first stands).
RESEND_RULES: tuple[Rule, ...] = (
    (gives_up_on_confirmed_loss, _give_up),
    (lambda stored, judged: True, lambda stored, judged: None),
)
JUDGES = {Judge.DETECTOR: DETECTOR_RULES, Judge.RECONCILIATION: RECONCILIATION_RULES, Judge.RESEND: RESEND_RULES}


def settle(stored: Verdict | None, judged: Verdict) -> Change | None:
    """What to store for the hop given what is stored and a new judgement (``judged.decided_by`` says whose):
    ``None`` when nothing changes."""
    rules = JUDGES[Judge(judged.decided_by)]
    change = next(build(stored, judged) for holds, build in rules if holds(stored, judged))
    return None if change is None else dataclasses.replace(change, previous=stored)


def settle_batch(
    judged: Sequence[Verdict],
    stored: Mapping[str, Mapping[str, Verdict]],
    feeders: Mapping[tuple[str, str], Collection[str]] | None = None,
) -> list[Change | None]:
    """:func:`settle` for each of one detector batch's judgements, against ``stored`` (message id -> hop -> verdict).
    A processor's late write at another offset takes its cause from its input reads (``feeders``: (stream, write
    hop id) -> the processor's input read hop ids, from the route): when the same late state showed the processor
    reading its input record again (an input read hop made DUPLICATE rewind/replay by a state first seen when the
    write's was, in this batch or an earlier one), it replayed its input and wrote it again (``REWIND_REPLAY``, as
    the write rules say when one state holds both reads); otherwise it is a retry. A late read at another position of
    a read hop that had already read as many records of the id as its topic's writers wrote (their verdicts, stored
    or late in this batch) is a re-read of one of them (``REWIND_REPLAY``), not another copy: a stored verdict names
    one position only."""
    settled: dict[tuple[str, str], Verdict] = {}  # this batch's changes: later judgements meet them

    def before(message_id: str, hop: str) -> Verdict | None:
        key = (message_id, hop)
        return settled[key] if key in settled else stored.get(message_id, {}).get(hop)

    def input_replayed(write: Verdict) -> bool:
        reads = [before(write.message_id, hop) for hop in (feeders or {}).get((write.stream, write.hop), ())]
        return any(
            read is not None
            and read.kind is VerdictKind.DUPLICATE
            and read.cause is Cause.REWIND_REPLAY
            and read.first_seen_ms == write.first_seen_ms
            for read in reads
        )

    def copies_written(read: Verdict) -> int | None:
        """How many records of the id the writers of the read hop's topic wrote: their stored (or this batch's
        settled) counts, plus the copies this batch's late writes add at other positions. None when that is not
        known (no writer's verdict, or one that counts nothing: a trace lost, a loss)."""
        topic = topic_of(read)
        message = stored.get(read.message_id, {})
        hops = {h for h, v in message.items() if v.hop_kind == "write" and topic_of(v) == topic}
        hops |= {h for (m, h), v in settled.items() if m == read.message_id and v.hop_kind == "write"
                 and topic_of(v) == topic}  # fmt: skip
        late = [v for v in judged if v.message_id == read.message_id and v.hop_kind == "write" and topic_of(v) == topic]
        writes = [w for w in (before(read.message_id, h) for h in sorted(hops)) if w is not None]
        if not writes or any(w.kind not in (VerdictKind.DELIVERED, VerdictKind.DUPLICATE) for w in writes):
            return None
        added = sum(
            v.count for v in late if v.hop not in hops or received_at_another_position(before(v.message_id, v.hop), v)
        )
        return sum(w.count for w in writes) + added

    def with_cause(verdict: Verdict) -> Verdict:
        stored_now = before(verdict.message_id, verdict.hop)
        written_again = verdict.hop_kind == "write" and received_at_another_position(stored_now, verdict)
        if written_again and verdict.cause is None and input_replayed(verdict):
            return dataclasses.replace(verdict, cause=Cause.REWIND_REPLAY)
        read_again = verdict.hop_kind == "read" and received_at_another_position(stored_now, verdict)
        if read_again and verdict.cause is not Cause.REWIND_REPLAY:
            assert stored_now is not None
            copies = copies_written(verdict)
            if copies is not None and stored_now.count >= copies:  # every copy read already: this one is read again
                return dataclasses.replace(verdict, cause=Cause.REWIND_REPLAY)
        return verdict

    changes: dict[int, Change | None] = {}
    reads_first = sorted(range(len(judged)), key=lambda i: judged[i].hop_kind != "read")
    for i in reads_first:
        verdict = judged[i]
        change = settle(before(verdict.message_id, verdict.hop), with_cause(verdict))
        if change is not None:
            settled[(verdict.message_id, verdict.hop)] = change.verdict
        changes[i] = change
    return [changes[i] for i in range(len(judged))]


def topic_of(verdict: Verdict) -> str:
    """The ``cluster/topic`` of a verdict's hop, from its id: ``location -> cluster/topic`` (a write),
    ``cluster/topic -> group`` (a read)."""
    before, _, after = verdict.hop.partition(" -> ")
    return after if verdict.hop_kind == "write" else before


def _same(a: Verdict, b: Verdict) -> bool:
    """Equal in everything a stream owner reads of a verdict (not when, nor by whom, it was decided: a
    reconciliation that agrees with the detector changes nothing)."""
    fields = ("kind", "cause", "count", "partition", "offset", "evidence_kind", "late_evidence")
    return all(getattr(a, name) == getattr(b, name) for name in fields)
