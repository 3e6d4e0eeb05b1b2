"""The verdict: what Khipu concludes about one message at one hop, its kinds and its causes.

Every judge writes these values (the streaming detector, reconciliation, the resend task) and every reader
reads them (the store's book, the metrics, the view): the model sits below all of them and imports nothing
of Khipu's.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class VerdictKind(StrEnum):
    DELIVERED = "DELIVERED"
    LOST = "LOST"  # provisional: reconciliation confirms or retracts it
    DUPLICATE = "DUPLICATE"
    PENDING = "PENDING"  # undecided after the maximum wait: handed to reconciliation
    TRACE_LOST = "TRACE_LOST"  # the message evidently passed the hop; its trace did not arrive
    CONFIRMED_LOST = "CONFIRMED_LOST"  # final: LOST, and still missing past the reconciliation horizon
    RETRACTED = "RETRACTED"  # final: a LOST that later evidence contradicts (it says what the hop really got)
    RESENT = "RESENT"  # a confirmed loss Khipu resent, and the detector saw the resent copy arrive at the hop
    UNRECOVERABLE = "UNRECOVERABLE"  # a confirmed loss with no original left, or past resend.max_attempts
    ABORTED = "ABORTED"  # final: written in a transaction that aborted; never visible to read_committed readers
    SUPERSEDED = "SUPERSEDED"  # final: compaction removed it before the group read it; a later record of its key holds


RESEND_KINDS = frozenset({VerdictKind.RESENT, VerdictKind.UNRECOVERABLE})  # the last states of a confirmed loss
KAFKA_SEMANTICS_KINDS = frozenset({VerdictKind.ABORTED, VerdictKind.SUPERSEDED})  # Kafka working as designed
FINAL_KINDS = frozenset({VerdictKind.CONFIRMED_LOST, VerdictKind.RETRACTED, *RESEND_KINDS, *KAFKA_SEMANTICS_KINDS})
LOSS_KINDS = frozenset({VerdictKind.LOST, VerdictKind.CONFIRMED_LOST})
RECEIPT_KINDS = frozenset({VerdictKind.DELIVERED, VerdictKind.DUPLICATE, VerdictKind.TRACE_LOST})


class Cause(StrEnum):
    SKIPPED_BY_CONSUMER = "skipped_by_consumer"  # the group committed past it and never received it
    DROPPED_IN_PROCESSOR = "dropped_in_processor"  # received and committed by a processor, never written on
    EXPIRED = "expired"  # retention deleted it from the log before the group read it
    TRUNCATED = "truncated"  # removed from the log (DeleteRecords) before the group read it, younger than retention
    REWIND_REPLAY = "rewind_replay"  # the same offset read again
    PRODUCER_RETRY = "producer_retry"  # the same id written at two offsets
    REPROCESSED_AFTER_ABORT = "reprocessed_after_abort"  # an exactly-once processor read it again after an abort
    COMPACTED = "compacted"  # log compaction removed it: a later record of its key supersedes it


# A duplicate of this cause is shown, but not counted against the stream: its output was written once
NOT_COUNTED_DUPLICATES = frozenset({Cause.REPROCESSED_AFTER_ABORT})


@dataclass(frozen=True, slots=True)
class Verdict:
    """What Khipu concludes about one message at one hop."""

    message_id: str
    stream: str
    hop: str
    hop_kind: str  # write | read
    kind: VerdictKind
    cause: Cause | None
    count: int  # distinct writes (write hop) or receives (read hop) seen
    topic: str
    partition: int | None
    offset: int | None
    group: str | None
    location: str | None
    observed_ms: int | None  # the hop's first trace time
    latency_ms: int | None  # from the previous hop to this one
    e2e_latency_ms: int | None  # from the source write to this hop
    decided_ms: int
    detail: str
    first_seen_ms: int | None = None  # when the judge first saw the message (a detector state, or its first trace)
    decided_by: str = "detector"  # detector | reconciliation | resend
    evidence_kind: VerdictKind | None = None  # a RETRACTED verdict: what the hop really got (DELIVERED, ...)
    late_evidence: bool = False  # traces came after it was decided: reconciliation re-decides it
