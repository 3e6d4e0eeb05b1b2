"""How a new judgement combines with the stored verdict: a numbered table of cases, each with its reason.

Times: the message was first seen by the detector at 1_000 and decided at 40_000; a fresh state
(late traces) first saw it at 500_000.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import pytest

from khipu.verdicts.model import Cause, Verdict, VerdictKind
from khipu.verdicts.settle import Judge, settle, settle_batch

D, L, DUP, TL, P = (
    VerdictKind.DELIVERED,
    VerdictKind.LOST,
    VerdictKind.DUPLICATE,
    VerdictKind.TRACE_LOST,
    VerdictKind.PENDING,
)
CL, R, RS, UN = VerdictKind.CONFIRMED_LOST, VerdictKind.RETRACTED, VerdictKind.RESENT, VerdictKind.UNRECOVERABLE
AB, SUP = VerdictKind.ABORTED, VerdictKind.SUPERSEDED
FIRST, FRESH = 1_000, 500_000


def hop(
    kind: VerdictKind,
    *,
    cause: Cause | None = None,
    count: int = 1,
    offset: int | None = 7,
    seen: int = FIRST,
    by: Judge = Judge.DETECTOR,
    hop_kind: str = "read",
    late: bool = False,
    evidence: VerdictKind | None = None,
) -> Verdict:
    return Verdict(
        message_id="m1",
        stream="orders",
        hop="local/out -> s1" if hop_kind == "read" else "proc -> local/out",
        hop_kind=hop_kind,
        kind=kind,
        cause=cause,
        count=count if kind in (D, DUP, R, RS) else 0,
        topic="out",
        partition=0 if offset is not None else None,
        offset=offset,
        group="s1" if hop_kind == "read" else None,
        location=None if hop_kind == "read" else "proc",
        observed_ms=seen + 300 if kind in (D, DUP) else None,
        latency_ms=None,
        e2e_latency_ms=None,
        decided_ms=seen + 39_000,
        detail=f"{kind.value} detail",
        first_seen_ms=seen,
        decided_by=by.value,
        evidence_kind=evidence,
        late_evidence=late,
    )


class Case(NamedTuple):
    number: int
    stored: Verdict | None
    judged: Verdict
    expected: tuple[VerdictKind, Cause | None, int, bool] | None  # (kind, cause, count, late evidence); None: no change
    reason: str


SKIP = Cause.SKIPPED_BY_CONSUMER
# fmt: off
CASES = [
    Case(1, None, hop(D), (D, None, 1, False), "nothing stored: the judgement is stored as it is"),
    Case(2, hop(D), hop(D), None, "the same state judged the same again (a replayed batch): nothing changes"),
    Case(3, hop(P, offset=7), hop(D), (D, None, 1, False),
         "the same state decided a hop it had handed over as PENDING: the decision has more evidence"),
    Case(4, hop(D, hop_kind="write"), hop(TL, hop_kind="write", seen=FRESH), (D, None, 1, True),
         "a fresh state of late RECEIVED traces has no SENT: its TRACE_LOST is judged on less than the stored "
         "DELIVERED, which stays; reconciliation re-decides the message"),
    Case(5, hop(D), hop(D, seen=FRESH), (DUP, Cause.REWIND_REPLAY, 2, True),
         "the group read the same record again minutes after it was decided: a duplicate by rewind, at once"),
    Case(6, hop(DUP, cause=Cause.REWIND_REPLAY, count=2), hop(D, seen=FRESH), (DUP, Cause.REWIND_REPLAY, 3, True),
         "a third read of the same record adds to the duplicate's count"),
    Case(7, hop(D), hop(D, offset=9, seen=FRESH), (DUP, Cause.PRODUCER_RETRY, 2, True),
         "a late read at another offset: the id sits at two offsets and the group read both, a duplicate by retry "
         "at once (the read rules' 'the id was read at several offsets'); flagged for reconciliation"),
    Case(38, hop(DUP, cause=Cause.REWIND_REPLAY, count=2), hop(D, offset=9, seen=FRESH),
         (DUP, Cause.REWIND_REPLAY, 3, True),
         "a late read at another offset of a hop that already read one offset twice: the rules' first cause stays"),
    Case(45, hop(DUP, cause=Cause.PRODUCER_RETRY, count=2), hop(DUP, cause=Cause.REWIND_REPLAY, count=2, offset=9,
         seen=FRESH), (DUP, Cause.REWIND_REPLAY, 4, True),
         "a hop that read two copies of the id (a retry) reads one of them twice later: both causes apply, and a "
         "re-read at the hop comes first, as in the read rules (decide's case 64): rewind/replay"),
    Case(39, hop(D, hop_kind="write"), hop(D, hop_kind="write", offset=9, seen=FRESH),
         (DUP, Cause.PRODUCER_RETRY, 2, True),
         "a late SENT at another offset, its processor's input not read again in the batch: written twice, a retry"),
    Case(40, hop(D, hop_kind="write"), hop(D, hop_kind="write", offset=9, seen=FRESH,
         cause=Cause.REWIND_REPLAY), (DUP, Cause.REWIND_REPLAY, 2, True),
         "a late SENT at another offset that the batch shows followed its processor reading its input again "
         "(settle_batch gives the judgement that cause): written twice by replay"),
    Case(41, hop(D), hop(TL, offset=9, seen=FRESH), (D, None, 1, True),
         "a fresh state's TRACE_LOST at another position is judged on less: kept, flagged"),
    Case(8, hop(L, cause=SKIP, count=0), hop(D, seen=FRESH), (R, None, 1, True),
         "a late RECEIVED trace contradicts the LOST: retracted at once, saying what the hop got"),
    Case(42, hop(L, cause=SKIP, count=0), hop(D, offset=9), (R, None, 1, True),
         "the same state, its message still in flight, reports the LOST hop again with the receipt of a copy "
         "traced since (decide.to_report): retracted at once all the same, never quietly replaced"),
    Case(43, hop(TL, count=0), hop(D, offset=9), (D, None, 1, False),
         "the same state reports a TRACE_LOST hop again with the copy's traced receipt: replaced"),
    Case(44, hop(TL, count=0), hop(D, seen=FRESH), (D, None, 1, True),
         "a group read the record again after its message was decided, its first RECEIVED trace lost: the late "
         "trace shows the receipt the TRACE_LOST stood for; taken, flagged (a one-broker freeze run, 1 of 1,458)"),
    Case(9, hop(P), hop(D, seen=FRESH), (D, None, 1, True),
         "late traces decide a PENDING hop: taken, and reconciliation confirms it with all the traces"),
    Case(10, hop(D, late=True), hop(TL, seen=FRESH), None,
         "already flagged as having late evidence: another weaker judgement changes nothing"),
    Case(11, hop(CL, cause=SKIP, count=0, by=Judge.RECONCILIATION, evidence=L), hop(L, cause=SKIP, seen=FRESH),
         (CL, SKIP, 0, True), "a confirmed loss stays confirmed when a fresh state says LOST again; flagged"),
    Case(12, hop(L, cause=SKIP, count=0), hop(L, cause=SKIP, count=0, by=Judge.RECONCILIATION),
         (CL, SKIP, 0, False), "reconciliation, with all the traces, still finds it missing: CONFIRMED_LOST"),
    Case(13, hop(L, cause=SKIP, count=0), hop(D, by=Judge.RECONCILIATION), (R, None, 1, False),
         "reconciliation finds the RECEIVED trace the detector had not seen in time: the LOST is retracted"),
    Case(14, hop(D, late=True), hop(DUP, cause=Cause.REWIND_REPLAY, count=2, by=Judge.RECONCILIATION),
         (DUP, Cause.REWIND_REPLAY, 2, False), "reconciliation re-decides a hop with late evidence: its verdict wins"),
    Case(15, hop(D), hop(P, by=Judge.RECONCILIATION), None,
         "reconciliation could not decide (no committed offset past it): a PENDING never replaces a decision"),
    Case(16, hop(CL, cause=SKIP, count=0, by=Judge.RECONCILIATION, evidence=L),
         hop(L, cause=SKIP, count=0, by=Judge.RECONCILIATION), None,
         "the same window reconciled twice: the second run changes nothing"),
    Case(17, hop(P), hop(P, by=Judge.RECONCILIATION), None,
         "still undecided after reconciliation: stays PENDING, nothing to write (the health view says which "
         "group is stuck)"),
    Case(24, hop(D), hop(D, by=Judge.RECONCILIATION), None,
         "reconciliation agrees with the detector: nothing changes (no row rewritten, no history)"),
    Case(18, hop(R, by=Judge.RECONCILIATION, evidence=D), hop(D, by=Judge.RECONCILIATION), None,
         "a retracted loss reconciled again: still retracted, nothing changes"),
    Case(19, hop(DUP, cause=Cause.REWIND_REPLAY, count=2, seen=FRESH, late=True), hop(D, seen=FRESH), None,
         "the batch that brought the re-read is replayed after a restart: the read is not counted twice"),
    Case(20, hop(P), hop(L, cause=SKIP, seen=FRESH), (P, None, 0, True),
         "a fresh state says LOST of a PENDING hop: the group's RECEIVED may have been in the dropped state; "
         "not taken, flagged for reconciliation"),
    Case(21, hop(D, late=True), hop(L, cause=SKIP, by=Judge.RECONCILIATION), (D, None, 1, False),
         "reconciliation's read lacks the RECEIVED the stored verdict saw (outside the hours read): a receipt "
         "is never turned into a loss"),
    Case(22, hop(DUP, cause=Cause.REWIND_REPLAY, count=2, late=True), hop(D, by=Judge.RECONCILIATION),
         (DUP, Cause.REWIND_REPLAY, 2, False),
         "reconciliation sees one read where the stored duplicate counted two: the duplicate stays"),
    Case(23, hop(R, by=Judge.RECONCILIATION, evidence=D), hop(L, cause=SKIP, by=Judge.RECONCILIATION), None,
         "a retraction is never undone into a loss by a read that misses the retracting trace"),
    Case(25, hop(CL, cause=SKIP, count=0, by=Judge.RECONCILIATION, evidence=L), hop(RS, seen=FRESH, offset=20),
         (RS, SKIP, 1, False), "the resent copy arrived at a confirmed loss: RESENT, keeping why it was lost"),
    Case(26, hop(L, cause=SKIP, count=0), hop(RS, seen=FRESH, offset=20), (RS, SKIP, 1, False),
         "a resend that arrives while the loss is still provisional closes it too"),
    Case(27, hop(UN, cause=SKIP, count=0, by=Judge.RESEND), hop(RS, seen=FRESH, offset=20), (RS, SKIP, 1, False),
         "the copy of an attempt given up on arrived after all: what happened wins"),
    Case(28, hop(RS, cause=SKIP, offset=20, seen=FRESH), hop(L, cause=SKIP, by=Judge.RECONCILIATION), None,
         "reconciling the loss's hour again (its traces predate the resend) never turns RESENT back into a loss"),
    Case(29, hop(RS, cause=SKIP, offset=20, seen=FRESH), hop(D, seen=3 * FRESH), (RS, SKIP, 1, True),
         "a later trace after RESENT is kept as late evidence, as for any final verdict"),
    Case(30, hop(CL, cause=SKIP, count=0, by=Judge.RECONCILIATION, evidence=L), hop(UN, by=Judge.RESEND, count=0),
         (UN, SKIP, 0, False), "the resend task gives up on a confirmed loss: UNRECOVERABLE, keeping the cause"),
    Case(31, hop(RS, cause=SKIP, offset=20, seen=FRESH), hop(UN, by=Judge.RESEND, count=0), None,
         "a loss already RESENT is never made UNRECOVERABLE by a late give-up"),
    # Kafka's own semantics: final once said
    Case(32, hop(AB, count=0), hop(L, cause=SKIP, count=0, by=Judge.RECONCILIATION), None,
         "ABORTED stays: reconciliation, hours later, may find the aborted record cleaned from the log and call "
         "it missing; it was never to be read"),
    Case(33, hop(SUP, cause=Cause.COMPACTED, count=0), hop(L, cause=SKIP, count=0, by=Judge.RECONCILIATION), None,
         "SUPERSEDED stays: the later record of its key may itself be gone by now"),
    Case(34, hop(L, cause=SKIP, count=0), hop(AB, count=0, by=Judge.RECONCILIATION), (AB, None, 0, False),
         "a provisional LOST (the log could not be asked then) that all the evidence shows aborted is not a loss: "
         "ABORTED, not RETRACTED"),
    Case(35, hop(CL, cause=SKIP, count=0, by=Judge.RECONCILIATION), hop(SUP, cause=Cause.COMPACTED, count=0,
         by=Judge.RECONCILIATION), (SUP, Cause.COMPACTED, 0, False),
         "a confirmed loss a backfill shows was compacted away behind a later record of its key: SUPERSEDED"),
    Case(36, hop(AB, count=0), hop(D, seen=FRESH), (AB, None, 0, True),
         "a late receipt (a fresh state) does not undo ABORTED; it is kept for reconciliation, which keeps it"),
    Case(37, hop(P, count=0), hop(AB, count=0, by=Judge.RECONCILIATION), (AB, None, 0, False),
         "a PENDING hop (its transaction still open at the maximum wait) that all the evidence shows aborted"),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=[f"case{c.number}" for c in CASES])
def test_settle_rule_table(case: Case) -> None:
    change = settle(case.stored, case.judged)
    if case.expected is None:
        assert change is None, case.reason
        return
    assert change is not None, case.reason
    got = change.verdict
    assert (got.kind, got.cause, got.count, got.late_evidence) == case.expected, case.reason
    assert change.reason


def test_a_retracted_loss_says_what_it_was_when_and_which_trace_retracted_it() -> None:
    stored = hop(L, cause=SKIP, count=0)
    change = settle(stored, hop(D, by=Judge.RECONCILIATION))
    assert change is not None
    verdict = change.verdict
    assert verdict.evidence_kind is D and verdict.decided_by == "reconciliation"
    assert verdict.detail.startswith("LOST at 1970-01-01 00:00:40 UTC retracted: RECEIVED trace at ")
    assert "offset 7" in verdict.detail and "retracted" in change.reason


def test_a_confirmed_loss_keeps_its_cause_and_says_the_horizon_passed() -> None:
    judged = dataclasses.replace(hop(L, cause=SKIP, count=0, by=Judge.RECONCILIATION), detail="group s1 skipped it")
    change = settle(hop(L, cause=SKIP, count=0), judged)
    assert change is not None
    assert change.verdict.cause is SKIP and change.verdict.evidence_kind is L
    assert change.verdict.detail == "still missing past the reconciliation horizon: group s1 skipped it"


def test_a_changed_verdict_keeps_the_minute_it_was_first_decided_in() -> None:
    stored = hop(L, cause=SKIP, count=0)
    change = settle(stored, dataclasses.replace(hop(D, by=Judge.RECONCILIATION), decided_ms=9_000_000))
    assert change is not None and change.verdict.decided_ms == stored.decided_ms  # metrics stay in their minute


def input_read(*, seen: int = FIRST, offset: int = 3, location: str = "proc") -> Verdict:
    """A processor's read of its input record (hop ``local/in -> proc-group`` for the processor ``proc``)."""
    group = f"{location}-group"
    return dataclasses.replace(
        hop(D, seen=seen, offset=offset), hop=f"local/in -> {group}", topic="in", group=group, location=location
    )


