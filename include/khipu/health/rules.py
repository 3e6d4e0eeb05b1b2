"""Partition status from a window of committed-offset observations: Burrow's evaluation rules.

Burrow sees every offset commit. Khipu sees offset-watermark snapshots (one a minute), so a
window entry is a snapshot taken while the group had live members (its state was not EMPTY or
DEAD): a live consumer commits, a group without members does not. With that one mapping,
Burrow's documented rules apply as written
(https://github.com/linkedin/Burrow/wiki/Consumer-Lag-Evaluation-Rules):

- STOP    the time since the most recent entry is longer than the window spans (no commits),
          unless the newest committed offset reached one of the recent log-end offsets (the
          consumer was caught up minutes ago: Burrow's delay before calling it stopped);
- REWIND  the committed offset went backwards somewhere in the window;
- STALL   the committed offset did not move across the window while lag stayed above zero;
- WARN    the lag never decreased from one known value to the next, and the committed offset has
          not reached any of the recent log-end offsets (Khipu's addition: with minute snapshots
          a keeping-up consumer shows a small constant lag, which Burrow alone would call WARN);
- OK      otherwise; always when the current lag is zero; and the last three rules are skipped
          when the lag was zero anywhere in the window (Burrow's exceptions).

Two additions, both off Burrow's path when set to zero: ``min_window`` entries are needed before
movement is judged, and STOP needs at least ``min_stop_ms`` of silence (a one-entry window spans
zero time, and Burrow would call it stopped at once).

Each rule is a small named function; every rule that fires is reported, and the most severe
status wins (:class:`PartitionStatus` is ordered by severity).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum


class PartitionStatus(IntEnum):
    """Ordered by severity: a higher value is worse."""

    OK = 0
    WARN = 1  # falling behind
    REWIND = 2  # went back: duplicates
    STALL = 3  # alive, not moving, data waiting
    STOP = 4  # not committing at all
    EXPIRY_RISK = 5  # unconsumed data will age out of retention before the group reaches it

    @property
    def label(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class OffsetObservation:
    """One window entry: the committed offset seen at ``timestamp_ms`` and the lag then (``None``: unknown)."""

    offset: int
    timestamp_ms: int
    lag: int | None


@dataclass(frozen=True, slots=True)
class Evaluation:
    status: PartitionStatus
    fired: tuple[PartitionStatus, ...]  # every rule that fired, most severe first
    reason: str


def consumer_stopped(window: Sequence[OffsetObservation], now_ms: int, min_stop_ms: int) -> bool:
    """Time since the newest entry exceeds the window's span (and at least ``min_stop_ms``)."""
    newest, oldest = window[-1].timestamp_ms, window[0].timestamp_ms
    return now_ms - newest > max(newest - oldest, min_stop_ms)


def lag_zero_in_window(window: Sequence[OffsetObservation]) -> bool:
    return any(entry.lag == 0 for entry in window)


def reached_recent_log_end(window: Sequence[OffsetObservation], recent_log_ends: Sequence[int]) -> bool:
    """The newest committed offset is at or past one of the recent log-end offsets (newest first)."""
    newest = window[-1].offset
    return any(log_end <= newest for log_end in recent_log_ends)


def offsets_rewound(window: Sequence[OffsetObservation]) -> bool:
    return any(later.offset < earlier.offset for earlier, later in itertools.pairwise(window))


def offsets_stalled(window: Sequence[OffsetObservation]) -> bool:
    return len(window) > 1 and all(entry.offset == window[0].offset for entry in window)


def lag_not_decreasing(window: Sequence[OffsetObservation]) -> bool:
    """No known lag is below the known lag before it (unknown lags skipped; needs two known lags)."""
    known = [entry.lag for entry in window if entry.lag is not None]
    return len(known) > 1 and all(later >= earlier for earlier, later in itertools.pairwise(known))


_MOVEMENT_RULES = (
    (offsets_rewound, PartitionStatus.REWIND, "committed offset went backwards"),
    (offsets_stalled, PartitionStatus.STALL, "committed offset did not move while lag stayed above zero"),
    (lag_not_decreasing, PartitionStatus.WARN, "lag did not decrease in any interval"),
)


def evaluate_partition(
    window: Sequence[OffsetObservation],
    recent_log_ends: Sequence[int],
    current_lag: int,
    now_ms: int,
    *,
    min_window: int = 2,
    min_stop_ms: int = 0,
) -> Evaluation:
    """The status of one partition of one group.

    ``window`` oldest first; ``recent_log_ends`` newest first; ``current_lag`` from the newest
    snapshot (log end minus committed). A window shorter than ``min_window`` entries can only
    say STOP or OK (not enough history to judge movement).
    """
    if current_lag <= 0:
        return Evaluation(PartitionStatus.OK, (), "current lag is zero")
    if not window:
        return Evaluation(PartitionStatus.OK, (), "no observations while the group was live")
    fired: list[PartitionStatus] = []
    reasons: list[str] = []
    if consumer_stopped(window, now_ms, min_stop_ms):
        if reached_recent_log_end(window, recent_log_ends):
            reasons.append("no recent commit, but the committed offset reached a recent log end: not stopped yet")
        else:
            fired.append(PartitionStatus.STOP)
            reasons.append(f"no commit for {now_ms - window[-1].timestamp_ms} ms, longer than the window spans")
    if lag_zero_in_window(window):
        reasons.append("lag was zero within the window")
    elif len(window) >= min_window:
        keeping_up = reached_recent_log_end(window, recent_log_ends)
        for rule, status, reason in _MOVEMENT_RULES:
            if rule(window) and not (status is PartitionStatus.WARN and keeping_up):
                fired.append(status)
                reasons.append(reason)
    else:
        reasons.append(f"only {len(window)} observation(s); at least {min_window} needed to judge movement")
    ordered = tuple(sorted(fired, reverse=True))
    return Evaluation(ordered[0] if ordered else PartitionStatus.OK, ordered, "; ".join(reasons) or "healthy")


def group_status(partition_statuses: Sequence[PartitionStatus]) -> PartitionStatus:
    """A group is as healthy as its worst partition."""
    return max(partition_statuses, default=PartitionStatus.OK)
