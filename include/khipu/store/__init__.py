"""The Khipu store, on SQL: one engine (:mod:`khipu.store.engine`) and a small repository per concern.

``Store(url)`` holds them: ``store.snapshots`` (offset snapshots and their runs), ``store.health``
(partition statuses, transitions, offset windows), ``store.verdicts`` (the detector's verdicts and
their per-minute metrics), ``store.decided`` (the verdict archive's index: which micro-batch decided each
message), ``store.channel`` (the trace channel: quarantine, back-pointers, emitter sequence gaps),
``store.heartbeat`` (the detector's progress) and ``store.alerts`` (the alert outbox).

The store serves the domain and knows none of it: it never imports ``khipu.health``,
``khipu.alerting`` or ``khipu.detector``. Domain values come in through small protocols each
repository defines and go out as the store's own plain records (status names, window and alert
records), which the domain converts to its own types.

SQLite by default (a file under the state folder), PostgreSQL in production; the schema is
created and migrated by Alembic (``Store.migrate()``), never by hand-run DDL.
"""

from __future__ import annotations

from khipu.store.alerts import AlertRecord
from khipu.store.engine import StoreError
from khipu.store.health import StoredStatus, StoredWindow
from khipu.store.snapshots import CommittedOffset, RemovalEvidence
from khipu.store.store import Store
from khipu.store.verdicts import MinuteTotals

__all__ = [
    "AlertRecord",
    "CommittedOffset",
    "MinuteTotals",
    "RemovalEvidence",
    "Store",
    "StoreError",
    "StoredStatus",
    "StoredWindow",
]
