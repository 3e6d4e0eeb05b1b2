"""Snapshot values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

GROUP_STATES_WITHOUT_MEMBERS = frozenset({"EMPTY", "DEAD"})


class PartitionKey(NamedTuple):
    cluster: str
    group: str
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.cluster}/{self.topic}[{self.partition}] <- {self.group}"


@dataclass(frozen=True, slots=True)
class PartitionSnapshot:
    """One group's position on one partition at ``snapshot_ms``.

    ``committed`` is ``None`` when the group has no commit for the partition; ``group_state`` is
    the group's state then as the broker reports it (``STABLE``, ``EMPTY``, ...; ``None``: not
    known); ``members`` how many members the group had and ``assigned`` whether one of them was
    assigned this partition (``None``: not known); ``committed_changed`` whether the committed
    offset differs from this group's previous snapshot of the partition (the store sets it on
    write); ``retention_ms`` / ``retention_bytes`` the topic's retention as the broker reports it
    (``None``: not reported; -1: unlimited).
    """

    snapshot_ms: int
    cluster: str
    group: str
    topic: str
    partition: int
    committed: int | None
    log_start: int | None
    log_end: int | None
    group_state: str | None = None
    retention_ms: int | None = None
    committed_changed: bool = False
    members: int | None = None
    assigned: bool | None = None
    retention_bytes: int | None = None

    @property
    def key(self) -> PartitionKey:
        return PartitionKey(self.cluster, self.group, self.topic, self.partition)

    @property
    def lag(self) -> int | None:
        """Records between the committed offset and the log end (``None`` when either is unknown)."""
        if self.committed is None or self.log_end is None:
            return None
        return max(0, self.log_end - self.committed)

    @property
    def live(self) -> bool:
        """Stands for a live consumer's commit: a member of the group was assigned the partition, or
        the committed offset moved since the last snapshot (a consumer committing without joining the
        group, as Flink and Spark do). Where the broker did not report assignments, a group whose
        state is not EMPTY or DEAD counts as live."""
        if self.committed is None:
            return False
        if self.committed_changed:
            return True
        if self.assigned is not None:
            return self.assigned
        return self.group_state not in GROUP_STATES_WITHOUT_MEMBERS


@dataclass(frozen=True, slots=True)
class SnapshotRun:
    """One snapshot of one cluster: when, how much, how long, and what failed."""

    snapshot_ms: int
    cluster: str
    groups: int
    partitions: int
    duration_ms: int
    errors: tuple[str, ...] = ()
