"""indexes for the Khipu view, the API and the exporter: verdicts, metrics, alerts and quarantine by time

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 19:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_verdicts_time", "verdicts", ["decided_ms"])
    op.create_index("ix_verdict_metrics_time", "verdict_metrics", ["minute_ms"])
    op.create_index("ix_alerts_time", "alerts", ["at_ms"])
    op.create_index("ix_quarantine_time", "quarantine", ["quarantined_ms"])


def downgrade() -> None:
    op.drop_index("ix_quarantine_time", table_name="quarantine")
    op.drop_index("ix_alerts_time", table_name="alerts")
    op.drop_index("ix_verdict_metrics_time", table_name="verdict_metrics")
    op.drop_index("ix_verdicts_time", table_name="verdicts")
