"""The store: one engine, one small repository per concern. Every write of one logical step is one transaction."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from khipu.store import schema
from khipu.store.alerts import AlertRepository
from khipu.store.channel import TraceChannelRepository
from khipu.store.decided import DecidedRepository
from khipu.store.engine import StoreEngine
from khipu.store.health import HealthRepository
from khipu.store.heartbeat import HeartbeatRepository
from khipu.store.resends import ResendRepository
from khipu.store.snapshots import SnapshotRepository
from khipu.store.verdicts import VerdictRepository


class Store:
    """The Khipu store at ``url``: ``store.snapshots``, ``store.health``, ``store.verdicts``, ``store.decided``,
    ``store.channel``, ``store.heartbeat``, ``store.alerts`` and ``store.resends`` share one engine
    (``store.engine``)."""

    def __init__(self, url: str, **engine_options: Any) -> None:
        self.engine = StoreEngine(url, **engine_options)
        self.snapshots = SnapshotRepository(self.engine)
        self.health = HealthRepository(self.engine)
        self.verdicts = VerdictRepository(self.engine)
        self.decided = DecidedRepository(self.engine)
        self.channel = TraceChannelRepository(self.engine)
        self.heartbeat = HeartbeatRepository(self.engine)
        self.alerts = AlertRepository(self.engine)
        self.resends = ResendRepository(self.engine)

    @property
    def url(self) -> str:
        return self.engine.url

    @property
    def safe_url(self) -> str:
        """The URL without its password: the one to print or log."""
        return self.engine.safe_url

    def migrate(self) -> None:
        """Create or upgrade the schema to the newest migration (safe to repeat)."""
        self.engine.migrate()

    def installed_ms(self) -> int | None:
        """When this Khipu was installed, in epoch ms: when the store was created, or upgraded to migration 0014 (the
        first that keeps it); khipu_reconcile's schedule starts at the hour after it. None: its row was deleted.
        A :class:`StoreError` when the store cannot be reached or was never migrated to 0014."""
        with self.engine.begin(commit=False) as tx:
            found = tx.execute(select(schema.installation.c.installed_ms)).scalar()
        return None if found is None else int(found)

    def close(self) -> None:
        self.engine.close()
