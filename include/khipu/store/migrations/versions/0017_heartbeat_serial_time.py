"""detector_heartbeat.collect_ms, driver_ms, driver_cpu_ms: where a batch's time went between its Spark job and its
driver (the serial part of a batch, which bounds what more executors can buy)

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06 18:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None
COLUMNS = ("collect_ms", "driver_ms", "driver_cpu_ms")


def upgrade() -> None:
    with op.batch_alter_table("detector_heartbeat") as table:
        for name in COLUMNS:
            table.add_column(sa.Column(name, sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("detector_heartbeat") as table:
        for name in reversed(COLUMNS):
            table.drop_column(name)
