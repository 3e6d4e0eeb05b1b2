"""The trace channel's own health: malformed trace records (quarantine), back-pointers, and the gaps in each
emitter's sequence numbers (traces the emitter lost)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, delete, insert, select, update

from khipu.detector.sequences import KEEP_RECENT, EmitterHistory, Run, absorb
from khipu.store import schema
from khipu.store.engine import StoreEngine, insert_ignoring_duplicate


class TraceChannelRepository:
    """``store.channel``: quarantine, back-pointers, emitter sequence progress and trace gaps."""

    def __init__(self, engine: StoreEngine) -> None:
        self._engine = engine

    def add_quarantine(self, rows: Sequence[Mapping[str, Any]], at_ms: int) -> int:
        """Record malformed trace records (once each, by their position on the trace topic)."""
        added = 0
        with self._engine.begin() as tx:
            for row in rows:
                added += insert_ignoring_duplicate(
                    tx,
                    schema.quarantine,
                    dict(
                        source_topic=row["source_topic"],
                        source_partition=row["source_partition"],
                        source_offset=row["source_offset"],
                        reason=row["quarantine_reason"],
                        raw_value=row["raw_value"],
                        kafka_timestamp_ms=row.get("kafka_timestamp_ms"),
                        quarantined_ms=at_ms,
                    ),
                )
        return added

    def quarantined(self) -> list[dict[str, Any]]:
        table = schema.quarantine
        with self._engine.begin() as tx:
            return [
                dict(r._mapping)
                for r in tx.execute(select(table).order_by(table.c.source_partition, table.c.source_offset))
            ]

    def record_emitter_sequences(
        self,
        observed: Iterable[tuple[str, str, int, int]],
        now_ms: int,
        keep: int = KEEP_RECENT,
    ) -> int:
        """Track each emitter's sequence numbers; keep its gaps (lost traces); return how many gaps it has now
        that it had not before.

        ``observed``: (emitter id, location, sequence number, trace time) of one batch of traces
        and emitter marks. The gaps above each emitter's base are recomputed from the runs of
        numbers seen (:func:`khipu.detector.sequences.absorb`), so traces arriving out of order
        leave the same gaps as traces arriving in order. Emitters number from 0, so an emitter
        first seen above 0 lost its first traces. (A detector started at ``latest`` sees every
        emitter mid-way: start it at ``earliest``, the default.)
        """
        by_emitter: dict[str, tuple[str, list[tuple[int, int]]]] = {}
        for emitter_id, location, seq, at_ms in observed:
            by_emitter.setdefault(emitter_id, (location, []))[1].append((int(seq), int(at_ms)))
        progress, gaps = schema.emitter_progress, schema.trace_gaps
        new_gaps = 0
        with self._engine.begin() as tx:
            for emitter_id, (location, seen) in sorted(by_emitter.items()):
                row = tx.execute(select(progress).where(progress.c.emitter_id == emitter_id)).first()
                history = _history(row) if row else EmitterHistory()
                absorbed = absorb(history, seen, keep)
                if absorbed.late:
                    self._fill_gaps(tx, emitter_id, list(absorbed.late))
                if not absorbed.changed:
                    continue
                stored = {
                    (int(r.from_seq), int(r.to_seq)): (int(r.id), int(r.noticed_ms))
                    for r in tx.execute(
                        select(gaps.c.id, gaps.c.from_seq, gaps.c.to_seq, gaps.c.noticed_ms).where(
                            gaps.c.emitter_id == emitter_id, gaps.c.from_seq > history.base_seq
                        )
                    )
                }
                new_gaps += sum((g.from_seq, g.to_seq) not in stored for g in absorbed.gaps)
                if stored:
                    tx.execute(delete(gaps).where(gaps.c.id.in_([gap_id for gap_id, _ in stored.values()])))
                for gap in absorbed.gaps:
                    noticed = stored.get((gap.from_seq, gap.to_seq), (0, now_ms))[1]
                    tx.execute(
                        insert(gaps).values(
                            emitter_id=emitter_id,
                            location=location,
                            from_seq=gap.from_seq,
                            to_seq=gap.to_seq,
                            after_ms=gap.after_ms,
                            before_ms=gap.before_ms,
                            noticed_ms=noticed,
                        )
                    )
                kept = absorbed.history
                values = dict(
                    location=location,
                    max_seq=kept.max_seq,
                    base_seq=kept.base_seq,
                    base_ms=kept.base_ms,
                    runs=json.dumps([[r.first_seq, r.first_ms, r.last_seq, r.last_ms] for r in kept.runs]),
                    updated_ms=now_ms,
                )
                if row:
                    tx.execute(update(progress).where(progress.c.emitter_id == emitter_id).values(**values))
                else:
                    tx.execute(insert(progress).values(emitter_id=emitter_id, **values))
        return new_gaps

    def _fill_gaps(self, tx: Connection, emitter_id: str, late: list[int]) -> None:
        """Numbers at or below an emitter's base arrived very late: each shrinks or splits its gap; a gap
        filled completely goes."""
        gaps = schema.trace_gaps
        for seq in late:
            for gap in tx.execute(
                select(gaps).where(gaps.c.emitter_id == emitter_id, gaps.c.from_seq <= seq, gaps.c.to_seq > seq)
            ).all():
                pieces = [(start, stop) for start, stop in ((gap.from_seq, seq), (seq + 1, gap.to_seq)) if stop > start]
                if not pieces:
                    tx.execute(delete(gaps).where(gaps.c.id == gap.id))
                    continue
                start, stop = pieces[0]
                tx.execute(update(gaps).where(gaps.c.id == gap.id).values(from_seq=start, to_seq=stop))
                for start, stop in pieces[1:]:
                    tx.execute(
                        insert(gaps).values(
                            emitter_id=emitter_id,
                            location=gap.location,
                            from_seq=start,
                            to_seq=stop,
                            after_ms=gap.after_ms,
                            before_ms=gap.before_ms,
                            noticed_ms=gap.noticed_ms,
                        )
                    )

    def record_pointers(self, pointers: Iterable[tuple[str, str, str, int, int]], seen_ms: int) -> int:
        """Keep positions an emitter says it received: (location, cluster, topic, partition, offset).

        They come from back-pointers (:attr:`khipu.trace.model.Trace.prev_offset`) and emitter
        marks whose own trace was not in the same batch. A position stored twice keeps its first
        time. Returns how many were new.
        """
        table = schema.trace_pointers
        rows = sorted({(str(loc), str(c), str(t), int(p), int(o)) for loc, c, t, p, o in pointers})
        added = 0
        with self._engine.begin() as tx:
            for location, cluster, topic, partition, offset in rows:
                added += insert_ignoring_duplicate(
                    tx,
                    table,
                    dict(
                        location=location,
                        cluster=cluster,
                        topic=topic,
                        partition=partition,
                        offset=offset,
                        seen_ms=seen_ms,
                    ),
                )
        return added

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


def _history(row: Any) -> EmitterHistory:
    return EmitterHistory(
        base_seq=int(row.base_seq),
        base_ms=None if row.base_ms is None else int(row.base_ms),
        runs=tuple(Run(int(a), int(b), int(c), int(d)) for a, b, c, d in json.loads(row.runs)),
    )