@pytest.mark.parametrize(
    ("late_input", "cause"),
    [
        (input_read(seen=FRESH), Cause.REWIND_REPLAY),  # the same input record read again: the processor replayed it
        (input_read(seen=FRESH, offset=4), Cause.PRODUCER_RETRY),  # another input record of the id: not a replay
        (input_read(seen=FRESH, location="other"), Cause.PRODUCER_RETRY),  # another processor's read says nothing
        (None, Cause.REWIND_REPLAY),  # the replayed read was settled in an earlier batch, from the same late state
        (input_read(seen=3 * FRESH), Cause.PRODUCER_RETRY),  # a replay seen by another late state than the write's
    ],
    ids=["replayed", "other-input-offset", "other-processor", "replayed-in-an-earlier-batch", "another-late-state"],
)
def test_a_late_write_at_another_offset_takes_its_cause_from_what_its_processor_read_in_the_same_late_state(
    late_input: Verdict | None, cause: Cause
) -> None:
    replayed_before = dataclasses.replace(
        input_read(), kind=DUP, cause=Cause.REWIND_REPLAY, count=2, first_seen_ms=FRESH
    )
    stored = {
        "proc -> local/out": hop(D, hop_kind="write"),
        "local/in -> proc-group": input_read() if late_input is not None else replayed_before,
        "local/in -> other-group": input_read(location="other"),
        "local/out -> s1": hop(D),
    }
    late = [hop(D, hop_kind="write", offset=9, seen=FRESH), hop(D, offset=9, seen=FRESH)]
    late = late if late_input is None else [*late, late_input]  # the write before its input read: order is no matter
    feeders = {("orders", "proc -> local/out"): ("local/in -> proc-group",)}  # the route: proc reads local/in
    changes = settle_batch(late, {"m1": stored}, feeders)
    by_hop = {change.verdict.hop: change.verdict for change in changes if change is not None}
    written = by_hop["proc -> local/out"]
    assert (written.kind, written.cause, written.count, written.late_evidence) == (DUP, cause, 2, True)
    read = by_hop["local/out -> s1"]  # the sink read both copies: the id at two offsets
    assert (read.kind, read.cause, read.count) == (DUP, Cause.PRODUCER_RETRY, 2)
    assert "after it was decided at offset 7" in read.detail


