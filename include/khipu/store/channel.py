"""The trace channel's own health: malformed trace records (quarantine), back-pointers, and the gaps in each
emitter's sequence numbers (traces the emitter lost).

Which gaps a batch of sequence numbers opens, shrinks or splits is the domain's to say
(:mod:`khipu.detector.gaps`); this repository loads what it needs and applies what it says.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import delete, func, insert, select

from khipu.store import schema
from khipu.store.engine import ROWS_PER_STATEMENT, StoreEngine, insert_many_ignoring_duplicates, update_many


@dataclass(frozen=True, slots=True)
class StoredProgress:
    """An emitter's row of ``emitter_progress``: numbers up to ``base_seq`` folded, the runs seen above it."""

    location: str
    max_seq: int
    base_seq: int
    base_ms: int | None
    runs: tuple[tuple[int, int, int, int], ...]  # (first_seq, first_ms, last_seq, last_ms), oldest first
    updated_ms: int


@dataclass(frozen=True, slots=True)
class StoredGap:
    location: str
    from_seq: int  # first missing number
    to_seq: int  # first number after the gap
    after_ms: int
    before_ms: int
    noticed_ms: int


@dataclass(frozen=True, slots=True)
class StoredEmitter:
    emitter_id: str
    progress: StoredProgress | None  # None: never seen
    gaps: dict[int, StoredGap]  # by row id: those a batch can touch (see record_sequences)


class RunLike(Protocol):
    @property
    def first_seq(self) -> int: ...
    @property
    def first_ms(self) -> int: ...
    @property
    def last_seq(self) -> int: ...
    @property
    def last_ms(self) -> int: ...


class HistoryLike(Protocol):
    """An emitter's history to store (e.g. ``khipu.detector.sequences.EmitterHistory``)."""

    @property
    def max_seq(self) -> int: ...
    @property
    def base_seq(self) -> int: ...
    @property
    def base_ms(self) -> int | None: ...
    @property
    def runs(self) -> Sequence[RunLike]: ...


class GapLike(Protocol):
    @property
    def location(self) -> str: ...
    @property
    def from_seq(self) -> int: ...
    @property
    def to_seq(self) -> int: ...
    @property
    def after_ms(self) -> int: ...
    @property
    def before_ms(self) -> int: ...
    @property
    def noticed_ms(self) -> int: ...


class SequenceUpdateLike(Protocol):
    """What to write for one emitter after a batch (e.g. ``khipu.detector.gaps.EmitterUpdate``)."""

    @property
    def emitter_id(self) -> str: ...
    @property
    def location(self) -> str: ...
    @property
    def history(self) -> HistoryLike | None: ...  # None: leave the stored progress as it is
    @property
    def deleted(self) -> Collection[int]: ...  # gap ids
    @property
    def updated(self) -> Mapping[int, GapLike]: ...  # new values of gaps, by id
    @property
    def inserted(self) -> Sequence[GapLike]: ...
    @property
    def updated_ms(self) -> int: ...


