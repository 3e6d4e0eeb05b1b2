"""What to resend for one confirmed loss, from where, to where: the first step of closing the loop (issue 10).

Pure: the loss, the message's other verdicts, the stream's route and what the log still holds (a
``log_start`` lookup) come in as arguments. The rules, in order:

- Only a CONFIRMED_LOST verdict is resent; once ``resend.max_attempts`` copies were produced without
  arriving, the loss is UNRECOVERABLE (an attempt that produced nothing, e.g. a failing hook, does not count).
- **The original** comes from the first place that still holds it: the record at its known position
  in the lost hop's topic (a read-hop loss: the group skipped a record that is still in the log), or
  upstream of it (a write-hop loss in a processor: the processor's input record, at the position its
  read hop's verdict names), while retention keeps it; otherwise the stream's recovery hook, when it
  names one; otherwise the loss is UNRECOVERABLE, with the reason.
- **The destination** depends on the hop: a write-hop loss is produced again to that hop's topic, for
  every reader downstream; a read-hop loss goes back to the topic the group skipped, with a resend
  header naming that group, so that the groups that did receive it are not given it twice.
- Each attempt has a stable resend id (the same message, hop and attempt always give the same id): a
  retried or restarted task finds its own earlier attempt by it, in the ledger and in the topic.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from khipu.registry.model import HopKind, Stream, TopicRef
from khipu.verdicts.model import VerdictKind


class SourceKind(StrEnum):
    TOPIC = "topic"  # a record still in the log
    HOOK = "hook"  # the stream's recovery hook
    NONE = "none"  # nowhere: UNRECOVERABLE


class NotConfirmedLost(ValueError):
    """Only a confirmed loss is resent."""

    def __init__(self, message_id: str, hop: str, verdict: str) -> None:
        super().__init__(f"message {message_id!r} at {hop} is {verdict}, not CONFIRMED_LOST: nothing to resend")


@dataclass(frozen=True, slots=True)
class Position:
    cluster: str
    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.cluster}/{self.topic}[{self.partition}]@{self.offset}"


@dataclass(frozen=True, slots=True)
class ResendPlan:
    message_id: str
    stream: str
    hop: str
    attempt: int
    resend_id: str
    source: SourceKind
    source_position: Position | None  # SourceKind.TOPIC: the record to copy
    destination: TopicRef | None  # None: UNRECOVERABLE
    target_group: str | None  # a read-hop resend: only this group takes it; None: every reader
    reason: str  # why this source and destination, or why UNRECOVERABLE

    @property
    def recoverable(self) -> bool:
        return self.source is not SourceKind.NONE


LogStart = Callable[[str, str, int], int | None]  # (cluster, topic, partition) -> first offset still held


def resend_id(message_id: str, hop: str, attempt: int) -> str:
    """Stable per (message, hop, attempt): the key that makes a retried attempt find itself."""
    digest = hashlib.blake2b(f"{message_id}|{hop}|{attempt}".encode(), digest_size=12).hexdigest()
    return f"r{attempt}-{digest}"


def plan_resend(
    loss: Mapping[str, Any],
    message_verdicts: Sequence[Mapping[str, Any]],
    stream: Stream,
    log_start: LogStart,
    attempt: int,
    hook: str | None = None,
    produced_before: int | None = None,
) -> ResendPlan:
    """The plan for one attempt at resending a confirmed loss (see the module's rules); ``produced_before``: how
    many earlier attempts produced a copy (default: every earlier attempt)."""
    message_id, hop_id = str(loss["message_id"]), str(loss["hop"])
    if loss["verdict"] != VerdictKind.CONFIRMED_LOST.value:
        raise NotConfirmedLost(message_id, hop_id, str(loss["verdict"]))
    nowhere = ResendPlan(
        message_id=message_id,
        stream=stream.name,
        hop=hop_id,
        attempt=attempt,
        resend_id=resend_id(message_id, hop_id, attempt),
        source=SourceKind.NONE,
        source_position=None,
        destination=None,
        target_group=None,
        reason="",
    )
    hop = next((h for h in stream.route.hops if h.id == hop_id), None)
    if hop is None:
        return replace(nowhere, reason=f"UNRECOVERABLE: hop {hop_id} is not on {stream.name}'s route any more")
    made = attempt - 1 if produced_before is None else produced_before
    if made >= stream.resend.max_attempts:
        reason = f"{made} copies produced without arriving, max_attempts is {stream.resend.max_attempts}"
        return replace(nowhere, reason=f"UNRECOVERABLE: {reason}")
    if hop.kind is HopKind.READ:
        where, target = _position(loss, hop.topic.cluster), hop.group
        looked = f"the skipped record {where}" if where else "the skipped record (its position is not known)"
    else:
        where, target = _input_position(hop.location, message_verdicts, stream), None
        looked = f"the processor's input record {where}" if where else "no upstream record (a source's write)"
    plan = replace(nowhere, destination=hop.topic, target_group=target)
    if where is not None:
        first = log_start(where.cluster, where.topic, where.partition)
        if first is not None and first <= where.offset:
            to = f"{hop.topic} for {target} only" if target else f"{hop.topic} for every reader"
            return replace(plan, source=SourceKind.TOPIC, source_position=where, reason=f"{looked} -> {to}")
        looked += " has left the log" + (f" (it starts at {first})" if first is not None else "")
    if hook is not None:
        return replace(plan, source=SourceKind.HOOK, reason=f"{looked}; recovery hook {hook}")
    return replace(nowhere, reason=f"UNRECOVERABLE: {looked}, and {stream.name} names no recovery hook")


def _position(row: Mapping[str, Any], cluster: str) -> Position | None:
    if row.get("partition") is None or row.get("offset") is None:
        return None
    return Position(cluster, str(row["topic"]), int(row["partition"]), int(row["offset"]))


def _input_position(location: str | None, verdicts: Sequence[Mapping[str, Any]], stream: Stream) -> Position | None:
    """Where the processor at ``location`` read the message: its read hop's verdict names the position."""
    reader = next((c for c in stream.route.consumers if c.location == location), None)
    if reader is None:
        return None
    reads = {f"{topic} -> {reader.group}": topic for topic in reader.reads}
    for row in verdicts:
        topic = reads.get(str(row["hop"]))
        if topic is not None and row["verdict"] in (VerdictKind.DELIVERED.value, VerdictKind.DUPLICATE.value):
            return _position(row, topic.cluster)
    return None
