"""Partition health as stored: each partition's current status, its transitions, the offset windows found.

The health domain (:mod:`khipu.health`) hands its values in through the small protocols below and
reads back plain records (status names, window kinds as text); it converts them to its own types.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import insert, select, update

from khipu.offsets.model import PartitionKey
from khipu.store import schema
from khipu.store.alerts import AlertLike, alert_row
from khipu.store.engine import StoreEngine, insert_ignoring_duplicate, partition_key_is


class Named(Protocol):
    """A status: stored by its name (e.g. ``khipu.health.rules.PartitionStatus``)."""

    @property
    def name(self) -> str: ...


class Valued(Protocol):
    """A kind: stored by its value (e.g. ``khipu.health.windows.WindowKind``)."""

    @property
    def value(self) -> str: ...


class Judgement(Protocol):
    """Why a partition has its status (what a transition row keeps)."""

    @property
    def reason(self) -> str: ...
    @property
    def evidence(self) -> Mapping[str, Any]: ...


class HealthLike(Judgement, Protocol):
    """A partition's health as of one evaluation (e.g. ``khipu.health.evaluate.PartitionHealth``)."""

    @property
    def key(self) -> PartitionKey: ...
    @property
    def status(self) -> Named: ...
    @property
    def evaluated_ms(self) -> int: ...
    @property
    def lag(self) -> int | None: ...
    @property
    def time_lag_ms(self) -> int | None: ...


class TransitionLike(Protocol):
    """A status change (e.g. ``khipu.alerting.decide.Transition``)."""

    @property
    def key(self) -> PartitionKey: ...
    @property
    def from_status(self) -> Named | None: ...
    @property
    def to_status(self) -> Named: ...
    @property
    def at_ms(self) -> int: ...
    @property
    def health(self) -> Judgement: ...


