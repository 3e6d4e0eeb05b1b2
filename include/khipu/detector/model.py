"""Verdict values and the detector's settings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from khipu.errors import InvalidSetting


class VerdictKind(StrEnum):
    DELIVERED = "DELIVERED"
    LOST = "LOST"  # provisional: reconciliation confirms or retracts it
    DUPLICATE = "DUPLICATE"
    PENDING = "PENDING"  # undecided after the maximum wait: handed to reconciliation
    TRACE_LOST = "TRACE_LOST"  # the message evidently passed the hop; its trace did not arrive


class Cause(StrEnum):
    SKIPPED_BY_CONSUMER = "skipped_by_consumer"  # the group committed past it and never received it
    DROPPED_IN_PROCESSOR = "dropped_in_processor"  # received and committed by a processor, never written on
    REWIND_REPLAY = "rewind_replay"  # the same offset read again
    PRODUCER_RETRY = "producer_retry"  # the same id written at two offsets


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


class DetectorConfigError(InvalidSetting):
    kind = "detector setting"


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    grace_ms: int = 30_000  # after a group's commit passes a message, wait this long for its trace
    max_wait_ms: int = 900_000  # undecided this long after the first trace: PENDING, state dropped
    recheck_ms: int = 5_000  # how often an undecided message looks at committed offsets again

    def __post_init__(self) -> None:
        for name in ("grace_ms", "max_wait_ms", "recheck_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise DetectorConfigError(name, value, "a duration in ms >= 0")
        if self.max_wait_ms < self.grace_ms:
            raise DetectorConfigError("max_wait_ms", self.max_wait_ms, f"at least grace_ms ({self.grace_ms})")


# committed(cluster, group, topic, partition) -> the group's committed offset (next to read), or None
CommittedLookup = Callable[[str, str, str, int], int | None]

# pointed_at(location, cluster, topic, partition, offset) -> whether an emitter at that location said
# it received that record (a later trace's back-pointer, or a mark): then only its trace was lost
PointerLookup = Callable[[str, str, str, int, int], bool]


def nothing_pointed_at(location: str, cluster: str, topic: str, partition: int, offset: int) -> bool:
    return False
