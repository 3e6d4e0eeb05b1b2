"""Exactly one copy per attempt, under retries and crashes: the steps of one resend attempt.

An attempt goes: record the intent in the ledger -> produce the record (its resend id in a header)
-> record where it landed. A task killed anywhere in between and started again must not produce a
second copy, so before producing it asks the destination topic whether a record with this resend id
is there already (a kill after producing, before recording). :func:`next_step` is that decision,
pure; :func:`run_attempt` walks it against a ledger, a destination and a producer given to it.
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
    PRODUCE = "produce"  # intended, and the destination holds no record with this resend id
    RECORD_LANDED = "record_landed"  # intended, and the record is already there (killed before recording it)
    RECORD_UNRECOVERABLE = "record_unrecoverable"  # intended, but there is nothing to resend
    DONE = "done"  # produced, unrecoverable or failed: this attempt is over


def next_step(state: str | None, recoverable: bool, landed: Landed | None) -> Step:
    """What an attempt does next, from its ledger state (None: no entry), whether the plan has an original,
    and where the destination already holds its record (None: nowhere)."""
    if state is None:
        return Step.RECORD_INTENT
    if state != INTENDED:
        return Step.DONE
    if landed is not None:
        return Step.RECORD_LANDED
    return Step.PRODUCE if recoverable else Step.RECORD_UNRECOVERABLE


class Ledger(Protocol):
    def record_intent(self, entry: dict[str, object], at_ms: int) -> bool: ...
    def mark_produced(self, resend_id: str, partition: int, offset: int, at_ms: int) -> None: ...
    def mark(self, resend_id: str, state: str, at_ms: int, error: str | None = None) -> None: ...
    def entry(self, resend_id: str) -> dict[str, object] | None: ...


@dataclass(frozen=True, slots=True)
class AttemptOutcome:
    resend_id: str
    state: str
    landed: Landed | None
    produced_now: bool  # this call produced the record (False: found it there, or nothing to produce)


def ledger_entry(plan: ResendPlan, placed: Placed | None = None) -> dict[str, object]:
    """The ledger row of an attempt; ``placed``: where its copy will go and the offset the search for it starts at,
    fixed before producing so that a restarted task looks in the same place."""
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
    }


def run_attempt(
    plan: ResendPlan,
    ledger: Ledger,
    place: Callable[[ResendPlan], Placed],
    find_landed: Callable[[str, int, int], Landed | None],
    produce: Callable[[ResendPlan, int], Landed],
    now_ms: Callable[[], int],
) -> AttemptOutcome:
    """Take one attempt to its end, whatever an earlier, killed run of it left behind.

    ``place(plan)``: the partition the copy goes to and its end offset now (asked once, when the intent is
    written); ``find_landed(resend_id, partition, from_offset)``: where a record with this resend id is, at or
    after ``from_offset``; ``produce(plan, partition)``: write the copy, return where it landed."""
    produced_now = False
    for _ in range(4):  # intent, produce, record: at most three steps, and a DONE
        entry = ledger.entry(plan.resend_id)
        state = None if entry is None else str(entry["state"])
        landed = None
        if entry is not None and state == INTENDED and plan.recoverable:
            partition, scan_from = int(str(entry["destination_partition"])), int(str(entry["scan_from_offset"]))
            landed = find_landed(plan.resend_id, partition, scan_from)
        step = next_step(state, plan.recoverable, landed)
        if step is Step.RECORD_INTENT:
            ledger.record_intent(ledger_entry(plan, place(plan) if plan.recoverable else None), now_ms())
        elif step is Step.PRODUCE:
            assert entry is not None
            partition, offset = produce(plan, int(str(entry["destination_partition"])))
            produced_now = True
            ledger.mark_produced(plan.resend_id, partition, offset, now_ms())
        elif step is Step.RECORD_LANDED:
            assert landed is not None
            ledger.mark_produced(plan.resend_id, landed[0], landed[1], now_ms())
        elif step is Step.RECORD_UNRECOVERABLE:
            ledger.mark(plan.resend_id, UNRECOVERABLE, now_ms(), plan.reason)
        else:
            assert entry is not None
            where = None
            if entry.get("produced_partition") is not None:
                where = (int(str(entry["produced_partition"])), int(str(entry["produced_offset"])))
            return AttemptOutcome(plan.resend_id, str(entry["state"]), where, produced_now)
    raise RuntimeError(f"resend attempt {plan.resend_id} did not settle")  # unreachable: each step advances
