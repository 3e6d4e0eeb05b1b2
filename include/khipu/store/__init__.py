"""The Khipu store: offset snapshots, partition health, offset windows and alerts, on SQL.

SQLite by default (a file under the state folder), PostgreSQL in production; the schema is
created and migrated by Alembic (``Store.migrate()``), never by hand-run DDL.
"""

from __future__ import annotations

from khipu.store.store import CommittedOffset, Store, StoredStatus, StoreError

__all__ = ["CommittedOffset", "Store", "StoreError", "StoredStatus"]
