"""Offset windows: ranges of a partition whose records a group skipped, re-read, or lost to retention.

Found by comparing two consecutive snapshots of one group and partition. Stored for the detector
and reconciliation, which attribute losses and duplicates to them.

- REWIND   the committed offset moved backwards: records in [new, old) will be read again.
- SKIP     the committed offset jumped forward far more than the group ever advances in one
           interval (more than ``skip_factor`` times its median advance, and at least
           ``skip_min_records``): records in [old, new) were probably never processed. A
           potential loss window; traces decide.
- EXPIRED  the log start moved past the committed offset: records in [committed, log start)
           aged out of retention before the group read them.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from khipu.offsets.model import PartitionKey, PartitionSnapshot


class WindowKind(StrEnum):
    SKIP = "skip"
    REWIND = "rewind"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class OffsetWindow:
    key: PartitionKey
    kind: WindowKind
    from_offset: int  # first offset of the window
    to_offset: int  # first offset after it
    detected_ms: int
    previous_committed: int | None
    committed: int | None

    @property
    def records(self) -> int:
        return self.to_offset - self.from_offset


def typical_advance(history: Sequence[PartitionSnapshot]) -> float | None:
    """Median forward move of the committed offset between consecutive snapshots (``None``: never moved)."""
    committed = [s.committed for s in history if s.committed is not None]
    moves = [later - earlier for earlier, later in itertools.pairwise(committed) if later > earlier]
    return statistics.median(moves) if moves else None


def detect_windows(
    previous: PartitionSnapshot,
    current: PartitionSnapshot,
    usual_advance: float | None,
    *,
    skip_factor: float,
    skip_min_records: int,
) -> list[OffsetWindow]:
    """Windows that opened between ``previous`` and ``current`` (same group and partition)."""
    windows: list[OffsetWindow] = []
    before, after = previous.committed, current.committed
    if before is not None and after is not None:
        if after < before:
            windows.append(
                OffsetWindow(current.key, WindowKind.REWIND, after, before, current.snapshot_ms, before, after)
            )
        elif after - before >= max(skip_min_records, skip_factor * (usual_advance or 0)) and after > before:
            windows.append(
                OffsetWindow(current.key, WindowKind.SKIP, before, after, current.snapshot_ms, before, after)
            )
    if after is not None and current.log_start is not None and current.log_start > after:
        already = (
            previous.committed is not None
            and previous.log_start is not None
            and previous.log_start > previous.committed
        )
        if not already:
            windows.append(
                OffsetWindow(
                    current.key, WindowKind.EXPIRED, after, current.log_start, current.snapshot_ms, before, after
                )
            )
    return windows
