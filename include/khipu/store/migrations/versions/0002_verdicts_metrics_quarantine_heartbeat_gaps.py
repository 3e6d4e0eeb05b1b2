"""verdicts, metrics, quarantine, detector heartbeat, trace gaps

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 01:06:41.102252
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "detector_heartbeat",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("query_name", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("batch_id", sa.BigInteger(), nullable=False),
        sa.Column("at_ms", sa.BigInteger(), nullable=False),
        sa.Column("input_rows", sa.BigInteger(), nullable=False),
        sa.Column("input_rows_per_s", sa.Float(), nullable=True),
        sa.Column("processed_rows_per_s", sa.Float(), nullable=True),
        sa.Column("batch_duration_ms", sa.BigInteger(), nullable=True),
        sa.Column("state_rows", sa.BigInteger(), nullable=True),
        sa.Column("state_bytes", sa.BigInteger(), nullable=True),
        sa.Column("caught_up", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("detector_heartbeat", schema=None) as batch_op:
        batch_op.create_index("ix_detector_heartbeat_time", ["query_name", "at_ms"], unique=False)

    op.create_table(
        "emitter_progress",
        sa.Column("emitter_id", sa.String(length=249), nullable=False),
        sa.Column("location", sa.String(length=249), nullable=False),
        sa.Column("max_seq", sa.BigInteger(), nullable=False),
        sa.Column("base_seq", sa.BigInteger(), nullable=False),
        sa.Column("base_ms", sa.BigInteger(), nullable=True),
        sa.Column("runs", sa.Text(), nullable=False),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("emitter_id"),
    )
    op.create_table(
        "trace_pointers",
        sa.Column("location", sa.String(length=249), nullable=False),
        sa.Column("cluster", sa.String(length=249), nullable=False),
        sa.Column("topic", sa.String(length=249), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("seen_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("location", "cluster", "topic", "partition", "offset"),
    )
    with op.batch_alter_table("trace_pointers", schema=None) as batch_op:
        batch_op.create_index("ix_trace_pointers_seen", ["seen_ms"], unique=False)

    op.create_table(
        "quarantine",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("source_topic", sa.String(length=249), nullable=False),
        sa.Column("source_partition", sa.Integer(), nullable=False),
        sa.Column("source_offset", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("raw_value", sa.LargeBinary(), nullable=True),
        sa.Column("kafka_timestamp_ms", sa.BigInteger(), nullable=True),
        sa.Column("quarantined_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("source_topic", "source_partition", "source_offset", name="uq_quarantine_record"),
    )
    op.create_table(
        "trace_gaps",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("emitter_id", sa.String(length=249), nullable=False),
        sa.Column("location", sa.String(length=249), nullable=False),
        sa.Column("from_seq", sa.BigInteger(), nullable=False),
        sa.Column("to_seq", sa.BigInteger(), nullable=False),
        sa.Column("after_ms", sa.BigInteger(), nullable=False),
        sa.Column("before_ms", sa.BigInteger(), nullable=False),
        sa.Column("noticed_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("trace_gaps", schema=None) as batch_op:
        batch_op.create_index("ix_trace_gaps_emitter", ["emitter_id", "from_seq"], unique=False)
        batch_op.create_index("ix_trace_gaps_location_time", ["location", "before_ms"], unique=False)

    op.create_table(
        "verdict_metrics",
        sa.Column("stream", sa.String(length=249), nullable=False),
        sa.Column("hop", sa.String(length=520), nullable=False),
        sa.Column("minute_ms", sa.BigInteger(), nullable=False),
        sa.Column("delivered", sa.Integer(), nullable=False),
        sa.Column("lost", sa.Integer(), nullable=False),
        sa.Column("duplicate", sa.Integer(), nullable=False),
        sa.Column("trace_lost", sa.Integer(), nullable=False),
        sa.Column("pending", sa.Integer(), nullable=False),
        sa.Column("loss_rate", sa.Float(), nullable=False),
        sa.Column("duplicate_rate", sa.Float(), nullable=False),
        sa.Column("latency_p50_ms", sa.BigInteger(), nullable=True),
        sa.Column("latency_p95_ms", sa.BigInteger(), nullable=True),
        sa.Column("latency_p99_ms", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("stream", "hop", "minute_ms"),
    )
    op.create_table(
        "verdicts",
        sa.Column("message_id", sa.String(length=256), nullable=False),
        sa.Column("hop", sa.String(length=520), nullable=False),
        sa.Column("stream", sa.String(length=249), nullable=False),
        sa.Column("hop_kind", sa.String(length=8), nullable=False),
        sa.Column("verdict", sa.String(length=16), nullable=False),
        sa.Column("cause", sa.String(length=32), nullable=True),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("topic", sa.String(length=249), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=True),
        sa.Column("offset", sa.BigInteger(), nullable=True),
        sa.Column("group_id", sa.String(length=249), nullable=True),
        sa.Column("location", sa.String(length=249), nullable=True),
        sa.Column("observed_ms", sa.BigInteger(), nullable=True),
        sa.Column("latency_ms", sa.BigInteger(), nullable=True),
        sa.Column("e2e_latency_ms", sa.BigInteger(), nullable=True),
        sa.Column("decided_ms", sa.BigInteger(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("message_id", "hop"),
    )
    with op.batch_alter_table("verdicts", schema=None) as batch_op:
        batch_op.create_index("ix_verdicts_kind", ["verdict", "decided_ms"], unique=False)
        batch_op.create_index("ix_verdicts_stream_time", ["stream", "decided_ms"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("verdicts", schema=None) as batch_op:
        batch_op.drop_index("ix_verdicts_stream_time")
        batch_op.drop_index("ix_verdicts_kind")

    op.drop_table("verdicts")
    op.drop_table("verdict_metrics")
    with op.batch_alter_table("trace_gaps", schema=None) as batch_op:
        batch_op.drop_index("ix_trace_gaps_location_time")
        batch_op.drop_index("ix_trace_gaps_emitter")

    op.drop_table("trace_gaps")
    op.drop_table("quarantine")
    with op.batch_alter_table("trace_pointers", schema=None) as batch_op:
        batch_op.drop_index("ix_trace_pointers_seen")

    op.drop_table("trace_pointers")
    op.drop_table("emitter_progress")
    with op.batch_alter_table("detector_heartbeat", schema=None) as batch_op:
        batch_op.drop_index("ix_detector_heartbeat_time")

    op.drop_table("detector_heartbeat")
