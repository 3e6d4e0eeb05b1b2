"""verdicts: first seen, decided by, evidence kind, late evidence, announced; verdict history; final-verdict metrics

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 17:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("verdicts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("first_seen_ms", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("decided_by", sa.String(16), nullable=False, server_default="detector"))
        batch_op.add_column(sa.Column("evidence_kind", sa.String(16), nullable=True))
        batch_op.add_column(sa.Column("late_evidence", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.add_column(sa.Column("announced_ms", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("verdict_metrics", schema=None) as batch_op:
        batch_op.add_column(sa.Column("confirmed_lost", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("retracted", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("false_loss_rate", sa.Float(), nullable=True))
    op.create_table(
        "verdict_history",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("message_id", sa.String(256), nullable=False),
        sa.Column("hop", sa.String(520), nullable=False),
        sa.Column("stream", sa.String(249), nullable=False),
        sa.Column("at_ms", sa.BigInteger(), nullable=False),
        sa.Column("from_verdict", sa.String(16), nullable=True),
        sa.Column("to_verdict", sa.String(16), nullable=False),
        sa.Column("cause", sa.String(32), nullable=True),
        sa.Column("decided_by", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
    )
    op.create_index("ix_verdict_history_message", "verdict_history", ["message_id", "hop", "at_ms"])


def downgrade() -> None:
    op.drop_index("ix_verdict_history_message", table_name="verdict_history")
    op.drop_table("verdict_history")
    with op.batch_alter_table("verdict_metrics", schema=None) as batch_op:
        batch_op.drop_column("false_loss_rate")
        batch_op.drop_column("retracted")
        batch_op.drop_column("confirmed_lost")
    with op.batch_alter_table("verdicts", schema=None) as batch_op:
        batch_op.drop_column("announced_ms")
        batch_op.drop_column("late_evidence")
        batch_op.drop_column("evidence_kind")
        batch_op.drop_column("decided_by")
        batch_op.drop_column("first_seen_ms")
