"""verdict metrics: ABORTED, SUPERSEDED and reprocessed duplicates counted apart; latencies clock skew made impossible

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24 20:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

COUNTS = ("aborted", "superseded", "reprocessed")


def upgrade() -> None:
    for table in ("verdict_metrics", "verdict_metric_parts"):
        with op.batch_alter_table(table) as batch:
            for name in COUNTS:
                batch.add_column(sa.Column(name, sa.Integer(), nullable=False, server_default="0"))
            batch.add_column(sa.Column("skew_histogram", sa.Text(), nullable=True))


def downgrade() -> None:
    for table in ("verdict_metrics", "verdict_metric_parts"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("skew_histogram")
            for name in reversed(COUNTS):
                batch.drop_column(name)
