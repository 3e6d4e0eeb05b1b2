"""detector_heartbeat: what a query waits for through an outage (a cluster, the store), since when, how many tries

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25 06:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("detector_heartbeat") as batch:
        batch.add_column(sa.Column("waiting", sa.Text(), nullable=True))
        batch.add_column(sa.Column("waiting_since_ms", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("retries", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("detector_heartbeat") as batch:
        batch.drop_column("retries")
        batch.drop_column("waiting_since_ms")
        batch.drop_column("waiting")
