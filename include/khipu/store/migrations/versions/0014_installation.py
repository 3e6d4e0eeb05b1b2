"""installation: when this Khipu was installed (the store created, or an older store upgraded to this), one row

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06 14:00:00
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    installation = op.create_table(
        "installation",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("installed_ms", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("id = 1", name="ck_installation_one_row"),
    )
    # the time this migration runs: a fresh store's creation (the install), or the upgrade of an older one, from
    # which khipu_reconcile's schedule counts
    op.bulk_insert(installation, [{"id": 1, "installed_ms": int(time.time() * 1000)}])


def downgrade() -> None:
    op.drop_table("installation")