# proc's write hop as stored, a late write of it in the batch, the late read's cause
# fmt: off
COPIES = [
    (hop(DUP, hop_kind="write", cause=Cause.PRODUCER_RETRY, count=2), None, Cause.REWIND_REPLAY),
    (hop(DUP, hop_kind="write", cause=Cause.PRODUCER_RETRY, count=2), hop(D, hop_kind="write", offset=11, seen=FRESH),
     Cause.PRODUCER_RETRY),
    (None, None, Cause.PRODUCER_RETRY),
]
# fmt: on


@pytest.mark.parametrize(
    ("written", "late_write", "cause"),
    COPIES,
    ids=["both-copies-read-already", "a-third-copy-written-late", "writer-not-known"],
)
def test_a_late_read_at_another_offset_is_a_re_read_when_the_group_already_read_every_copy_written(
    written: Verdict | None, late_write: Verdict | None, cause: Cause
) -> None:
    """proc wrote the id twice (out@7, out@9: a retry) and s1 read both (stored: DUPLICATE producer_retry, at 7); after
    a broker freeze s1 reads out@9 again, alone in a fresh state (DELIVERED at 9). Its stored verdict names one offset,
    but the writer's says how many copies there are: s1 had read all of them, so this read is a re-read (the case
    the demo's ledger called rewind_replay, the detector producer_retry). A copy written late in the same batch, or
    a writer not known, leaves it a retry."""
    stored = {"local/out -> s1": hop(DUP, cause=Cause.PRODUCER_RETRY, count=2)}
    if written is not None:
        stored["proc -> local/out"] = written
    late = [hop(D, offset=9 if late_write is None else 11, seen=FRESH), *([late_write] if late_write else [])]
    changes = settle_batch(late, {"m1": stored})
    read = next(c.verdict for c in changes if c is not None and c.verdict.hop == "local/out -> s1")
    assert (read.kind, read.cause, read.count, read.late_evidence) == (DUP, cause, 3, True)


def test_a_hop_judged_twice_in_one_batch_settles_the_second_against_the_first() -> None:
    changes = settle_batch([hop(D, seen=FRESH), hop(D, seen=FRESH)], {"m1": {"local/out -> s1": hop(D)}})
    assert changes[0] is not None and changes[0].verdict.count == 2
    assert changes[1] is None  # the same late state again (its replay): not counted twice
