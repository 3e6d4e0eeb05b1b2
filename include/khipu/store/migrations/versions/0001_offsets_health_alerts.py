"""offset snapshots, partition health, offset windows, alerts

Revision ID: 0001
Revises:
Create Date: 2026-11-22 23:23:48.859175
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("alert_key", sa.String(length=512), nullable=False),
        sa.Column("subject", sa.String(length=1024), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("details", sa.Text(), nullable=False),
        sa.Column("at_ms", sa.BigInteger(), nullable=False),
        sa.Column("delivered_ms", sa.BigInteger(), nullable=True),
        sa.Column("deliveries", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("alert_key"),
    )
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.create_index("ix_alerts_pending", ["delivered_ms"], unique=False)

    op.create_table(
        "health_transitions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("cluster", sa.String(length=249), nullable=False),
        sa.Column("group_id", sa.String(length=249), nullable=False),
        sa.Column("topic", sa.String(length=249), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("from_status", sa.String(length=16), nullable=True),
        sa.Column("to_status", sa.String(length=16), nullable=False),
        sa.Column("at_ms", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("evidence", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("health_transitions", schema=None) as batch_op:
        batch_op.create_index("ix_health_transitions_time", ["at_ms"], unique=False)

    op.create_table(
        "offset_snapshots",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("cluster", sa.String(length=249), nullable=False),
        sa.Column("group_id", sa.String(length=249), nullable=False),
        sa.Column("topic", sa.String(length=249), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("snapshot_ms", sa.BigInteger(), nullable=False),
        sa.Column("committed_offset", sa.BigInteger(), nullable=True),
        sa.Column("log_start_offset", sa.BigInteger(), nullable=True),
        sa.Column("log_end_offset", sa.BigInteger(), nullable=True),
        sa.Column("group_state", sa.String(length=32), nullable=True),
        sa.Column("retention_ms", sa.BigInteger(), nullable=True),
        sa.Column("committed_changed", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
            "cluster", "group_id", "topic", "partition", "snapshot_ms", name="uq_offset_snapshots_key_time"
        ),
    )
    with op.batch_alter_table("offset_snapshots", schema=None) as batch_op:
        batch_op.create_index("ix_offset_snapshots_log", ["cluster", "topic", "partition", "snapshot_ms"], unique=False)
        batch_op.create_index("ix_offset_snapshots_time", ["snapshot_ms"], unique=False)

    op.create_table(
        "offset_windows",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("cluster", sa.String(length=249), nullable=False),
        sa.Column("group_id", sa.String(length=249), nullable=False),
        sa.Column("topic", sa.String(length=249), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("from_offset", sa.BigInteger(), nullable=False),
        sa.Column("to_offset", sa.BigInteger(), nullable=False),
        sa.Column("detected_ms", sa.BigInteger(), nullable=False),
        sa.Column("previous_committed", sa.BigInteger(), nullable=True),
        sa.Column("committed", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
            "cluster", "group_id", "topic", "partition", "kind", "detected_ms", name="uq_offset_windows"
        ),
    )
    with op.batch_alter_table("offset_windows", schema=None) as batch_op:
        batch_op.create_index(
            "ix_offset_windows_partition", ["cluster", "topic", "partition", "from_offset"], unique=False
        )

    op.create_table(
        "partition_health",
        sa.Column("cluster", sa.String(length=249), nullable=False),
        sa.Column("group_id", sa.String(length=249), nullable=False),
        sa.Column("topic", sa.String(length=249), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("since_ms", sa.BigInteger(), nullable=False),
        sa.Column("evaluated_ms", sa.BigInteger(), nullable=False),
        sa.Column("lag", sa.BigInteger(), nullable=True),
        sa.Column("time_lag_ms", sa.BigInteger(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("evidence", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "group_id", "topic", "partition"),
    )
    op.create_table(
        "snapshot_runs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("cluster", sa.String(length=249), nullable=False),
        sa.Column("snapshot_ms", sa.BigInteger(), nullable=False),
        sa.Column("groups", sa.Integer(), nullable=False),
        sa.Column("partitions", sa.Integer(), nullable=False),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.Column("errors", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("cluster", "snapshot_ms", name="uq_snapshot_runs_cluster_time"),
    )


def downgrade() -> None:
    op.drop_table("snapshot_runs")
    op.drop_table("partition_health")
    with op.batch_alter_table("offset_windows", schema=None) as batch_op:
        batch_op.drop_index("ix_offset_windows_partition")

    op.drop_table("offset_windows")
    with op.batch_alter_table("offset_snapshots", schema=None) as batch_op:
        batch_op.drop_index("ix_offset_snapshots_time")
        batch_op.drop_index("ix_offset_snapshots_log")

    op.drop_table("offset_snapshots")
    with op.batch_alter_table("health_transitions", schema=None) as batch_op:
        batch_op.drop_index("ix_health_transitions_time")

    op.drop_table("health_transitions")
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.drop_index("ix_alerts_pending")

    op.drop_table("alerts")
