"""Which health changes become alerts: one per transition, never one per minute.

- A partition entering STALL, STOP, REWIND or EXPIRY_RISK fires (again on a move between two of
  them, e.g. STALL -> STOP); leaving them for a quieter status sends a resolve.
- Every new offset window (skip, rewind, expired) fires once; windows do not resolve.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from khipu.alerting.model import Alert, AlertState, Severity
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


def alerts_for(changes: Sequence[Transition], windows: Sequence[OffsetWindow]) -> list[Alert]:
    alerts = []
    for change in changes:
        subject = str(change.key)
        details = {
            "cluster": change.key.cluster,
            "group": change.key.group,
            "topic": change.key.topic,
            "partition": change.key.partition,
            "from_status": change.from_status.name if change.from_status is not None else None,
            "to_status": change.to_status.name,
            "lag": change.health.lag,
            "time_lag_ms": change.health.time_lag_ms,
            "reason": change.health.reason,
            "evidence": change.health.evidence,
        }
        if change.to_status in ALERTING:
            alerts.append(
                Alert(
                    key=f"partition:{subject}:{change.to_status.name}:{change.at_ms}",
                    subject=subject,
                    kind="partition_status",
                    state=AlertState.FIRING,
                    severity=_SEVERITY[change.to_status],
                    title=f"{change.to_status.name}: {_where(change.key)} (lag {change.health.lag})",
                    at_ms=change.at_ms,
                    details=details,
                )
            )
        elif change.from_status in ALERTING:
            alerts.append(
                Alert(
                    key=f"partition:{subject}:resolved:{change.at_ms}",
                    subject=subject,
                    kind="partition_status",
                    state=AlertState.RESOLVED,
                    severity=Severity.INFO,
                    title=f"resolved: {_where(change.key)} is {change.to_status.name} again",
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
