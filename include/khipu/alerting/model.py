"""The alert value: what every notifier receives, and its JSON payload for webhooks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol


class AlertState(StrEnum):
    FIRING = "firing"
    RESOLVED = "resolved"


class Severity(StrEnum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True, slots=True)
class Alert:
    """One occurrence: ``key`` is unique per occurrence, so a retried task never sends it twice."""

    key: str
    subject: str  # what it is about, e.g. "local/orders[0] <- sink-s3"
    kind: str  # partition_status | offset_window | task_failure
    state: AlertState
    severity: Severity
    title: str
    at_ms: int
    details: Mapping[str, Any] = field(default_factory=dict)

    def payload(self) -> dict[str, Any]:
        """The JSON body webhooks receive."""
        return {
            "source": "khipu",
            "key": self.key,
            "subject": self.subject,
            "kind": self.kind,
            "state": self.state.value,
            "severity": self.severity.value,
            "title": self.title,
            "at_ms": self.at_ms,
            "details": dict(self.details),
        }


class StoredAlert(Protocol):
    """An alert as the store keeps it (``khipu.store.AlertRecord``): state and severity as text."""

    @property
    def key(self) -> str: ...
    @property
    def subject(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def severity(self) -> str: ...
    @property
    def title(self) -> str: ...
    @property
    def at_ms(self) -> int: ...
    @property
    def details(self) -> Mapping[str, Any]: ...


def alert_from(stored: StoredAlert) -> Alert:
    """The alert a stored one records."""
    return Alert(
        key=stored.key,
        subject=stored.subject,
        kind=stored.kind,
        state=AlertState(stored.state),
        severity=Severity(stored.severity),
        title=stored.title,
        at_ms=stored.at_ms,
        details=stored.details,
    )


def task_failure_alert(dag_id: str, task_id: str | None, run_id: str | None, error: str, at_ms: int) -> Alert:
    """The alert for a failed Khipu DAG run or task (sent through the same notifiers)."""
    subject = f"dag {dag_id}" + (f" task {task_id}" if task_id else "")
    return Alert(
        key=f"failure:{dag_id}:{task_id or '-'}:{run_id or '-'}:{at_ms}",
        subject=subject,
        kind="task_failure",
        state=AlertState.FIRING,
        severity=Severity.CRITICAL,
        title=f"Khipu {subject} failed" + (f" (run {run_id})" if run_id else ""),
        at_ms=at_ms,
        details={"dag_id": dag_id, "task_id": task_id, "run_id": run_id, "error": error[:2000]},
    )
