"""Exactly one copy per attempt, under retries and crashes: the steps of one resend attempt.

An attempt goes: record the intent in the ledger -> produce the record (its resend id in a header)
-> record where it landed. A task killed anywhere in between and started again must not produce a
second copy, so before producing it asks the destination topic whether a record with this resend id
is there already (a kill after producing, before recording). Two runs at once (the auto and the
manual DAG, a retry whose first try still runs) must not both produce: a run claims an open attempt
for a lease, renewed right before producing, and leaves alone an attempt another run holds.
:func:`next_step` is the decision, pure; :func:`run_attempt` walks it against a ledger, a
destination and a producer given to it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from khipu.resend.plan import ResendPlan

INTENDED, PRODUCED, UNRECOVERABLE, FAILED = "intended", "produced", "unrecoverable", "failed"

Landed = tuple[int, int]  # (partition, offset) of the resent record in its destination
Placed = tuple[int, int]  # (partition the copy goes to, that partition's end offset before it is produced)


class Step(StrEnum):
    RECORD_INTENT = "record_intent"  # nothing in the ledger yet: write the intent before anything else
    PLACE = "place"  # intended without a destination partition (planned unrecoverable, now recoverable): fix it
    PRODUCE = "produce"  # intended, and the destination holds no record with this resend id
    RECORD_LANDED = "record_landed"  # intended, and the record is already there (killed before recording it)
    RECORD_UNRECOVERABLE = "record_unrecoverable"  # intended, nothing landed, and there is nothing to resend
    DONE = "done"  # produced, unrecoverable or failed: this attempt is over


def next_step(state: str | None, recoverable: bool, landed: Landed | None, placed: bool = True) -> Step:
    """What an attempt does next, from its ledger state (None: no entry), whether the plan has an original,
    where the destination already holds its record (None: nowhere, or not searched: not placed), and whether
    the intent fixed the partition its copy goes to."""
    if state is None:
        return Step.RECORD_INTENT
    if state != INTENDED:
        return Step.DONE
    if landed is not None:
        return Step.RECORD_LANDED
    if not recoverable:
        return Step.RECORD_UNRECOVERABLE
    return Step.PRODUCE if placed else Step.PLACE


class Ledger(Protocol):
    def record_intent(self, entry: dict[str, object], at_ms: int) -> bool: ...
    def claim(self, resend_id: str, owner: str, now_ms: int, lease_ms: int) -> bool: ...
    def set_placement(self, resend_id: str, entry: dict[str, object], at_ms: int) -> None: ...
    def mark_produced(self, resend_id: str, partition: int, offset: int, at_ms: int) -> None: ...
    def mark(self, resend_id: str, state: str, at_ms: int, error: str | None = None) -> None: ...
    def entry(self, resend_id: str) -> dict[str, object] | None: ...


LEASE_MS = 90_000  # a run holds an open attempt this long (renewed before producing); a killed run's lapses


@dataclass(frozen=True, slots=True)
class AttemptOutcome:
    resend_id: str
    state: str  # the ledger's state, or BUSY: another run holds the attempt
    landed: Landed | None
    produced_now: bool  # this call produced the record (False: found it there, or nothing to produce)


BUSY = "busy"


def ledger_entry(
    plan: ResendPlan, placed: Placed | None = None, owner: str | None = None, until_ms: int | None = None
) -> dict[str, object]:
    """The ledger row of an attempt; ``placed``: where its copy will go and the offset the search for it starts at,
    fixed before producing so that a restarted task looks in the same place; ``owner`` holds it until ``until_ms``."""
    return {
        "resend_id": plan.resend_id,
        "message_id": plan.message_id,
        "hop": plan.hop,
        "stream": plan.stream,
        "attempt": plan.attempt,
        "state": INTENDED,
        "source_kind": plan.source.value,
        "source_position": None if plan.source_position is None else str(plan.source_position),
        "destination": None if plan.destination is None else str(plan.destination),
        "target_group": plan.target_group,
        "destination_partition": None if placed is None else placed[0],
        "scan_from_offset": None if placed is None else placed[1],
        "reason": plan.reason,
        "claimed_by": owner,
        "claimed_until_ms": until_ms,
    }


def _int(value: object) -> int:
    return int(str(value))


def run_attempt(
    plan: ResendPlan,
    ledger: Ledger,
    place: Callable[[ResendPlan], Placed],
    find_landed: Callable[[str, int, int], Landed | None],
    produce: Callable[[ResendPlan, int], Landed],
    now_ms: Callable[[], int],
    owner: str,
    lease_ms: int = LEASE_MS,
) -> AttemptOutcome:
    """Take one attempt to its end, whatever an earlier, killed run of it left behind, unless another run
    (``owner`` is this one) holds it: then BUSY, and nothing is touched.

    ``place(plan)``: the partition the copy goes to and its end offset now (asked once, before the copy is
    produced); ``find_landed(resend_id, partition, from_offset)``: where a record with this resend id is, at or
    after ``from_offset``; ``produce(plan, partition)``: write the copy, return where it landed. An intended
    attempt with a placement is always searched for first, whatever the plan says now."""
    produced_now = claimed = False
    for _ in range(6):  # intent, place, produce, record: each step advances; a lost race reads again
        entry = ledger.entry(plan.resend_id)
        state = None if entry is None else str(entry["state"])
        if entry is not None and state == INTENDED and not claimed:
            if not ledger.claim(plan.resend_id, owner, now_ms(), lease_ms):
                return AttemptOutcome(plan.resend_id, BUSY, None, False)
            claimed = True
        partition = None if entry is None else entry.get("destination_partition")
        landed = None
        if entry is not None and state == INTENDED and partition is not None:
            landed = find_landed(plan.resend_id, _int(partition), _int(entry["scan_from_offset"]))
        step = next_step(state, plan.recoverable, landed, partition is not None)
        if step is Step.RECORD_INTENT:
            now = now_ms()
            placed = place(plan) if plan.recoverable else None
            claimed = ledger.record_intent(ledger_entry(plan, placed, owner, now + lease_ms), now)
        elif step is Step.PLACE:
            ledger.set_placement(plan.resend_id, ledger_entry(plan, place(plan)), now_ms())
        elif step is Step.PRODUCE:
            assert partition is not None
            if not ledger.claim(plan.resend_id, owner, now_ms(), lease_ms):  # still ours, right before producing
                return AttemptOutcome(plan.resend_id, BUSY, None, False)
            where = produce(plan, _int(partition))
            produced_now = True
            ledger.mark_produced(plan.resend_id, where[0], where[1], now_ms())
        elif step is Step.RECORD_LANDED:
            assert landed is not None
            ledger.mark_produced(plan.resend_id, landed[0], landed[1], now_ms())
        elif step is Step.RECORD_UNRECOVERABLE:
            ledger.mark(plan.resend_id, UNRECOVERABLE, now_ms(), plan.reason)
        else:
            assert entry is not None
            where_landed = None
            if entry.get("produced_partition") is not None:
                where_landed = (_int(entry["produced_partition"]), _int(entry["produced_offset"]))
            return AttemptOutcome(plan.resend_id, str(entry["state"]), where_landed, produced_now)
    raise RuntimeError(f"resend attempt {plan.resend_id} did not settle")  # unreachable: each step advances
