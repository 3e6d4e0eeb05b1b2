"""Which health changes become alerts: one per transition, never one per minute.

- Partition transitions are kept as history; alerts are per consumer group, whose status is its
  worst partition's (as Burrow reports groups): a group entering STALL, STOP, REWIND or
  EXPIRY_RISK fires once, listing its partitions (again on a move between two of those, e.g.
  STALL -> STOP); leaving them for a quieter status sends a resolve.
- Every new offset window (skip, rewind, expired) fires once; windows do not resolve.
- The detector going down (DOWN or HUNG) fires once; it resolves when the detector is HEALTHY
  again. A detector that never ran, or is starting, changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from khipu.alerting.model import Alert, AlertState, Severity
from khipu.detector.supervise import DetectorHealth
from khipu.health.evaluate import PartitionHealth
from khipu.health.rules import PartitionStatus
from khipu.health.windows import OffsetWindow, WindowKind
from khipu.offsets.model import PartitionKey

ALERTING = frozenset({PartitionStatus.STALL, PartitionStatus.STOP, PartitionStatus.REWIND, PartitionStatus.EXPIRY_RISK})
_SEVERITY = {
    PartitionStatus.STOP: Severity.CRITICAL,
    PartitionStatus.EXPIRY_RISK: Severity.CRITICAL,
    PartitionStatus.STALL: Severity.CRITICAL,
    PartitionStatus.REWIND: Severity.WARNING,
}
_WINDOW_SEVERITY = {
    WindowKind.SKIP: Severity.CRITICAL,
    WindowKind.EXPIRED: Severity.CRITICAL,
    WindowKind.REWIND: Severity.WARNING,
}


@dataclass(frozen=True, slots=True)
class Transition:
    key: PartitionKey
    from_status: PartitionStatus | None  # None: first evaluation of this partition
    to_status: PartitionStatus
    at_ms: int
    health: PartitionHealth


def _where(key: PartitionKey) -> str:
    return f"group {key.group} on {key.cluster}/{key.topic}[{key.partition}]"


def transitions(
    previous: Mapping[PartitionKey, PartitionStatus], current: Sequence[PartitionHealth]
) -> list[Transition]:
    """Partitions whose status differs from the stored one (a new partition counts when it is not OK)."""
    changed = []
    for health in current:
        before = previous.get(health.key)
        if before != health.status and not (before is None and health.status is PartitionStatus.OK):
            changed.append(Transition(health.key, before, health.status, health.evaluated_ms, health))
    return changed


@dataclass(frozen=True, slots=True)
class GroupChange:
    cluster: str
    group: str
    from_status: PartitionStatus | None  # None: the group's first evaluation
    to_status: PartitionStatus
    at_ms: int
    partitions: tuple[PartitionHealth, ...]  # the group's partitions as just judged

    @property
    def subject(self) -> str:
        return f"group {self.group} on {self.cluster}"


def group_changes(
    previous: Mapping[PartitionKey, PartitionStatus], current: Sequence[PartitionHealth]
) -> list[GroupChange]:
    """Groups whose worst partition status differs from before (a new group counts when it is not OK)."""
    by_group: dict[tuple[str, str], list[PartitionHealth]] = {}
    for health in current:
        by_group.setdefault((health.key.cluster, health.key.group), []).append(health)
    changes = []
    for (cluster, group), healths in sorted(by_group.items()):
        known = [previous[h.key] for h in healths if h.key in previous]
        before = max(known) if known else None
        after = max(h.status for h in healths)
        if before != after and not (before is None and after is PartitionStatus.OK):
            changes.append(GroupChange(cluster, group, before, after, healths[0].evaluated_ms, tuple(healths)))
    return changes


def alerts_for(changes: Sequence[GroupChange], windows: Sequence[OffsetWindow]) -> list[Alert]:
    alerts = []
    for change in changes:
        affected = [h for h in change.partitions if h.status is change.to_status] or list(change.partitions)
        where = ", ".join(f"{h.key.topic}[{h.key.partition}] lag {h.lag}" for h in affected[:5])
        more = f" and {len(affected) - 5} more" if len(affected) > 5 else ""
        details = {
            "cluster": change.cluster,
            "group": change.group,
            "from_status": change.from_status.name if change.from_status is not None else None,
            "to_status": change.to_status.name,
            "partitions": [
                {
                    "topic": h.key.topic,
                    "partition": h.key.partition,
                    "status": h.status.name,
                    "lag": h.lag,
                    "time_lag_ms": h.time_lag_ms,
                    "reason": h.reason,
                    "evidence": h.evidence,
                }
                for h in change.partitions
            ],
        }
        if change.to_status in ALERTING:
            alerts.append(
                Alert(
                    key=f"group:{change.cluster}/{change.group}:{change.to_status.name}:{change.at_ms}",
                    subject=change.subject,
                    kind="group_status",
                    state=AlertState.FIRING,
                    severity=_SEVERITY[change.to_status],
                    title=f"{change.to_status.name}: {change.subject}: {len(affected)} partition(s), {where}{more}",
                    at_ms=change.at_ms,
                    details=details,
                )
            )
        elif change.from_status in ALERTING:
            alerts.append(
                Alert(
                    key=f"group:{change.cluster}/{change.group}:resolved:{change.at_ms}",
                    subject=change.subject,
                    kind="group_status",
                    state=AlertState.RESOLVED,
                    severity=Severity.INFO,
                    title=f"resolved: {change.subject} is {change.to_status.name} again",
                    at_ms=change.at_ms,
                    details=details,
                )
            )
    for window in windows:
        subject = str(window.key)
        alerts.append(
            Alert(
                key=f"window:{subject}:{window.kind.value}:{window.detected_ms}",
                subject=subject,
                kind="offset_window",
                state=AlertState.FIRING,
                severity=_WINDOW_SEVERITY[window.kind],
                title=f"offset {window.kind.value}: {_where(window.key)} "
                f"offsets {window.from_offset}..{window.to_offset} ({window.records} records)",
                at_ms=window.detected_ms,
                details={
                    "cluster": window.key.cluster,
                    "group": window.key.group,
                    "topic": window.key.topic,
                    "partition": window.key.partition,
                    "kind": window.kind.value,
                    "from_offset": window.from_offset,
                    "to_offset": window.to_offset,
                    "previous_committed": window.previous_committed,
                    "committed": window.committed,
                },
            )
        )
    return alerts


DETECTOR_SUBJECT = "khipu detector"
DETECTOR_ALERT_KIND = "detector_down"


def detector_alert(health: DetectorHealth, firing: bool, now_ms: int) -> Alert | None:
    """The detector-down alert to raise now, given whether one is firing (the last one sent fired)."""
    details = {"state": health.state.value, "reason": health.reason, "last_beat_ms": health.last_beat_ms}
    if health.state.is_down and not firing:
        return Alert(
            key=f"detector:down:{now_ms}",
            subject=DETECTOR_SUBJECT,
            kind=DETECTOR_ALERT_KIND,
            state=AlertState.FIRING,
            severity=Severity.CRITICAL,
            title=f"detector {health.state.value}: {health.reason}",
            at_ms=now_ms,
            details=details,
        )
    if health.state.value == "healthy" and firing:
        return Alert(
            key=f"detector:resolved:{now_ms}",
            subject=DETECTOR_SUBJECT,
            kind=DETECTOR_ALERT_KIND,
            state=AlertState.RESOLVED,
            severity=Severity.INFO,
            title=f"resolved: the detector is healthy again ({health.reason})",
            at_ms=now_ms,
            details=details,
        )
    return None
