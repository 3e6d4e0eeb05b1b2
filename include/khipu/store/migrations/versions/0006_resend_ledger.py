"""resend ledger: one row per attempt at resending a confirmed loss

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 20:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "resend_ledger",
        sa.Column("resend_id", sa.String(64), primary_key=True),
        sa.Column("message_id", sa.String(256), nullable=False),
        sa.Column("hop", sa.String(520), nullable=False),
        sa.Column("stream", sa.String(249), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("source_kind", sa.String(8), nullable=False),
        sa.Column("source_position", sa.String(249), nullable=True),
        sa.Column("destination", sa.String(249), nullable=True),
        sa.Column("target_group", sa.String(249), nullable=True),
        sa.Column("destination_partition", sa.Integer(), nullable=True),
        sa.Column("scan_from_offset", sa.BigInteger(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("intended_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
        sa.Column("produced_partition", sa.Integer(), nullable=True),
        sa.Column("produced_offset", sa.BigInteger(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.UniqueConstraint("message_id", "hop", "attempt", name="uq_resend_attempt"),
    )
    op.create_index("ix_resend_ledger_state", "resend_ledger", ["state", "updated_ms"])


def downgrade() -> None:
    op.drop_index("ix_resend_ledger_state", table_name="resend_ledger")
    op.drop_table("resend_ledger")
