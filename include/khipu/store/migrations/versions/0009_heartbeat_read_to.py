"""detector progress: the time up to which the trace topic is read, per batch before it runs, and in the heartbeat

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24 10:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("detector_heartbeat") as batch:
        batch.add_column(sa.Column("read_to_ms", sa.BigInteger(), nullable=True))
    op.create_table(
        "detector_progress",
        sa.Column("query_name", sa.String(64), primary_key=True),
        sa.Column("read_to_ms", sa.BigInteger(), nullable=False),
        sa.Column("at_ms", sa.BigInteger(), nullable=False),
        # when the query's checkpoint was first started: heartbeats before it are another run's reading
        sa.Column("since_ms", sa.BigInteger(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_table("detector_progress")
    with op.batch_alter_table("detector_heartbeat") as batch:
        batch.drop_column("read_to_ms")
