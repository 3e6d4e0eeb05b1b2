"""Alerts to send and how each delivery fared: the outbox of :mod:`khipu.alerting.dispatch`.

Alerts come in through :class:`AlertLike` (e.g. ``khipu.alerting.model.Alert``) and go out as
:class:`AlertRecord` (state and severity as text); the alerting domain converts them back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import and_, or_, select, update

from khipu.store import schema
from khipu.store.engine import StoreEngine, insert_ignoring_duplicate

CLAIM_LEASE_MS = 600_000


class _Valued(Protocol):
    @property
    def value(self) -> str: ...


class AlertLike(Protocol):
    """One alert occurrence; ``key`` is unique per occurrence."""

    @property
    def key(self) -> str: ...
    @property
    def subject(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def state(self) -> _Valued: ...
    @property
    def severity(self) -> _Valued: ...
    @property
    def title(self) -> str: ...
    @property
    def at_ms(self) -> int: ...
    @property
    def details(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True, slots=True)
class AlertRecord:
    key: str
    subject: str
    kind: str
    state: str  # the value of a khipu.alerting.model.AlertState
    severity: str  # the value of a khipu.alerting.model.Severity
    title: str
    at_ms: int
    details: dict[str, Any] = field(default_factory=dict)
    delivered_ms: int | None = None  # None: pending; negative: claimed by a dispatcher at minus this time
    deliveries: dict[str, str] = field(default_factory=dict)  # notifier -> "ok" | error text


class AlertRepository:
    """``store.alerts``: alerts recorded, claimed, delivered."""

    def __init__(self, engine: StoreEngine) -> None:
        self._engine = engine

    def pending(self, now_ms: int | None = None) -> list[AlertRecord]:
        """Alerts not delivered yet; with ``now_ms``, also those a dispatcher claimed over
        ``CLAIM_LEASE_MS`` ago and never finished (it died mid-delivery)."""
        table = schema.alerts
        with self._engine.begin() as tx:
            return [
                _record(r)
                for r in tx.execute(
                    select(table).where(_undelivered(table, now_ms)).order_by(table.c.at_ms, table.c.id)
                )
            ]

    def latest(self, kind: str) -> AlertRecord | None:
        """The newest alert of a kind (e.g. whether the detector-down alert is firing)."""
        table = schema.alerts
        with self._engine.begin() as tx:
            row = tx.execute(
                select(table).where(table.c.kind == kind).order_by(table.c.at_ms.desc(), table.c.id.desc()).limit(1)
            ).first()
        return None if row is None else _record(row)

    def firing_subjects(self, kind: str) -> set[str]:
        """The subjects whose newest alert of this kind is firing (not resolved since)."""
        table = schema.alerts
        newest: dict[str, str] = {}
        with self._engine.begin() as tx:
            for row in tx.execute(
                select(table.c.subject, table.c.state).where(table.c.kind == kind).order_by(table.c.at_ms, table.c.id)
            ):
                newest[row.subject] = row.state
        return {subject for subject, state in newest.items() if state == "firing"}

    def firing(self, kind: str) -> list[AlertRecord]:
        """The newest alert of each subject of this kind where it is firing (not resolved since), by subject: what a
        resolve needs to say what the alert covered."""
        subjects = self.firing_subjects(kind)
        table = schema.alerts
        newest: dict[str, AlertRecord] = {}
        with self._engine.begin() as tx:
            for row in tx.execute(
                select(table)
                .where(table.c.kind == kind, table.c.state == "firing", table.c.subject.in_(sorted(subjects)))
                .order_by(table.c.at_ms, table.c.id)
            ):
                newest[row.subject] = _record(row)
        return [newest[subject] for subject in sorted(newest)]

    def claim(self, key: str, claimed_ms: int) -> bool:
        """Take a pending alert for delivery (marked delivered at minus the claim time until it is);
        False when another dispatcher holds it. A claim older than ``CLAIM_LEASE_MS`` may be taken over."""
        table = schema.alerts
        with self._engine.begin() as tx:
            taken = tx.execute(
                update(table)
                .where(table.c.alert_key == key, _undelivered(table, claimed_ms))
                .values(delivered_ms=-claimed_ms)
            )
        return bool(taken.rowcount)

    def release(self, key: str) -> None:
        """Give a claimed alert back (no notifier could deliver it): the next dispatch retries it."""
        table = schema.alerts
        with self._engine.begin() as tx:
            tx.execute(update(table).where(table.c.alert_key == key).values(delivered_ms=None))

    def add(self, alert: AlertLike) -> bool:
        """Record an alert to send (False when that occurrence was recorded before)."""
        with self._engine.begin() as tx:
            return insert_ignoring_duplicate(tx, schema.alerts, alert_row(alert))

    def mark_delivered(self, key: str, deliveries: dict[str, str], delivered_ms: int) -> None:
        table = schema.alerts
        with self._engine.begin() as tx:
            tx.execute(
                update(table)
                .where(table.c.alert_key == key)
                .values(delivered_ms=delivered_ms, deliveries=json.dumps(deliveries))
            )

    def read(self, since_ms: int = 0) -> list[AlertRecord]:
        """Alerts since ``since_ms``, oldest first, with when they were delivered and how each notifier fared."""
        table = schema.alerts
        with self._engine.begin() as tx:
            rows = tx.execute(select(table).where(table.c.at_ms >= since_ms).order_by(table.c.at_ms, table.c.id))
            return [_record(r) for r in rows]


def alert_row(alert: AlertLike) -> dict[str, Any]:
    """The columns of a new alert row (also written by :meth:`HealthRepository.save_evaluation`)."""
    return dict(
        alert_key=alert.key,
        subject=alert.subject,
        kind=alert.kind,
        state=alert.state.value,
        severity=alert.severity.value,
        title=alert.title,
        details=json.dumps(dict(alert.details)),
        at_ms=alert.at_ms,
    )


def _record(row: Any) -> AlertRecord:
    return AlertRecord(
        key=row.alert_key,
        subject=row.subject,
        kind=row.kind,
        state=row.state,
        severity=row.severity,
        title=row.title,
        at_ms=row.at_ms,
        details=json.loads(row.details),
        delivered_ms=row.delivered_ms,
        deliveries=json.loads(row.deliveries) if row.deliveries else {},
    )


def _undelivered(table: Any, now_ms: int | None) -> Any:
    """Not delivered: never claimed, or (given ``now_ms``) claimed by a dispatcher over the lease ago."""
    if now_ms is None:
        return table.c.delivered_ms.is_(None)
    stale_claim = and_(table.c.delivered_ms < 0, table.c.delivered_ms > -(now_ms - CLAIM_LEASE_MS))
    return or_(table.c.delivered_ms.is_(None), stale_claim)
