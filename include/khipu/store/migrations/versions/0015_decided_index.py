"""decided, decided_batches, decided_imports: the verdict archive's index of which micro-batch decided each message,
in the store (it was an SQLite file beside the archive, which a host without that disk cannot reach)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06 15:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "decided",
        sa.Column("message_id", sa.String(256), nullable=False),
        sa.Column("batch_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("first_seen_ms", sa.BigInteger(), nullable=True),
        sa.Column("hour", sa.String(13), nullable=False),
        sa.PrimaryKeyConstraint("message_id", "batch_id"),
        sqlite_with_rowid=False,
    )
    op.create_index("ix_decided_batch", "decided", ["batch_id"])
    op.create_table(
        "decided_batches",
        sa.Column("batch_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("last_hour", sa.String(13), nullable=False),
        sa.PrimaryKeyConstraint("batch_id"),
    )
    op.create_table(
        "decided_imports",
        sa.Column("source", sa.String(1024), nullable=False),
        sa.Column("imported_ms", sa.BigInteger(), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("source"),
    )


def downgrade() -> None:
    op.drop_table("decided_imports")
    op.drop_table("decided_batches")
    op.drop_index("ix_decided_batch", table_name="decided")
    op.drop_table("decided")
