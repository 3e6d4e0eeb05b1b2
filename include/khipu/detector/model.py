"""The detector's settings, and what its rules may ask of the world (committed offsets and their history, removals,
pointers, records' fates)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from khipu.config import DetectorSection, default, load
from khipu.errors import InvalidSetting
from khipu.verdicts.model import Cause

DETECTOR_QUERY = "khipu_detector"  # the detector's streaming query (its heartbeat's name)


class DetectorConfigError(InvalidSetting):
    kind = "detector setting"


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    # after a group's commit is seen past a message, wait this long (read on the trace topic) for its trace: the
    # traced consumer flushes its traces before it commits, so a few seconds cover an emitter's delivery
    grace_ms: int = default(DetectorSection, "grace_ms")
    max_wait_ms: int = default(DetectorSection, "max_wait_ms")  # undecided this long after the first trace: PENDING
    recheck_ms: int = default(DetectorSection, "recheck_ms")  # how often an undecided message looks at offsets again
    # a hop waiting on a transaction Kafka has not decided waits this much longer than max_wait_ms before PENDING:
    # the broker's default transaction.max.timeout.ms (raise it with the broker's, e.g. for Flink's 1 h transactions)
    open_transaction_wait_ms: int = default(DetectorSection, "open_transaction_wait_ms")

    def __post_init__(self) -> None:
        for name in ("grace_ms", "max_wait_ms", "recheck_ms", "open_transaction_wait_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise DetectorConfigError(name, value, "a duration in ms >= 0")
        if self.max_wait_ms < self.grace_ms:
            raise DetectorConfigError("max_wait_ms", self.max_wait_ms, f"at least grace_ms ({self.grace_ms})")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DetectorConfig:
        """``KHIPU_DETECTOR_GRACE_MS``, ``_MAX_WAIT_MS``, ``_RECHECK_MS``, ``_OPEN_TRANSACTION_WAIT_MS``
        (:class:`khipu.config.DetectorSection`)."""
        section = load(DetectorSection, environ, DetectorConfigError)
        return cls(section.grace_ms, section.max_wait_ms, section.recheck_ms, section.open_transaction_wait_ms)


# committed(cluster, group, topic, partition) -> the group's committed offset (next to read), or None
CommittedLookup = Callable[[str, str, str, int], int | None]

NONE = np.iinfo(np.int64).min  # no value (in arrays of offsets and times): below every offset and time


@dataclass(frozen=True)
class CommitHistory:
    """A group's committed offset on one partition as it was seen over time, oldest first: at ``seen_ms[i]`` it was
    ``committed[i]``, and the offsets never go back (a history that saw them go back, a rewind or a topic made
    again, starts over from there). So the group was past ``offset`` at the first time its committed offset was
    above it: the commit itself came at or before that time."""

    seen_ms: npt.NDArray[np.int64]
    committed: npt.NDArray[np.int64]

    @classmethod
    def of(cls, seen: Sequence[tuple[int, int]]) -> CommitHistory:
        """From (time, committed offset) pairs, oldest first, their offsets never going back."""
        times = np.asarray([t for t, _ in seen], dtype=np.int64)
        offsets = np.asarray([c for _, c in seen], dtype=np.int64)
        if len(seen) > 1 and (bool((np.diff(times) < 0).any()) or bool((np.diff(offsets) < 0).any())):
            raise ValueError(f"a commit history goes forward in time and offset, not {list(seen)}")
        return cls(times, offsets)

    def passed_since_ms(self, offset: int) -> int | None:
        """When the group was first seen past ``offset`` (its committed offset above it); None: never in this
        history."""
        at = int(np.searchsorted(self.committed, offset, side="right"))
        return int(self.seen_ms[at]) if at < len(self.seen_ms) else None

    def passed_since_all(self, offsets: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """:meth:`passed_since_ms` of each offset, :data:`NONE` where never."""
        at = np.searchsorted(self.committed, offsets, side="right")
        padded = np.append(self.seen_ms, NONE)
        return padded[np.minimum(at, len(self.seen_ms))]


# history(cluster, group, topic, partition) -> when the group's committed offsets were seen, or None: not kept
CommitHistoryLookup = Callable[[str, str, str, int], CommitHistory | None]


def no_history(cluster: str, group: str, topic: str, partition: int) -> CommitHistory | None:
    return None


@dataclass(frozen=True, slots=True)
class Removal:
    """The record at a position is no longer in its partition's log, and the group never went past it
    while it was there (it did not skip it: the log moved out from under it)."""

    log_start: int  # the partition's log-start offset, past the record
    removed_by_ms: int  # the record was first seen gone then (a snapshot, or the broker now): removed at or before
    retention_ms: int | None  # the topic's retention.ms (-1: unlimited; None: not known)
    retention_bytes: int | None = None  # the topic's retention.bytes (-1: unlimited)


def removal_cause(written_ms: int | None, removal: Removal) -> tuple[Cause, str]:
    """Expired or truncated, and why. Retention deletes a record only once it is older than ``retention.ms``
    (or its partition outgrew ``retention.bytes``); a record gone younger than that, or from a topic kept
    forever, was removed on purpose (DeleteRecords, as an operator or a tool truncating the log does)."""
    kept_ms, kept_bytes = removal.retention_ms, removal.retention_bytes
    gone = f"the log starts at {removal.log_start} now"
    if kept_bytes is not None and kept_bytes >= 0:
        return Cause.EXPIRED, f"{gone}; retention.bytes {kept_bytes} deletes the oldest records of a full partition"
    if kept_ms is None:
        return Cause.EXPIRED, f"{gone}; the topic's retention is not known, so retention may have deleted it"
    if kept_ms < 0:
        return Cause.TRUNCATED, f"{gone}; the topic keeps records forever, so it was deleted on purpose"
    if written_ms is None:
        return Cause.EXPIRED, f"{gone}; its write time is not known, retention.ms {kept_ms} may have deleted it"
    age = removal.removed_by_ms - written_ms
    if age < kept_ms:
        return (
            Cause.TRUNCATED,
            f"{gone}; it was gone {age} ms after it was written, younger than retention.ms {kept_ms}",
        )
    return Cause.EXPIRED, f"{gone}; written {age} ms before it was seen gone, past retention.ms {kept_ms}"


# removed(cluster, group, topic, partition, offset) -> the record's removal from the log before the group
# got to it, or None (still in the log, or the group went past it while it was there)
RemovalLookup = Callable[[str, str, str, int, int], Removal | None]


def nothing_removed(cluster: str, group: str, topic: str, partition: int, offset: int) -> Removal | None:
    return None


# pointed_at(location, cluster, topic, partition, offset) -> whether an emitter at that location said
# it received that record (a later trace's back-pointer, or a mark): then only its trace was lost
PointerLookup = Callable[[str, str, str, int, int], bool]


def nothing_pointed_at(location: str, cluster: str, topic: str, partition: int, offset: int) -> bool:
    return False


class RecordState(StrEnum):
    """What the log says of the record at a position, as a consumer of either isolation level would find it."""

    VISIBLE = "visible"  # in the log, and read_committed readers see it (committed, or written without a transaction)
    ABORTED = "aborted"  # in the log, written in a transaction that aborted: only read_uncommitted readers see it
    OPEN = "open"  # at or past the partition's last stable offset: its transaction is not decided yet
    COMPACTED = "compacted"  # gone from a compacted topic's log though the log starts before it: the cleaner took it
    GONE = "gone"  # below the partition's log start (retention, DeleteRecords): see Removal
    UNKNOWN = "unknown"  # not asked, or the log has no answer (the rules decide as they would without it)
    UNAVAILABLE = "unavailable"  # the cluster could not be asked (an outage): the hop waits and asks again


@dataclass(frozen=True, slots=True)
class RecordFate:
    """The record at a position, as its log tells it. ``later_of_key``: on a compacted topic, the offset of a later
    record of the same key still in the log (None: none there, or not looked for). ``detail``: how it was told."""

    state: RecordState
    later_of_key: int | None = None
    compacted_topic: bool = False  # the topic's cleanup.policy includes compact
    detail: str = ""


UNKNOWN_FATE = RecordFate(RecordState.UNKNOWN, detail="not asked")

# record_fate(cluster, topic, partition, offset, key_hash) -> the record's fate in its log (key_hash: the SENT
# trace's, to look for a later record of the same key)
RecordLookup = Callable[[str, str, int, int, str | None], RecordFate]


def nothing_asked(cluster: str, topic: str, partition: int, offset: int, key_hash: str | None) -> RecordFate:
    return UNKNOWN_FATE
