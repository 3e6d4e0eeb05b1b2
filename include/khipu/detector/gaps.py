"""Gap bookkeeping: what one batch of emitter sequence numbers changes in each emitter's stored gaps.

A gap is a run of sequence numbers never seen: traces the emitter lost (:mod:`khipu.detector.sequences`).
Given what is stored of each emitter (its history, and the gaps the batch may touch) and the batch,
:func:`plan_sequence_updates` says what to write, as values; the store loads and applies them in
one transaction (:meth:`khipu.store.channel.TraceChannelRepository.record_sequences`), and
:func:`record_emitter_sequences` joins the two.

- Numbers above the emitter's base: its gaps above the base are recomputed from the runs seen
  (:func:`~khipu.detector.sequences.absorb`). A recomputed gap that was stored with the same bounds
  keeps the time it was first noticed; any other counts as new (a gap that shrank included).
- Numbers at or below the base (arrived very late, after their run was folded): each one shrinks
  the stored gap holding it, or splits it in two; a gap filled completely goes. The pieces keep
  the gap's location, times and first-noticed time.

Emitters number from 0, so an emitter first seen above 0 lost its first traces. (A detector started
at ``latest`` sees every emitter mid-way: start it at ``earliest``, the default.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from khipu.detector.sequences import KEEP_RECENT, EmitterHistory, Numbers, Run, absorb
from khipu.store.channel import StoredEmitter, TraceChannelRepository


@dataclass(frozen=True, slots=True)
class TraceGap:
    """A gap as stored: the numbers [from_seq, to_seq) of an emitter at ``location`` never seen."""

    location: str
    from_seq: int  # first missing number
    to_seq: int  # first number after the gap
    after_ms: int  # time of the number before the gap
    before_ms: int  # ... and of the number after it
    noticed_ms: int  # when the gap was first recorded


@dataclass(frozen=True, slots=True)
class EmitterState:
    """What is stored of one emitter: its history (None: never seen) and its gaps by row id (at least those
    above the base and those holding any number of the batch)."""

    history: EmitterHistory | None = None
    gaps: Mapping[int, TraceGap] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, eq=False)
class EmitterBatch:
    """One emitter's numbers in a batch: (sequence number, trace time), in arrival order (an (n, 2) array)."""

    location: str  # the location of its first observation in the batch
    seen: Numbers

    @property
    def lowest_seq(self) -> int:
        return int(self.seen[:, 0].min())

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, EmitterBatch)
            and self.location == other.location
            and np.array_equal(self.seen, other.seen)
        )

    @staticmethod
    def of(location: str, seen: Iterable[tuple[int, int]]) -> EmitterBatch:
        return EmitterBatch(location, np.asarray(list(seen), dtype=np.int64).reshape(-1, 2))


@dataclass(frozen=True, slots=True)
class EmitterUpdate:
    """What to write for one emitter after a batch."""

    emitter_id: str
    location: str
    history: EmitterHistory | None  # the new history; None: nothing new was seen, leave it
    deleted: tuple[int, ...]  # ids of the gaps that go
    updated: Mapping[int, TraceGap]  # new values of stored gaps, by id
    inserted: tuple[TraceGap, ...]
    new_gaps: int  # gaps it has now that it had not before
    updated_ms: int


def batches_by_emitter(observed: Iterable[tuple[str, str, int, int]]) -> dict[str, EmitterBatch]:
    """(emitter id, location, sequence number, trace time) of a batch of traces and marks, per emitter."""
    rows = list(observed)
    if not rows:
        return {}
    emitters, locations, numbers, times = zip(*rows, strict=True)
    return batches_of_columns(emitters, locations, numbers, times)


def batches_of_columns(
    emitter_ids: Sequence[str], locations: Sequence[str], numbers: Sequence[int], times: Sequence[int]
) -> dict[str, EmitterBatch]:
    """:func:`batches_by_emitter` of a batch given as columns (grouped with numpy: no Python per number)."""
    if not len(emitter_ids):
        return {}
    codes, emitters = pd.factorize(np.asarray(emitter_ids, dtype=object))
    location = np.asarray(locations, dtype=object)
    pairs = np.column_stack([np.asarray(numbers, dtype=np.int64), np.asarray(times, dtype=np.int64)])
    order = np.argsort(codes, kind="stable")  # arrival order kept within each emitter
    bounds = np.searchsorted(codes[order], np.arange(len(emitters) + 1))
    found: dict[str, EmitterBatch] = {}
    for code, emitter_id in enumerate(emitters):
        rows = order[bounds[code] : bounds[code + 1]]
        found[str(emitter_id)] = EmitterBatch(str(location[rows[0]]), pairs[rows])
    return found


