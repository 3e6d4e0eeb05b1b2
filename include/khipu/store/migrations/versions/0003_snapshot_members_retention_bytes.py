"""offset snapshots: group members, partition assigned, retention.bytes

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 13:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("offset_snapshots", schema=None) as batch_op:
        batch_op.add_column(sa.Column("members", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("assigned", sa.Boolean(), nullable=True))
        batch_op.add_column(sa.Column("retention_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("offset_snapshots", schema=None) as batch_op:
        batch_op.drop_column("retention_bytes")
        batch_op.drop_column("assigned")
        batch_op.drop_column("members")
