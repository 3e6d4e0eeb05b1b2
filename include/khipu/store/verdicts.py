"""The detector's verdicts, one row per (message id, hop), and the per-minute metrics of each stream and hop."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import select

from khipu.store import schema
from khipu.store.engine import StoreEngine, upsert

VERDICT_COLUMNS = (
    "stream",
    "hop_kind",
    "verdict",
    "cause",
    "count",
    "topic",
    "partition",
    "offset",
    "group_id",
    "location",
    "observed_ms",
    "latency_ms",
    "e2e_latency_ms",
    "decided_ms",
    "detail",
)
MINUTE_MS = 60_000


class VerdictRepository:
    """``store.verdicts``: verdicts and their metrics."""

    def __init__(self, engine: StoreEngine) -> None:
        self._engine = engine

    def upsert(self, rows: Sequence[Mapping[str, Any]]) -> set[tuple[str, str, int]]:
        """Insert or replace verdicts by (message id, hop): a replayed batch never stores one twice.

        Returns the (stream, hop, minute) metric keys the rows touch.
        """
        if not rows:
            return set()
        values = [
            {
                "message_id": r["message_id"],
                "hop": r["hop"],
                "group_id": r.get("group"),
                **{c: r.get(c) for c in VERDICT_COLUMNS if c != "group_id"},
            }
            for r in rows
        ]
        with self._engine.begin() as tx:
            upsert(tx, schema.verdicts, values, key=("message_id", "hop"))
        return {(r["stream"], r["hop"], int(r["decided_ms"]) // MINUTE_MS * MINUTE_MS) for r in rows}

    def refresh_metrics(self, keys: Iterable[tuple[str, str, int]]) -> None:
        """Recompute the given (stream, hop, minute) metrics from the stored verdicts (idempotent)."""
        table, metrics = schema.verdicts, schema.verdict_metrics
        with self._engine.begin() as tx:
            for stream, hop, minute in sorted(set(keys)):
                rows = tx.execute(
                    select(table.c.verdict, table.c.latency_ms).where(
                        table.c.stream == stream,
                        table.c.hop == hop,
                        table.c.decided_ms >= minute,
                        table.c.decided_ms < minute + MINUTE_MS,
                    )
                ).all()
                counts = {
                    kind: sum(1 for r in rows if r.verdict == kind)
                    for kind in ("DELIVERED", "LOST", "DUPLICATE", "TRACE_LOST", "PENDING")
                }
                judged = sum(counts.values()) or 1
                latencies = [int(r.latency_ms) for r in rows if r.latency_ms is not None]
                values = dict(
                    stream=stream,
                    hop=hop,
                    minute_ms=minute,
                    delivered=counts["DELIVERED"],
                    lost=counts["LOST"],
                    duplicate=counts["DUPLICATE"],
                    trace_lost=counts["TRACE_LOST"],
                    pending=counts["PENDING"],
                    loss_rate=counts["LOST"] / judged,
                    duplicate_rate=counts["DUPLICATE"] / judged,
                    latency_p50_ms=_percentile(latencies, 0.50),
                    latency_p95_ms=_percentile(latencies, 0.95),
                    latency_p99_ms=_percentile(latencies, 0.99),
                )
                upsert(tx, metrics, [values], key=("stream", "hop", "minute_ms"))

    def read(self, stream: str | None = None, since_ms: int = 0) -> list[dict[str, Any]]:
        """Verdicts decided since ``since_ms`` (of one stream, when given), oldest first: their columns."""
        table = schema.verdicts
        query = select(table).where(table.c.decided_ms >= since_ms)
        if stream is not None:
            query = query.where(table.c.stream == stream)
        with self._engine.begin() as tx:
            return [dict(row._mapping) for row in tx.execute(query.order_by(table.c.decided_ms, table.c.message_id))]

    def read_metrics(self, stream: str | None = None, since_ms: int = 0) -> list[dict[str, Any]]:
        """Metric rows of the minutes since ``since_ms`` (of one stream, when given), oldest first."""
        table = schema.verdict_metrics
        query = select(table).where(table.c.minute_ms >= since_ms)
        if stream is not None:
            query = query.where(table.c.stream == stream)
        with self._engine.begin() as tx:
            return [dict(row._mapping) for row in tx.execute(query.order_by(table.c.minute_ms, table.c.hop))]


def _percentile(values: list[int], fraction: float) -> int | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]
