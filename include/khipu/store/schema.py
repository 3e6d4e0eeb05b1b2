"""Tables of the store (SQLAlchemy Core). Times are epoch milliseconds; JSON is kept as text.

A change here needs a migration in ``migrations/versions``; tests/integration/store checks that
the migrated database matches these definitions.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Column, Index, Integer, MetaData, String, Table, Text, UniqueConstraint

metadata = MetaData()

NAME = 249  # Kafka's limit for topic names; used for every name column

snapshot_runs = Table(
    "snapshot_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cluster", String(NAME), nullable=False),
    Column("snapshot_ms", BigInteger, nullable=False),
    Column("groups", Integer, nullable=False),
    Column("partitions", Integer, nullable=False),
    Column("duration_ms", Integer, nullable=False),
    Column("errors", Text, nullable=False),  # JSON list of strings
    UniqueConstraint("cluster", "snapshot_ms", name="uq_snapshot_runs_cluster_time"),
)

offset_snapshots = Table(
    "offset_snapshots",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cluster", String(NAME), nullable=False),
    Column("group_id", String(NAME), nullable=False),
    Column("topic", String(NAME), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("snapshot_ms", BigInteger, nullable=False),
    Column("committed_offset", BigInteger),
    Column("log_start_offset", BigInteger),
    Column("log_end_offset", BigInteger),
    Column("group_state", String(32)),
    Column("retention_ms", BigInteger),
    Column("committed_changed", Boolean, nullable=False),
    UniqueConstraint("cluster", "group_id", "topic", "partition", "snapshot_ms", name="uq_offset_snapshots_key_time"),
    Index("ix_offset_snapshots_log", "cluster", "topic", "partition", "snapshot_ms"),
    Index("ix_offset_snapshots_time", "snapshot_ms"),
)

partition_health = Table(
    "partition_health",
    metadata,
    Column("cluster", String(NAME), primary_key=True),
    Column("group_id", String(NAME), primary_key=True),
    Column("topic", String(NAME), primary_key=True),
    Column("partition", Integer, primary_key=True),
    Column("status", String(16), nullable=False),
    Column("since_ms", BigInteger, nullable=False),
    Column("evaluated_ms", BigInteger, nullable=False),
    Column("lag", BigInteger),
    Column("time_lag_ms", BigInteger),
    Column("reason", Text, nullable=False),
    Column("evidence", Text, nullable=False),  # JSON
)

health_transitions = Table(
    "health_transitions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cluster", String(NAME), nullable=False),
    Column("group_id", String(NAME), nullable=False),
    Column("topic", String(NAME), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("from_status", String(16)),
    Column("to_status", String(16), nullable=False),
    Column("at_ms", BigInteger, nullable=False),
    Column("reason", Text, nullable=False),
    Column("evidence", Text, nullable=False),
    Index("ix_health_transitions_time", "at_ms"),
)

offset_windows = Table(
    "offset_windows",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cluster", String(NAME), nullable=False),
    Column("group_id", String(NAME), nullable=False),
    Column("topic", String(NAME), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("from_offset", BigInteger, nullable=False),
    Column("to_offset", BigInteger, nullable=False),
    Column("detected_ms", BigInteger, nullable=False),
    Column("previous_committed", BigInteger),
    Column("committed", BigInteger),
    UniqueConstraint("cluster", "group_id", "topic", "partition", "kind", "detected_ms", name="uq_offset_windows"),
    Index("ix_offset_windows_partition", "cluster", "topic", "partition", "from_offset"),
)

alerts = Table(
    "alerts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("alert_key", String(512), nullable=False, unique=True),
    Column("subject", String(1024), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("state", String(16), nullable=False),
    Column("severity", String(16), nullable=False),
    Column("title", Text, nullable=False),
    Column("details", Text, nullable=False),  # JSON
    Column("at_ms", BigInteger, nullable=False),
    Column("delivered_ms", BigInteger),  # null: not yet sent
    Column("deliveries", Text),  # JSON: notifier -> "ok" | error text
    Index("ix_alerts_pending", "delivered_ms"),
)
