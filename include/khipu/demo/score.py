"""Scoring a detector against the demo's ground truth: the verdict each (message, hop) should get.

The expected verdict is what the evidence that really reached the trace topic allows:

- the hop never happened (count 0): LOST, caused by the injected fault there
  (consumer_skip -> skipped by consumer; processor_drop / rebalance_drop -> dropped in processor);
- it happened but none of its traces arrived: TRACE_LOST;
- it happened once (or several times with only one trace arriving): DELIVERED;
- two or more traces arrived: DUPLICATE, rewind/replay when two of them name one offset (it was
  re-read there: offset_rewind), producer retry otherwise (the id sits at several offsets; so too
  when a rewound group's lost traces leave one per offset). A processor's write is rewind/replay when
  its input read shows one offset read twice (it read the record again, after a real rebalance, and
  wrote it again: the detector's ``processor_reread_input``).

Hops the message never reached (downstream of a loss) have no row, and expect no verdict; once Khipu
resent it, a hop only the resent record reached once expects DELIVERED. A RESENT or UNRECOVERABLE loss
says LOST, with its cause, as the CONFIRMED_LOST before it did (how it was recovered is scored by
:mod:`khipu.demo.recovery`).

A processor's output the message was written on but on which none of its traces arrived (the processor's
SENT trace lost, and every reading group's RECEIVED trace lost, or never made because the group skipped
it) is *unseen*: from the trace topic, the processor got the message, committed past it and wrote nothing
on — exactly what a drop shows, and nothing downstream of the demo's sinks can tell otherwise. Its write
hop expects LOST, dropped in the processor; its readers expect no verdict (the streaming detector never
sees the message there: reconciliation's to find, by a reader's back-pointer and the record's header, as
below). :func:`unseen_outputs` names such topics.

A sampled message none of whose traces reached the topic (every one lost, e.g. its SENT and
RECEIVED traces both lost and then the processor dropped it) is invisible to the streaming
detector: nothing carries its id. It expects no verdict here; it is reconciliation's to find
(a back-pointer at its position says a record there was received, and the record's header names
it): if it does, the hops it passed are TRACE_LOST. :attr:`Score.untraced` lists such messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from khipu.demo.ledger import GroundTruth, HopTruth, MessageTruth
from khipu.registry.model import HopKind

LOSS_CAUSES = {
    "consumer_skip": "skipped_by_consumer",
    "processor_drop": "dropped_in_processor",
    "rebalance_drop": "dropped_in_processor",
}

Expected = tuple[str, str | None]  # (verdict, cause)


def expected_verdict(row: HopTruth, input_reread: bool = False) -> Expected:
    if row.count == 0:
        cause = next((LOSS_CAUSES[f] for f in sorted(row.faults) if f in LOSS_CAUSES), None)
        return "LOST", cause
    if row.traces == 0:
        return "TRACE_LOST", None
    if row.traces == 1:
        return "DELIVERED", None
    # the cause the traces that arrived show: one offset read again, or the id read at several offsets (a rewound
    # group whose lost traces leave one per offset shows what a producer retry does)
    reread = row.reread_traced if row.reread_traced is not None else "offset_rewind" in row.faults
    return "DUPLICATE", "rewind_replay" if reread or input_reread else "producer_retry"


def input_reread(message: MessageTruth, row: HopTruth) -> bool:
    """A processor's write whose input read shows one offset read twice (traces that arrived)."""
    if row.kind is not HopKind.WRITE or row.source:
        return False
    writer = row.hop.partition(" -> ")[0]
    return any(
        r.kind is HopKind.READ and r.hop.endswith(f" -> {writer}") and bool(r.reread_traced)
        for r in message.hops.values()
    )


def hop_topic(row: HopTruth) -> str:
    """The topic of a hop, from its id: ``location -> cluster/topic`` (write), ``cluster/topic -> group`` (read)."""
    before, _, after = row.hop.partition(" -> ")
    return after if row.kind is HopKind.WRITE else before