class TraceChannelRepository:
    """``store.channel``: quarantine, back-pointers, emitter sequence progress and trace gaps."""

    def __init__(self, engine: StoreEngine) -> None:
        self._engine = engine

    def add_quarantine(self, rows: Sequence[Mapping[str, Any]], at_ms: int) -> int:
        """Record malformed trace records (once each, by their position on the trace topic: topic, partition, offset
        and ``source_line``, the line of a batch record; a row without one is a record of one trace, line 0)."""
        values = [
            dict(
                source_topic=row["source_topic"],
                source_partition=row["source_partition"],
                source_offset=row["source_offset"],
                source_line=row.get("source_line", 0),
                reason=row["quarantine_reason"],
                raw_value=row["raw_value"],
                kafka_timestamp_ms=row.get("kafka_timestamp_ms"),
                quarantined_ms=at_ms,
            )
            for row in rows
        ]
        with self._engine.begin() as tx:
            return insert_many_ignoring_duplicates(tx, schema.quarantine, values)

    def quarantined(self) -> list[dict[str, Any]]:
        table = schema.quarantine
        with self._engine.begin() as tx:
            return [
                dict(r._mapping)
                for r in tx.execute(
                    select(table).order_by(table.c.source_partition, table.c.source_offset, table.c.source_line)
                )
            ]

    def quarantine_page(self, limit: int = 50) -> tuple[int, list[dict[str, Any]]]:
        """How many records are quarantined in all, and the newest ``limit`` of them (without their bytes)."""
        table = schema.quarantine
        columns = [c for c in table.c if c.name != "raw_value"]
        with self._engine.begin() as tx:
            total = int(tx.execute(select(func.count()).select_from(table)).scalar() or 0)
            rows = tx.execute(select(*columns).order_by(table.c.quarantined_ms.desc(), table.c.id.desc()).limit(limit))
            return total, [dict(row._mapping) for row in rows]

    def gap_summary(self) -> list[dict[str, Any]]:
        """Per emitter: its location, how many gaps are open and how many sequence numbers they miss."""
        table = schema.trace_gaps
        query = (
            select(
                table.c.emitter_id,
                table.c.location,
                func.count().label("gaps"),
                func.sum(table.c.to_seq - table.c.from_seq).label("missing"),
                func.max(table.c.noticed_ms).label("last_noticed_ms"),
            )
            .group_by(table.c.emitter_id, table.c.location)
            .order_by(table.c.location, table.c.emitter_id)
        )
        with self._engine.begin() as tx:
            return [  # SUM is a Decimal on PostgreSQL: counts come back as ints on every database
                {**row._mapping, "gaps": int(row.gaps), "missing": int(row.missing or 0)} for row in tx.execute(query)
            ]

    def record_sequences(
        self,
        lowest_seen: Mapping[str, int],
        plan: Callable[[Mapping[str, StoredEmitter]], Sequence[SequenceUpdateLike]],
    ) -> None:
        """Load what is stored of each emitter of a batch, let ``plan`` say what changes, apply it: one
        transaction, so a batch's numbers and gaps are stored together or not at all.

        ``lowest_seen``: each emitter's lowest sequence number in the batch. Of its gaps, those ending
        above that number or above its base are loaded: every gap the batch can fill or recompute.
        ``plan`` (the domain's, :func:`khipu.detector.gaps.plan_sequence_updates`) gets them by emitter id.
        """
        progress, gaps = schema.emitter_progress, schema.trace_gaps
        emitters = sorted(lowest_seen)
        with self._engine.begin() as tx:
            rows: dict[str, Any] = {}
            for start in range(0, len(emitters), ROWS_PER_STATEMENT):
                chunk = emitters[start : start + ROWS_PER_STATEMENT]
                rows.update(
                    (row.emitter_id, row)
                    for row in tx.execute(select(progress).where(progress.c.emitter_id.in_(chunk)))
                )
            # of each emitter's gaps, those ending above its lowest number in the batch or above its base
            above = {e: min(int(lowest_seen[e]), -1 if e not in rows else int(rows[e].base_seq)) for e in emitters}
            loaded: dict[str, dict[int, StoredGap]] = {e: {} for e in emitters}
            for start in range(0, len(emitters), ROWS_PER_STATEMENT):
                chunk = emitters[start : start + ROWS_PER_STATEMENT]
                floor = min(above[e] for e in chunk)
                query = select(gaps).where(gaps.c.emitter_id.in_(chunk), gaps.c.to_seq > floor)
                for g in tx.execute(query):
                    if int(g.to_seq) > above[g.emitter_id]:
                        loaded[g.emitter_id][int(g.id)] = _gap(g)
            stored = {e: StoredEmitter(e, None if e not in rows else _progress(rows[e]), loaded[e]) for e in emitters}
            changes = sorted(plan(stored), key=lambda change: change.emitter_id)
            deleted = sorted(gap_id for change in changes for gap_id in change.deleted)
            for start in range(0, len(deleted), ROWS_PER_STATEMENT):
                tx.execute(delete(gaps).where(gaps.c.id.in_(deleted[start : start + ROWS_PER_STATEMENT])))
            updated = [{"id": gap_id, **_gap_values(gap)} for c in changes for gap_id, gap in sorted(c.updated.items())]
            update_many(tx, gaps, updated, ("id",))
            inserted = [{"emitter_id": c.emitter_id, **_gap_values(gap)} for c in changes for gap in c.inserted]
            if inserted:
                tx.execute(insert(gaps), inserted)
            histories: list[dict[str, Any]] = []
            for change in changes:
                history = change.history
                if history is None:
                    continue
                histories.append(
                    dict(
                        emitter_id=change.emitter_id,
                        location=change.location,
                        max_seq=history.max_seq,
                        base_seq=history.base_seq,
                        base_ms=history.base_ms,
                        runs=json.dumps([[r.first_seq, r.first_ms, r.last_seq, r.last_ms] for r in history.runs]),
                        updated_ms=change.updated_ms,
                    )
                )
            kept = {e for e, emitter in stored.items() if emitter.progress is not None}
            update_many(tx, progress, [h for h in histories if h["emitter_id"] in kept], ("emitter_id",))
            new = [h for h in histories if h["emitter_id"] not in kept]
            if new:
                tx.execute(insert(progress), new)

    def emitters_with_runs(self) -> list[str]:
        """Emitters whose numbers above their base are more than one run (a gap between them, stored or not
        settled yet): the sequence tracker looks at them again after a restart."""
        progress = schema.emitter_progress
        with self._engine.begin() as tx:
            rows = tx.execute(select(progress.c.emitter_id).where(progress.c.runs.like("%],[%")))
            return sorted(str(row.emitter_id) for row in rows)

    def record_pointers(self, pointers: Iterable[tuple[str, str, str, int, int]], seen_ms: int) -> int:
        """Keep positions an emitter says it received: (location, cluster, topic, partition, offset).

        They come from back-pointers (:attr:`khipu.trace.model.Trace.prev_offset`) and emitter
        marks whose own trace was not in the same batch. A position stored twice keeps its first
        time. Returns how many were new.
        """
        rows = [
            dict(location=location, cluster=cluster, topic=topic, partition=partition, offset=offset, seen_ms=seen_ms)
            for location, cluster, topic, partition, offset in sorted(
                {(str(loc), str(c), str(t), int(p), int(o)) for loc, c, t, p, o in pointers}
            )
        ]
        with self._engine.begin() as tx:
            return insert_many_ignoring_duplicates(tx, schema.trace_pointers, rows)

    def pointed_at(self, location: str, cluster: str, topic: str, partition: int, offset: int) -> bool:
        """Whether an emitter of the location said it received the record at this position."""
        t = schema.trace_pointers
        with self._engine.begin() as tx:
            found = tx.execute(
                select(t.c.offset).where(
                    t.c.location == location,
                    t.c.cluster == cluster,
                    t.c.topic == topic,
                    t.c.partition == partition,
                    t.c.offset == offset,
                )
            ).first()
        return found is not None

    def prune_pointers(self, before_ms: int) -> int:
        """Drop pointers first seen before ``before_ms`` (the messages they could explain are decided)."""
        t = schema.trace_pointers
        with self._engine.begin() as tx:
            return int(tx.execute(delete(t).where(t.c.seen_ms < before_ms)).rowcount or 0)

    def prune_quarantine(self, before_ms: int, *, dry_run: bool = False) -> int:
        """Drop records quarantined before ``before_ms``; returns how many (a dry run counts, keeps them)."""
        t = schema.quarantine
        with self._engine.begin(commit=not dry_run) as tx:
            return int(tx.execute(delete(t).where(t.c.quarantined_ms < before_ms)).rowcount or 0)

    def prune_gaps(self, before_ms: int, *, dry_run: bool = False) -> int:
        """Drop emitter sequence gaps whose later trace came before ``before_ms`` (what they could explain is no
        longer archived); returns how many (a dry run counts, keeps them)."""
        t = schema.trace_gaps
        with self._engine.begin(commit=not dry_run) as tx:
            return int(tx.execute(delete(t).where(t.c.before_ms < before_ms)).rowcount or 0)

    def trace_gaps(self, location: str) -> list[tuple[int, int]]:
        """Unfilled gaps of a location's emitters: (first missing number, first number after)."""
        gaps = schema.trace_gaps
        with self._engine.begin() as tx:
            rows = tx.execute(
                select(gaps.c.from_seq, gaps.c.to_seq)
                .where(gaps.c.location == location)
                .order_by(gaps.c.emitter_id, gaps.c.from_seq)
            )
            return [(int(r.from_seq), int(r.to_seq)) for r in rows]


def _progress(row: Any) -> StoredProgress:
    return StoredProgress(
        location=row.location,
        max_seq=int(row.max_seq),
        base_seq=int(row.base_seq),
        base_ms=None if row.base_ms is None else int(row.base_ms),
        runs=tuple((int(a), int(b), int(c), int(d)) for a, b, c, d in json.loads(row.runs)),
        updated_ms=int(row.updated_ms),
    )


def _gap(row: Any) -> StoredGap:
    return StoredGap(
        row.location, int(row.from_seq), int(row.to_seq), int(row.after_ms), int(row.before_ms), int(row.noticed_ms)
    )


def _gap_values(gap: GapLike) -> dict[str, Any]:
    return dict(
        location=gap.location,
        from_seq=gap.from_seq,
        to_seq=gap.to_seq,
        after_ms=gap.after_ms,
        before_ms=gap.before_ms,
        noticed_ms=gap.noticed_ms,
    )
