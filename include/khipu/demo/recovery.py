"""Did the resend recover what the demo lost? The ground truth, the stored verdicts and the topics, compared.

For every loss the demo injected (a group skipped the message, or the processor dropped it) that the
truth says never happened and that Khipu could see:

- its verdict at that hop is RESENT;
- the resent record reached exactly the groups that missed it, once each: the skipping group for a
  skip; every group reading the processor's output for a drop (the ledger's receipts of resent
  records, which the demo records with their resend id);
- the topics hold exactly one resent record for it (``copies``: resent records per message id, read from
  the topics by their resend header).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from khipu.demo.ledger import GroundTruth
from khipu.demo.score import LOSS_CAUSES, observable_messages
from khipu.registry.model import HopKind, Stream

Loss = tuple[str, str]  # (message id, hop)


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    losses: int  # injected losses Khipu could see
    resent: int  # of them, RESENT
    not_resent: dict[Loss, str] = field(default_factory=dict)  # -> the verdict stored instead
    # -> (the groups that missed it, the groups a resent record reached: group -> receipts)
    wrong_receivers: dict[Loss, tuple[list[str], dict[str, int]]] = field(default_factory=dict)
    wrong_copies: dict[str, int] = field(default_factory=dict)  # message id -> resent records in the topics (≠ 1)

    @property
    def exact(self) -> bool:
        return self.resent == self.losses and not self.not_resent and not self.wrong_receivers and not self.wrong_copies

    def lines(self) -> list[str]:
        lines = [
            f"{self.losses} injected losses Khipu saw; {self.resent} RESENT, {len(self.wrong_receivers)} delivered to "
            f"the wrong groups, {len(self.wrong_copies)} with other than one resent record in the topics"
        ]
        lines += [f"  not resent: {m} at {hop}: {verdict}" for (m, hop), verdict in sorted(self.not_resent.items())]
        for (m, hop), (missed, got) in sorted(self.wrong_receivers.items()):
            lines.append(f"  {m} lost at {hop}: missed by {', '.join(missed)}, resent record received by {got}")
        lines += [f"  {m}: {n} resent records in the topics" for m, n in sorted(self.wrong_copies.items())]
        return lines


def missed_by(stream: Stream, hop_id: str) -> list[str]:
    """The groups that missed a message lost at ``hop_id``: the group of a read hop; every reader of a write
    hop's topic."""
    hop = next(h for h in stream.route.hops if h.id == hop_id)
    if hop.kind is HopKind.READ:
        return [str(hop.group)]
    return sorted(c.group for c in stream.route.readers_of(hop.topic))


def recovery_report(
    truth: GroundTruth, verdicts: Iterable[Mapping[str, Any]], stream: Stream, copies: Mapping[str, int]
) -> RecoveryReport:
    observable = observable_messages(truth)
    losses = sorted(
        (row.message_id, row.hop)
        for row in truth.rows()
        if row.message_id in observable and row.count == 0 and any(f in LOSS_CAUSES for f in row.faults)
    )
    stored = {(str(v["message_id"]), str(v["hop"])): str(v["verdict"]) for v in verdicts}
    receipts: dict[str, dict[str, int]] = {}
    for (message_id, hop_id), n in truth.resent_receipts.items():
        group = hop_id.rsplit(" -> ", 1)[1]
        receipts.setdefault(message_id, {})[group] = receipts.get(message_id, {}).get(group, 0) + n
    not_resent = {loss: stored.get(loss, "no verdict") for loss in losses if stored.get(loss) != "RESENT"}
    wrong_receivers = {}
    for message_id, hop_id in losses:
        missed, got = missed_by(stream, hop_id), receipts.get(message_id, {})
        if got != dict.fromkeys(missed, 1):
            wrong_receivers[(message_id, hop_id)] = (missed, got)
    lost_ids = {message_id for message_id, _ in losses}
    wrong_copies = {m: copies.get(m, 0) for m in sorted(lost_ids | set(copies)) if copies.get(m, 0) != 1}
    return RecoveryReport(len(losses), len(losses) - len(not_resent), not_resent, wrong_receivers, wrong_copies)
