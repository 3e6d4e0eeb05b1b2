"""resend ledger: which run holds an open attempt, and until when (two runs never work on one attempt)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 22:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("resend_ledger") as batch:
        batch.add_column(sa.Column("claimed_by", sa.String(64), nullable=True))
        batch.add_column(sa.Column("claimed_until_ms", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("resend_ledger") as batch:
        batch.drop_column("claimed_until_ms")
        batch.drop_column("claimed_by")