def unseen_outputs(message: MessageTruth) -> frozenset[str]:
    """Topics a processor wrote the message on (any write but the source's) where none of its traces arrived:
    neither the processor's SENT nor any reader's RECEIVED. The demo's processor writes for sinks only, so no
    later hop implies the message was there."""
    written = {hop_topic(r) for r in message.hops.values() if r.kind is HopKind.WRITE and not r.source and r.count}
    traced = {hop_topic(r) for r in message.hops.values() if r.traces}
    return frozenset(written - traced)


def untraced_messages(truth: GroundTruth) -> frozenset[str]:
    """Sampled messages none of whose traces reached the trace topic."""
    return frozenset(
        m.message_id for m in truth.messages.values() if m.sampled and not any(h.traces for h in m.hops.values())
    )


def observable_messages(truth: GroundTruth) -> frozenset[str]:
    """Sampled messages at least one trace of which reached the trace topic: each should get verdicts."""
    return frozenset(m.message_id for m in truth.messages.values() if m.sampled) - untraced_messages(truth)


def expected_verdicts(truth: GroundTruth) -> dict[tuple[str, str], Expected]:
    observable = observable_messages(truth)
    expected: dict[tuple[str, str], Expected] = {}
    for message_id in observable:
        message = truth.messages[message_id]
        unseen = unseen_outputs(message)
        for row in message.hops.values():
            if hop_topic(row) not in unseen:
                expected[(message_id, row.hop)] = expected_verdict(row, input_reread(message, row))
            elif row.kind is HopKind.WRITE:  # got it, committed past it, nothing on its output: what a drop shows
                expected[(message_id, row.hop)] = ("LOST", LOSS_CAUSES["processor_drop"])
    for (message_id, hop), receipts in truth.resent_receipts.items():
        if message_id in observable and (message_id, hop) not in expected:  # reached only by the resent record
            expected[(message_id, hop)] = ("DELIVERED", None) if receipts == 1 else ("DUPLICATE", "rewind_replay")
    return expected


@dataclass(frozen=True, slots=True)
class Score:
    expected: int
    matched: int
    wrong: dict[tuple[str, str], tuple[Expected, Expected]]  # (message, hop) -> (expected, got)
    missing: dict[tuple[str, str], Expected]  # expected, no verdict
    extra: dict[tuple[str, str], Expected]  # verdict for a hop with no truth
    untraced: frozenset[str] = frozenset()  # sampled messages with no trace at all: no verdict expected

    @property
    def exact(self) -> bool:
        return not self.wrong and not self.missing and not self.extra


def said(row: Mapping[str, Any]) -> Expected:
    """What a stored verdict row says of its hop: a final verdict by what its evidence says (a CONFIRMED_LOST
    is a LOST; a RETRACTED one is what the hop really got: its ``evidence_kind``)."""
    verdict = row["verdict"]
    if verdict in ("CONFIRMED_LOST", "RESENT", "UNRECOVERABLE"):
        return "LOST", row["cause"]
    if verdict == "RETRACTED":
        return row.get("evidence_kind") or "DELIVERED", row["cause"]
    return verdict, row["cause"]


def score(truth: GroundTruth, verdicts: Iterable[Mapping[str, Any]]) -> Score:
    """Compare stored verdict rows (message_id, hop, verdict, cause[, evidence_kind]) with the ground truth."""
    expected = expected_verdicts(truth)
    got = {(v["message_id"], v["hop"]): said(v) for v in verdicts if v["message_id"] in truth.messages}
    wrong = {key: (want, got[key]) for key, want in expected.items() if key in got and got[key] != want}
    missing = {key: want for key, want in expected.items() if key not in got}
    # an untraced message needs no verdict, but reconciliation may name it (a pointer at its record):
    # then the hops it passed are TRACE_LOST
    passed = {
        (row.message_id, row.hop): ("TRACE_LOST", None)
        for row in truth.rows()
        if row.message_id in untraced_messages(truth) and row.count
    }
    wrong.update({key: (passed[key], value) for key, value in got.items() if key in passed and value != passed[key]})
    extra = {key: value for key, value in got.items() if key not in expected and key not in passed}
    return Score(
        len(expected), len(expected) - len(wrong) - len(missing), wrong, missing, extra, untraced_messages(truth)
    )
