"""The detector's verdicts, one row per (message id, hop), and the per-minute metrics of each stream and hop.

The metrics are computed in the domain (:mod:`khipu.verdicts.metrics`) from the outcomes read here
and handed back to be stored.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import Connection, case, func, insert, select, tuple_, update

from khipu.store import schema
from khipu.store.engine import StoreEngine, insert_of, upsert

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
    "first_seen_ms",
    "decided_by",
    "evidence_kind",
    "late_evidence",
)
CHUNK = 500  # ids per IN (...) query


@dataclass(frozen=True, slots=True)
class VerdictOutcome:
    """What a stored verdict says, as the metrics read it."""

    verdict: str  # the value of a khipu.detector.model.VerdictKind
    latency_ms: int | None


class MetricsLike(Protocol):
    """One (stream, hop, minute) row of metrics (e.g. ``khipu.verdicts.metrics.MinuteMetrics``)."""

    @property
    def stream(self) -> str: ...
    @property
    def hop(self) -> str: ...
    @property
    def minute_ms(self) -> int: ...
    @property
    def delivered(self) -> int: ...
    @property
    def lost(self) -> int: ...
    @property
    def duplicate(self) -> int: ...
    @property
    def trace_lost(self) -> int: ...
    @property
    def pending(self) -> int: ...
    @property
    def confirmed_lost(self) -> int: ...
    @property
    def retracted(self) -> int: ...
    @property
    def false_loss_rate(self) -> float | None: ...
    @property
    def loss_rate(self) -> float: ...
    @property
    def duplicate_rate(self) -> float: ...
    @property
    def latency_p50_ms(self) -> int | None: ...
    @property
    def latency_p95_ms(self) -> int | None: ...
    @property
    def latency_p99_ms(self) -> int | None: ...


class VerdictRepository:
    """``store.verdicts``: verdicts and their metrics."""

    def __init__(self, engine: StoreEngine) -> None:
        self._engine = engine

    def upsert(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Insert or replace verdicts by (message id, hop): a replayed batch never stores one twice."""
        with self._engine.begin() as tx:
            _upsert_verdicts(tx, rows)

    def store_changes(
        self,
        rows: Sequence[Mapping[str, Any]],
        guards: Sequence[Mapping[str, Any] | None],
        history: Sequence[Mapping[str, Any] | None],
    ) -> set[tuple[str, str]]:
        """Changed verdicts (rows as :meth:`upsert` takes them) with their history entries, in one transaction,
        each only if its stored row is still what the change was decided against: ``guards[i]`` holds the
        ``verdict``, ``decided_ms`` and ``late_evidence`` the row must still have (None: no row may exist
        yet). Returns the (message id, hop) keys not applied because the row changed meanwhile (another
        writer, e.g. reconciliation beside the detector); their history is not written."""
        table = schema.verdicts
        conflicts: set[tuple[str, str]] = set()
        inserts = [(row, entry) for row, guard, entry in zip(rows, guards, history, strict=True) if guard is None]
        updates = [(row, guard, entry) for row, guard, entry in zip(rows, guards, history, strict=True) if guard]
        with self._engine.begin() as tx:
            for start in range(0, len(inserts), CHUNK):
                chunk = [_verdict_values(row) for row, _ in inserts[start : start + CHUNK]]
                statement = insert_of(tx)(table).values(chunk).on_conflict_do_nothing()
                added = {
                    (r.message_id, r.hop) for r in tx.execute(statement.returning(table.c.message_id, table.c.hop))
                }
                conflicts.update((v["message_id"], v["hop"]) for v in chunk if (v["message_id"], v["hop"]) not in added)
            for row, guard, _ in updates:
                values = _verdict_values(row)
                done = tx.execute(
                    update(table)
                    .where(
                        table.c.message_id == values["message_id"],
                        table.c.hop == values["hop"],
                        table.c.verdict == guard["verdict"],
                        table.c.decided_ms == guard["decided_ms"],
                        table.c.late_evidence.is_(bool(guard["late_evidence"])),
                    )
                    .values({k: v for k, v in values.items() if k not in ("message_id", "hop")})
                )
                if not done.rowcount:
                    conflicts.add((values["message_id"], values["hop"]))
            entries = [
                dict(entry)
                for row, entry in zip(rows, history, strict=True)
                if entry is not None and (row["message_id"], row["hop"]) not in conflicts
            ]
            if entries:
                tx.execute(insert(schema.verdict_history), entries)
        return conflicts

    def unannounced_confirmed(self, limit: int = 1000) -> list[dict[str, Any]]:
        """CONFIRMED_LOST verdicts not yet announced (the confirmed-losses Asset), oldest first."""
        table = schema.verdicts
        query = (
            select(table)
            .where(table.c.verdict == "CONFIRMED_LOST", table.c.announced_ms.is_(None))
            .order_by(table.c.decided_ms, table.c.message_id)
            .limit(limit)
        )
        with self._engine.begin() as tx:
            return [dict(row._mapping) for row in tx.execute(query)]

    def mark_announced(self, keys: Collection[tuple[str, str]], at_ms: int) -> None:
        table = schema.verdicts
        with self._engine.begin() as tx:
            for message_id, hop in sorted(keys):
                tx.execute(
                    update(table).where(table.c.message_id == message_id, table.c.hop == hop).values(announced_ms=at_ms)
                )

    def read_messages(self, message_ids: Collection[str]) -> list[dict[str, Any]]:
        """Every stored verdict of these messages: their columns."""
        table, ids = schema.verdicts, sorted(set(message_ids))
        found: list[dict[str, Any]] = []
        with self._engine.begin() as tx:
            for start in range(0, len(ids), CHUNK):
                query = select(table).where(table.c.message_id.in_(ids[start : start + CHUNK]))
                found.extend(dict(row._mapping) for row in tx.execute(query))
        return found

    def settled_messages(self, message_ids: Collection[str], unsettled_verdicts: Collection[str]) -> set[str]:
        """Of these, the messages with stored verdicts none of which is one of ``unsettled_verdicts`` or
        carries late evidence."""
        table, ids = schema.verdicts, sorted(set(message_ids))
        open_rows = func.sum(
            case((table.c.verdict.in_(sorted(unsettled_verdicts)) | table.c.late_evidence.is_(True), 1), else_=0)
        )
        settled: set[str] = set()
        with self._engine.begin() as tx:
            for start in range(0, len(ids), CHUNK):
                query = (
                    select(table.c.message_id)
                    .where(table.c.message_id.in_(ids[start : start + CHUNK]))
                    .group_by(table.c.message_id)
                    .having(open_rows == 0)
                )
                settled.update(row.message_id for row in tx.execute(query))
        return settled

    def cause_counts(self, since_ms: int, verdicts: Collection[str]) -> dict[tuple[str, str], dict[str, int]]:
        """Per (stream, hop), how many verdicts of these kinds decided since ``since_ms`` had each cause."""
        table = schema.verdicts
        query = (
            select(table.c.stream, table.c.hop, table.c.cause, func.count())
            .where(table.c.decided_ms >= since_ms, table.c.verdict.in_(sorted(verdicts)))
            .group_by(table.c.stream, table.c.hop, table.c.cause)
        )
        found: dict[tuple[str, str], dict[str, int]] = {}
        with self._engine.begin() as tx:
            for stream, hop, cause, count in tx.execute(query):
                found.setdefault((stream, hop), {})[cause or "unknown"] = int(count)
        return found

    def history(self, message_id: str) -> list[dict[str, Any]]:
        """How the message's verdicts changed, oldest first."""
        table = schema.verdict_history
        query = select(table).where(table.c.message_id == message_id).order_by(table.c.at_ms, table.c.id)
        with self._engine.begin() as tx:
            return [dict(row._mapping) for row in tx.execute(query)]

    def histories(self, message_ids: Collection[str]) -> dict[str, list[dict[str, Any]]]:
        """How each of these messages' verdicts changed, oldest first (messages without history: absent)."""
        table, ids = schema.verdict_history, sorted(set(message_ids))
        found: dict[str, list[dict[str, Any]]] = {}
        with self._engine.begin() as tx:
            for start in range(0, len(ids), CHUNK):
                query = (
                    select(table)
                    .where(table.c.message_id.in_(ids[start : start + CHUNK]))
                    .order_by(table.c.at_ms, table.c.id)
                )
                for row in tx.execute(query):
                    found.setdefault(row.message_id, []).append(dict(row._mapping))
        return found

    def read_outcomes(
        self, spans: Iterable[tuple[str, str, int, int]]
    ) -> dict[tuple[str, str, int, int], list[VerdictOutcome]]:
        """Per (stream, hop, from_ms, to_ms): the verdict and latency of each verdict of that stream's hop
        decided in [from_ms, to_ms) (what a minute's metrics are computed from)."""
        table = schema.verdicts
        found: dict[tuple[str, str, int, int], list[VerdictOutcome]] = {}
        with self._engine.begin() as tx:
            for span in dict.fromkeys(spans):
                stream, hop, from_ms, to_ms = span
                rows = tx.execute(
                    select(table.c.verdict, table.c.latency_ms).where(
                        table.c.stream == stream,
                        table.c.hop == hop,
                        table.c.decided_ms >= from_ms,
                        table.c.decided_ms < to_ms,
                    )
                )
                found[span] = [
                    VerdictOutcome(r.verdict, None if r.latency_ms is None else int(r.latency_ms)) for r in rows
                ]
        return found

    def upsert_metrics(self, metrics: Sequence[MetricsLike]) -> None:
        """Insert or replace metric rows by (stream, hop, minute), all in one transaction (idempotent)."""
        if not metrics:
            return
        rows = [
            dict(
                stream=m.stream,
                hop=m.hop,
                minute_ms=m.minute_ms,
                delivered=m.delivered,
                lost=m.lost,
                duplicate=m.duplicate,
                trace_lost=m.trace_lost,
                pending=m.pending,
                confirmed_lost=m.confirmed_lost,
                retracted=m.retracted,
                false_loss_rate=m.false_loss_rate,
                loss_rate=m.loss_rate,
                duplicate_rate=m.duplicate_rate,
                latency_p50_ms=m.latency_p50_ms,
                latency_p95_ms=m.latency_p95_ms,
                latency_p99_ms=m.latency_p99_ms,
            )
            for m in metrics
        ]
        with self._engine.begin() as tx:
            upsert(tx, schema.verdict_metrics, rows, key=("stream", "hop", "minute_ms"))

    def rows(self) -> list[dict[str, Any]]:
        """Every stored verdict (tests, small stores)."""
        return self.read()

    def read(self, stream: str | None = None, since_ms: int = 0) -> list[dict[str, Any]]:
        """Verdicts decided since ``since_ms`` (of one stream, when given), oldest first: their columns."""
        table = schema.verdicts
        query = select(table).where(table.c.decided_ms >= since_ms)
        if stream is not None:
            query = query.where(table.c.stream == stream)
        with self._engine.begin() as tx:
            return [dict(row._mapping) for row in tx.execute(query.order_by(table.c.decided_ms, table.c.message_id))]

    def page(
        self,
        *,
        verdicts: Collection[str] = (),
        stream: str | None = None,
        hop: str | None = None,
        cause: str | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
        late_evidence: bool | None = None,
        before: tuple[int, str, str] | None = None,
        limit: int = 50,
    ) -> list[dict[str, Any]]:
        """One page of verdicts, newest decision first, filtered; ``before`` is the (decided_ms, message id,
        hop) of the last row of the previous page (keyset paging: as fast on page 1,000 as on page 1)."""
        table = schema.verdicts
        query = select(table)
        if verdicts:
            query = query.where(table.c.verdict.in_(sorted(verdicts)))
        for column, value in ((table.c.stream, stream), (table.c.hop, hop), (table.c.cause, cause)):
            if value is not None:
                query = query.where(column == value)
        if since_ms is not None:
            query = query.where(table.c.decided_ms >= since_ms)
        if until_ms is not None:
            query = query.where(table.c.decided_ms < until_ms)
        if late_evidence is not None:
            query = query.where(table.c.late_evidence.is_(late_evidence))
        if before is not None:
            query = query.where(tuple_(table.c.decided_ms, table.c.message_id, table.c.hop) < tuple_(*before))
        query = query.order_by(table.c.decided_ms.desc(), table.c.message_id.desc(), table.c.hop.desc()).limit(limit)
        with self._engine.begin() as tx:
            return [dict(row._mapping) for row in tx.execute(query)]

    def kind_counts(self, since_ms: int) -> dict[tuple[str, str, str, str], int]:
        """(stream, hop, verdict, cause or "") -> how many verdicts decided since ``since_ms`` say so."""
        table = schema.verdicts
        query = (
            select(table.c.stream, table.c.hop, table.c.verdict, table.c.cause, func.count())
            .where(table.c.decided_ms >= since_ms)
            .group_by(table.c.stream, table.c.hop, table.c.verdict, table.c.cause)
        )
        with self._engine.begin() as tx:
            return {(s, h, v, c or ""): int(n) for s, h, v, c, n in tx.execute(query)}

    def latency_counts(
        self, since_ms: int, bounds_ms: Sequence[int]
    ) -> dict[tuple[str, str], tuple[list[int], int, int]]:
        """Per (stream, hop), of the latencies of verdicts decided since ``since_ms``: how many are <= each
        bound (cumulative, as a histogram's buckets), how many in all and their sum in ms."""
        table = schema.verdicts
        latency = table.c.latency_ms
        columns = [func.sum(case((latency <= bound, 1), else_=0)) for bound in bounds_ms]
        query = (
            select(table.c.stream, table.c.hop, func.count(latency), func.coalesce(func.sum(latency), 0), *columns)
            .where(table.c.decided_ms >= since_ms, latency.is_not(None))
            .group_by(table.c.stream, table.c.hop)
        )
        with self._engine.begin() as tx:
            return {
                (row[0], row[1]): ([int(n or 0) for n in row[4:]], int(row[2]), int(row[3]))
                for row in tx.execute(query)
            }

    def read_metrics(self, stream: str | None = None, since_ms: int = 0) -> list[dict[str, Any]]:
        """Metric rows of the minutes since ``since_ms`` (of one stream, when given), oldest first."""
        table = schema.verdict_metrics
        query = select(table).where(table.c.minute_ms >= since_ms)
        if stream is not None:
            query = query.where(table.c.stream == stream)
        with self._engine.begin() as tx:
            return [dict(row._mapping) for row in tx.execute(query.order_by(table.c.minute_ms, table.c.hop))]


def _verdict_values(r: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "message_id": r["message_id"],
        "hop": r["hop"],
        "group_id": r.get("group"),
        **{c: r.get(c) for c in VERDICT_COLUMNS if c != "group_id"},
        "decided_by": r.get("decided_by") or "detector",
        "late_evidence": bool(r.get("late_evidence")),
    }


def _upsert_verdicts(tx: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    values = [_verdict_values(r) for r in rows]
    if values:
        upsert(tx, schema.verdicts, values, key=("message_id", "hop"))
