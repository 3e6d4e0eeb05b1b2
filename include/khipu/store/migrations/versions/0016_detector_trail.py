"""detector_trail, detector_skips: how far the detector trails each trace-topic partition, and the offsets the broker
removed before it read them (it skipped them: Spark's Kafka source runs with failOnDataLoss=false)

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "detector_trail",
        sa.Column("query_name", sa.String(64), nullable=False),
        sa.Column("partition", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("read_end", sa.BigInteger(), nullable=False),
        sa.Column("batch_id", sa.BigInteger(), nullable=False),
        sa.Column("log_start", sa.BigInteger(), nullable=False),
        sa.Column("log_end", sa.BigInteger(), nullable=False),
        sa.Column("asked_ms", sa.BigInteger(), nullable=False),
        sa.Column("oldest_unread_offset", sa.BigInteger(), nullable=True),
        sa.Column("oldest_unread_ms", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("query_name", "partition"),
    )
    op.create_table(
        "detector_skips",
        sa.Column("query_name", sa.String(64), nullable=False),
        sa.Column("partition", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("from_offset", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("to_offset", sa.BigInteger(), nullable=False),
        sa.Column("batch_id", sa.BigInteger(), nullable=False),
        sa.Column("detected_ms", sa.BigInteger(), nullable=False),
        sa.Column("alerted_ms", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("query_name", "partition", "from_offset"),
    )
    op.create_index("ix_detector_skips_time", "detector_skips", ["query_name", "detected_ms"])


def downgrade() -> None:
    op.drop_index("ix_detector_skips_time", table_name="detector_skips")
    op.drop_table("detector_skips")
    op.drop_table("detector_trail")
