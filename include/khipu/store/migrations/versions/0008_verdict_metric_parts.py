"""verdict metrics as the sum of parts each writer replaces: verdict_metric_parts, and latency histograms

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24 10:00:00

Every minute already stored becomes one part, ``migration:0008``: the counts its ``verdict_metrics`` row
holds, and the histogram of the latencies of its stored verdicts (bucketed as
``khipu.verdicts.metrics.latency_bucket`` does, copied here so this migration never changes), which its
``verdict_metrics`` row gets too. Minutes summed from parts later keep what they had.
"""

from __future__ import annotations

import json
from collections import Counter

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

MIGRATED_PART = "migration:0008"
COUNTS = ("delivered", "lost", "duplicate", "trace_lost", "pending", "confirmed_lost", "retracted")


def upgrade() -> None:
    op.create_table(
        "verdict_metric_parts",
        sa.Column("stream", sa.String(249), nullable=False),
        sa.Column("hop", sa.String(520), nullable=False),
        sa.Column("minute_ms", sa.BigInteger(), nullable=False),
        sa.Column("part", sa.String(249), nullable=False),
        *(sa.Column(name, sa.Integer(), nullable=False) for name in COUNTS),
        sa.Column("latency_histogram", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("stream", "hop", "minute_ms", "part"),
    )
    op.create_index("ix_verdict_metric_parts_part", "verdict_metric_parts", ["part"])
    with op.batch_alter_table("verdict_metrics", schema=None) as batch_op:
        batch_op.add_column(sa.Column("latency_histogram", sa.Text(), nullable=True))
    _parts_of_stored_minutes(op.get_bind())


def downgrade() -> None:
    with op.batch_alter_table("verdict_metrics", schema=None) as batch_op:
        batch_op.drop_column("latency_histogram")
    op.drop_index("ix_verdict_metric_parts_part", table_name="verdict_metric_parts")
    op.drop_table("verdict_metric_parts")


def _parts_of_stored_minutes(bind: sa.Connection) -> None:
    latencies = bind.execute(
        sa.text(
            "SELECT stream, hop, (decided_ms / 60000) * 60000, latency_ms, COUNT(*) FROM verdicts "
            "WHERE latency_ms IS NOT NULL GROUP BY stream, hop, (decided_ms / 60000) * 60000, latency_ms"
        )
    )
    histograms: dict[tuple[str, str, int], Counter[int]] = {}
    for stream, hop, minute_ms, latency_ms, count in latencies:
        histograms.setdefault((stream, hop, int(minute_ms)), Counter())[_bucket(int(latency_ms))] += int(count)
    metrics = sa.table(
        "verdict_metrics", *(sa.column(name) for name in ("stream", "hop", "minute_ms", *COUNTS, "latency_histogram"))
    )
    parts = sa.table(
        "verdict_metric_parts",
        *(sa.column(name) for name in ("stream", "hop", "minute_ms", "part", *COUNTS, "latency_histogram")),
    )
    minutes = bind.execute(
        sa.select(metrics.c.stream, metrics.c.hop, metrics.c.minute_ms, *(metrics.c[n] for n in COUNTS))
    )
    rows = []
    for row in minutes:
        histogram = histograms.get((row.stream, row.hop, int(row.minute_ms)), Counter())
        text = json.dumps({str(b): histogram[b] for b in sorted(histogram) if histogram[b]}, separators=(",", ":"))
        rows.append(
            {
                "stream": row.stream,
                "hop": row.hop,
                "minute_ms": int(row.minute_ms),
                "part": MIGRATED_PART,
                **{name: int(getattr(row, name) or 0) for name in COUNTS},
                "latency_histogram": text,
            }
        )
    if not rows:
        return
    bind.execute(sa.insert(parts), rows)
    bind.execute(
        sa.update(metrics)
        .where(
            metrics.c.stream == sa.bindparam("key_stream"),
            metrics.c.hop == sa.bindparam("key_hop"),
            metrics.c.minute_ms == sa.bindparam("key_minute_ms"),
        )
        .values(latency_histogram=sa.bindparam("histogram")),
        [
            {
                "key_stream": r["stream"],
                "key_hop": r["hop"],
                "key_minute_ms": r["minute_ms"],
                "histogram": r["latency_histogram"],
            }
            for r in rows
        ],
    )


def _bucket(ms: int) -> int:
    """khipu.verdicts.metrics.latency_bucket as of this migration: exact within ±1000 ms, three significant
    digits beyond (rounded toward zero)."""
    magnitude, scale = abs(ms), 1
    while magnitude >= 1000 * scale:
        scale *= 10
    bucket = magnitude // scale * scale
    return bucket if ms >= 0 else -bucket
