"""quarantine: the line of a batch record; a trace-topic position is (topic, partition, offset, line)

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

RECORD = ("source_topic", "source_partition", "source_offset")


def upgrade() -> None:
    # every row stored before was a record of one trace: its line 0
    with op.batch_alter_table("quarantine") as batch:
        batch.add_column(sa.Column("source_line", sa.Integer(), nullable=False, server_default="0"))
        batch.drop_constraint("uq_quarantine_record", type_="unique")
        batch.create_unique_constraint("uq_quarantine_record", [*RECORD, "source_line"])


def downgrade() -> None:
    # one row per record again: of a batch record's malformed lines, the row stored first stays
    quarantine = sa.table("quarantine", sa.column("id"), *(sa.column(name) for name in (*RECORD, "source_line")))
    first = sa.select(sa.func.min(quarantine.c.id)).group_by(*(quarantine.c[name] for name in RECORD))
    op.execute(quarantine.delete().where(quarantine.c.id.not_in(first)))
    with op.batch_alter_table("quarantine") as batch:
        batch.drop_constraint("uq_quarantine_record", type_="unique")
        batch.create_unique_constraint("uq_quarantine_record", list(RECORD))
        batch.drop_column("source_line")