class WindowLike(Protocol):
    """An offset window (e.g. ``khipu.health.windows.OffsetWindow``)."""

    @property
    def key(self) -> PartitionKey: ...
    @property
    def kind(self) -> Valued: ...
    @property
    def from_offset(self) -> int: ...
    @property
    def to_offset(self) -> int: ...
    @property
    def detected_ms(self) -> int: ...
    @property
    def previous_committed(self) -> int | None: ...
    @property
    def committed(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class StoredStatus:
    status_name: str  # the name of a khipu.health.rules.PartitionStatus
    since_ms: int


@dataclass(frozen=True, slots=True)
class StoredWindow:
    key: PartitionKey
    kind: str  # the value of a khipu.health.windows.WindowKind
    from_offset: int  # first offset of the window
    to_offset: int  # first offset after it
    detected_ms: int
    previous_committed: int | None
    committed: int | None


class HealthRepository:
    """``store.health``: current statuses, transitions, offset windows."""

    def __init__(self, engine: StoreEngine) -> None:
        self._engine = engine

    def current_statuses(self, cluster: str) -> dict[PartitionKey, StoredStatus]:
        table = schema.partition_health
        with self._engine.begin() as tx:
            rows = tx.execute(select(table).where(table.c.cluster == cluster))
            return {
                PartitionKey(r.cluster, r.group_id, r.topic, r.partition): StoredStatus(r.status, r.since_ms)
                for r in rows
            }

    def save_evaluation(
        self,
        healths: Sequence[HealthLike],
        changes: Sequence[TransitionLike],
        windows: Sequence[WindowLike],
        alerts: Sequence[AlertLike],
    ) -> None:
        """Statuses, transitions, new windows and the alerts they raise, in one transaction (idempotent)."""
        changed = {change.key for change in changes}
        table = schema.partition_health
        with self._engine.begin() as tx:
            existing = {
                PartitionKey(r.cluster, r.group_id, r.topic, r.partition): r.since_ms
                for r in tx.execute(
                    select(table.c.cluster, table.c.group_id, table.c.topic, table.c.partition, table.c.since_ms)
                )
            }
            for health in healths:
                values = dict(
                    status=health.status.name,
                    evaluated_ms=health.evaluated_ms,
                    lag=health.lag,
                    time_lag_ms=health.time_lag_ms,
                    reason=health.reason,
                    evidence=json.dumps(health.evidence),
                )
                if health.key in changed or health.key not in existing:
                    values["since_ms"] = health.evaluated_ms
                if health.key in existing:
                    tx.execute(update(table).where(*partition_key_is(table, health.key)).values(**values))
                else:
                    tx.execute(
                        insert(table).values(
                            cluster=health.key.cluster,
                            group_id=health.key.group,
                            topic=health.key.topic,
                            partition=health.key.partition,
                            **values,
                        )
                    )
            for change in changes:
                tx.execute(
                    insert(schema.health_transitions).values(
                        cluster=change.key.cluster,
                        group_id=change.key.group,
                        topic=change.key.topic,
                        partition=change.key.partition,
                        from_status=change.from_status.name if change.from_status is not None else None,
                        to_status=change.to_status.name,
                        at_ms=change.at_ms,
                        reason=change.health.reason,
                        evidence=json.dumps(change.health.evidence),
                    )
                )
            for window in windows:
                insert_ignoring_duplicate(
                    tx,
                    schema.offset_windows,
                    dict(
                        cluster=window.key.cluster,
                        group_id=window.key.group,
                        topic=window.key.topic,
                        partition=window.key.partition,
                        kind=window.kind.value,
                        from_offset=window.from_offset,
                        to_offset=window.to_offset,
                        detected_ms=window.detected_ms,
                        previous_committed=window.previous_committed,
                        committed=window.committed,
                    ),
                )
            for alert in alerts:
                insert_ignoring_duplicate(tx, schema.alerts, alert_row(alert))

    def current_rows(self, cluster: str) -> list[dict[str, Any]]:
        """Every partition's stored health (status, since, lag, time lag, reason, evidence as JSON text)."""
        table = schema.partition_health
        query = (
            select(table).where(table.c.cluster == cluster).order_by(table.c.group_id, table.c.topic, table.c.partition)
        )
        with self._engine.begin() as tx:
            return [dict(row._mapping) for row in tx.execute(query)]

    def transition_rows(
        self, cluster: str, since_ms: int = 0, group: str | None = None, limit: int = 200
    ) -> list[dict[str, Any]]:
        """The newest status changes since ``since_ms`` (of one group, when given), newest first, with their
        reason and evidence."""
        table = schema.health_transitions
        query = select(table).where(table.c.cluster == cluster, table.c.at_ms >= since_ms)
        if group is not None:
            query = query.where(table.c.group_id == group)
        query = query.order_by(table.c.at_ms.desc(), table.c.id.desc()).limit(limit)
        with self._engine.begin() as tx:
            return [dict(row._mapping) for row in tx.execute(query)]

    def transitions(self, cluster: str, since_ms: int = 0) -> list[tuple[PartitionKey, str | None, str, int]]:
        """(partition, from status name, to status name, at_ms), oldest first."""
        table = schema.health_transitions
        with self._engine.begin() as tx:
            rows = tx.execute(
                select(table)
                .where(table.c.cluster == cluster, table.c.at_ms >= since_ms)
                .order_by(table.c.at_ms, table.c.id)
            )
            return [
                (PartitionKey(r.cluster, r.group_id, r.topic, r.partition), r.from_status, r.to_status, r.at_ms)
                for r in rows
            ]

    def offset_windows(
        self,
        cluster: str,
        topic: str | None = None,
        partition: int | None = None,
        covering_offset: int | None = None,
        since_ms: int | None = None,
    ) -> list[StoredWindow]:
        """Stored windows, optionally of one partition, containing ``covering_offset``, detected since ``since_ms``."""
        table = schema.offset_windows
        query = select(table).where(table.c.cluster == cluster)
        if since_ms is not None:
            query = query.where(table.c.detected_ms >= since_ms)
        if topic is not None:
            query = query.where(table.c.topic == topic)
        if partition is not None:
            query = query.where(table.c.partition == partition)
        if covering_offset is not None:
            query = query.where(table.c.from_offset <= covering_offset, table.c.to_offset > covering_offset)
        with self._engine.begin() as tx:
            return [
                StoredWindow(
                    PartitionKey(r.cluster, r.group_id, r.topic, r.partition),
                    r.kind,
                    r.from_offset,
                    r.to_offset,
                    r.detected_ms,
                    r.previous_committed,
                    r.committed,
                )
                for r in tx.execute(query.order_by(table.c.detected_ms))
            ]