def plan_sequence_updates(
    stored: Mapping[str, EmitterState],
    batches: Mapping[str, EmitterBatch],
    now_ms: int,
    keep: int = KEEP_RECENT,
) -> list[EmitterUpdate]:
    """What a batch changes for each of its emitters, in emitter order (see the module's description)."""
    return [
        _plan_emitter(emitter_id, stored.get(emitter_id, EmitterState()), batch, now_ms, keep)
        for emitter_id, batch in sorted(batches.items())
    ]


@dataclass(slots=True)
class _Slot:
    """A gap being worked on: ``gap_id`` None for one not stored yet, ``gap`` None once it goes."""

    gap_id: int | None
    gap: TraceGap | None


def _plan_emitter(emitter_id: str, state: EmitterState, batch: EmitterBatch, now_ms: int, keep: int) -> EmitterUpdate:
    history = state.history if state.history is not None else EmitterHistory()
    absorbed = absorb(history, batch.seen, keep)
    slots = [_Slot(gap_id, gap) for gap_id, gap in sorted(state.gaps.items())]
    for seq in absorbed.late:
        _fill(slots, seq)
    new_gaps = 0
    if absorbed.changed:
        above = {}  # the stored gaps above the previous base, by bounds
        for slot in slots:
            if slot.gap is not None and slot.gap.from_seq > history.base_seq:
                above[(slot.gap.from_seq, slot.gap.to_seq)] = (slot, slot.gap.noticed_ms)
                slot.gap = None
        for gap in absorbed.gaps:
            kept = above.pop((gap.from_seq, gap.to_seq), None)
            if kept is None:
                new_gaps += 1
            noticed = now_ms if kept is None else kept[1]
            fresh = TraceGap(batch.location, gap.from_seq, gap.to_seq, gap.after_ms, gap.before_ms, noticed)
            if kept is None:
                slots.append(_Slot(None, fresh))
            else:
                kept[0].gap = fresh
    return EmitterUpdate(
        emitter_id=emitter_id,
        location=batch.location,
        history=absorbed.history if absorbed.changed else None,
        deleted=tuple(s.gap_id for s in slots if s.gap_id is not None and s.gap is None),
        updated={
            s.gap_id: s.gap
            for s in slots
            if s.gap_id is not None and s.gap is not None and s.gap != state.gaps[s.gap_id]
        },
        inserted=tuple(s.gap for s in slots if s.gap_id is None and s.gap is not None),
        new_gaps=new_gaps,
        updated_ms=now_ms,
    )


def _fill(slots: list[_Slot], seq: int) -> None:
    """A number that arrived very late shrinks the gap holding it, or splits it in two; a gap it fills goes."""
    for slot in list(slots):
        gap = slot.gap
        if gap is None or not gap.from_seq <= seq < gap.to_seq:
            continue
        pieces = [(start, stop) for start, stop in ((gap.from_seq, seq), (seq + 1, gap.to_seq)) if stop > start]
        if not pieces:
            slot.gap = None
            continue
        slot.gap = dataclasses.replace(gap, from_seq=pieces[0][0], to_seq=pieces[0][1])
        for start, stop in pieces[1:]:
            slots.append(_Slot(None, dataclasses.replace(gap, from_seq=start, to_seq=stop)))


def record_emitter_sequences(
    channel: TraceChannelRepository,
    observed: Iterable[tuple[str, str, int, int]] | Mapping[str, EmitterBatch],
    now_ms: int,
    keep: int = KEEP_RECENT,
) -> int:
    """Track each emitter's sequence numbers and keep its gaps (lost traces), in one transaction; return how
    many gaps the emitters have now that they had not before.

    ``observed``: (emitter id, location, sequence number, trace time) of one batch of traces and
    emitter marks. Traces arriving out of order leave the same gaps as traces arriving in order,
    and a replayed batch changes nothing.
    """
    batches = observed if isinstance(observed, Mapping) else batches_by_emitter(observed)
    if not batches:
        return 0
    planned: list[EmitterUpdate] = []

    def plan(stored: Mapping[str, StoredEmitter]) -> list[EmitterUpdate]:
        planned[:] = plan_sequence_updates({e: _state(s) for e, s in stored.items()}, batches, now_ms, keep)
        return planned

    channel.record_sequences({emitter_id: batch.lowest_seq for emitter_id, batch in batches.items()}, plan)
    return sum(update.new_gaps for update in planned)


def _state(stored: StoredEmitter) -> EmitterState:
    progress = stored.progress
    history = (
        None
        if progress is None
        else EmitterHistory(progress.base_seq, progress.base_ms, tuple(Run(*run) for run in progress.runs))
    )
    gaps = {
        gap_id: TraceGap(g.location, g.from_seq, g.to_seq, g.after_ms, g.before_ms, g.noticed_ms)
        for gap_id, g in stored.gaps.items()
    }
    return EmitterState(history, gaps)
