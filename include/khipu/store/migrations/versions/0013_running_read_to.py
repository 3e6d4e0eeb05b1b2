"""detector_progress: how far the batch now running will have read the trace topic, set before it runs

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29 10:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("detector_progress") as batch:
        batch.add_column(sa.Column("running_read_to_ms", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("detector_progress") as batch:
        batch.drop_column("running_read_to_ms")
