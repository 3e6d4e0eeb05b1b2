"""Gap bookkeeping: what one batch of emitter sequence numbers changes in each emitter's stored gaps.

A gap is a run of sequence numbers never seen: traces the emitter lost (:mod:`khipu.detector.sequences`).
Given what is stored of each emitter (its history, and the gaps the batch may touch) and the batch,
:func:`plan_sequence_updates` says what to write, as values; the store loads and applies them in
one transaction (:meth:`khipu.store.channel.TraceChannelRepository.record_sequences`), and
:func:`record_emitter_sequences` joins the two.

- Numbers above the emitter's base: its gaps above the base are recomputed from the runs seen
  (:func:`~khipu.detector.sequences.absorb`). A recomputed gap inside a stored one (the same, or what is
  left of it after numbers arrived late) keeps the stored gap's location and the time it was first
  noticed; it is no new loss.
- A recomputed gap that no stored gap holds is a new loss only once it is *settled*: the number after it
  was written to the trace topic no later than ``settled_ms`` (how far the topic is read, less the grace),
  so every trace the emitter wrote before that number has been read. Until then it is *open*: an emitter's
  traces are spread over the topic's partitions, and a micro-batch ends at a different point on each, so
  the numbers just below the newest read are often only further down another partition. Open gaps are
  neither stored nor counted; the emitter is looked at again (``revisit``) until none is left open.
- Numbers at or below the base (arrived very late, after their run was folded): each one shrinks
  the stored gap holding it, or splits it in two; a gap filled completely goes. The pieces keep
  the gap's location, times and first-noticed time.

Emitters number from 0, so an emitter first seen above 0 lost its first traces. (A detector started
at ``latest`` sees every emitter mid-way: start it at ``earliest``, the default.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from khipu.detector.sequences import KEEP_RECENT, EmitterHistory, Numbers, Run, SequenceGap, absorb
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
    location: str = ""  # where it was last seen (a revisited emitter has no numbers in the batch to tell)


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
    new_gaps: int  # settled gaps it has now that no stored gap held before: traces it lost
    updated_ms: int
    open_gaps: int = 0  # gaps not settled yet: look at the emitter again after the next batch


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
    *,
    settled_ms: int | None = None,
    revisit: Collection[str] = (),
) -> list[EmitterUpdate]:
    """What a batch changes for each of its emitters, and for each emitter of ``revisit`` (open gaps earlier)
    that has no numbers in it, in emitter order (see the module's description). ``settled_ms``: every trace
    written to the trace topic before it has been read; None: not known yet (every new gap stays open)."""
    empty = EmitterBatch.of("", [])
    looked_at = {**{e: empty for e in revisit if e in stored}, **batches}
    return [
        _plan_emitter(emitter_id, stored.get(emitter_id, EmitterState()), batch, now_ms, keep, settled_ms)
        for emitter_id, batch in sorted(looked_at.items())
    ]


@dataclass(slots=True)
class _Slot:
    """A gap being worked on: ``gap_id`` None for one not stored yet, ``gap`` None once it goes."""

    gap_id: int | None
    gap: TraceGap | None


def _plan_emitter(
    emitter_id: str, state: EmitterState, batch: EmitterBatch, now_ms: int, keep: int, settled_ms: int | None
) -> EmitterUpdate:
    history = state.history if state.history is not None else EmitterHistory()
    location = batch.location if len(batch.seen) else state.location
    open_after = settled_ms if settled_ms is not None else -(2**63)
    absorbed = absorb(history, batch.seen, keep, open_after_ms=open_after)
    slots = [_Slot(gap_id, gap) for gap_id, gap in sorted(state.gaps.items())]
    for seq in absorbed.late:
        _fill(slots, seq)
    above = [(slot, slot.gap) for slot in slots if slot.gap is not None and slot.gap.from_seq > history.base_seq]
    pieces: dict[int, list[SequenceGap]] = {id(slot): [] for slot, _ in above}
    new_gaps = open_gaps = 0
    for gap in absorbed.gaps:
        holder = next((slot for slot, held in above if _overlap(held, gap)), None)
        if holder is not None:  # what is left of a stored gap: the same loss
            pieces[id(holder)].append(gap)
        elif gap.before_ms <= open_after:
            new_gaps += 1
            slots.append(_Slot(None, TraceGap(location, gap.from_seq, gap.to_seq, gap.after_ms, gap.before_ms, now_ms)))
        else:
            open_gaps += 1
    for slot, stored_gap in above:
        kept = [
            TraceGap(stored_gap.location, g.from_seq, g.to_seq, g.after_ms, g.before_ms, stored_gap.noticed_ms)
            for g in pieces[id(slot)]
        ]
        slot.gap = kept[0] if kept else None  # filled completely: it goes
        slots.extend(_Slot(None, piece) for piece in kept[1:])
    return EmitterUpdate(
        emitter_id=emitter_id,
        location=location,
        history=absorbed.history if absorbed.changed or absorbed.history != history else None,
        deleted=tuple(s.gap_id for s in slots if s.gap_id is not None and s.gap is None),
        updated={
            s.gap_id: s.gap
            for s in slots
            if s.gap_id is not None and s.gap is not None and s.gap != state.gaps[s.gap_id]
        },
        inserted=tuple(s.gap for s in slots if s.gap_id is None and s.gap is not None),
        new_gaps=new_gaps,
        updated_ms=now_ms,
        open_gaps=open_gaps,
    )


def _overlap(stored: TraceGap, gap: SequenceGap) -> bool:
    return stored.from_seq < gap.to_seq and gap.from_seq < stored.to_seq


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
    *,
    settled_ms: int | None = None,
    revisit: Collection[str] = (),
) -> SequencesRecorded:
    """Track each emitter's sequence numbers and keep its settled gaps (lost traces), in one transaction.

    ``observed``: (emitter id, location, sequence number, time written to the trace topic) of one batch of
    traces and emitter marks; ``settled_ms`` and ``revisit`` as :func:`plan_sequence_updates` takes them.
    Traces arriving out of order leave the same gaps as traces arriving in order, and a replayed batch
    changes nothing.
    """
    batches = observed if isinstance(observed, Mapping) else batches_by_emitter(observed)
    again = [e for e in revisit if e not in batches]
    if not batches and not again:
        return SequencesRecorded(0, frozenset())
    planned: list[EmitterUpdate] = []

    def plan(stored: Mapping[str, StoredEmitter]) -> list[EmitterUpdate]:
        states = {e: _state(s) for e, s in stored.items()}
        planned[:] = plan_sequence_updates(states, batches, now_ms, keep, settled_ms=settled_ms, revisit=again)
        return planned

    lowest = {emitter_id: batch.lowest_seq for emitter_id, batch in batches.items()}
    lowest.update({emitter_id: NO_NUMBER for emitter_id in again})  # every gap above its base
    channel.record_sequences(lowest, plan)
    return SequencesRecorded(
        sum(update.new_gaps for update in planned),
        frozenset(update.emitter_id for update in planned if update.open_gaps),
    )


@dataclass(frozen=True, slots=True)
class SequencesRecorded:
    """What recording a batch's numbers found: new settled gaps (traces lost), and the emitters with gaps
    still open (to revisit after the next batch)."""

    new_gaps: int
    still_open: frozenset[str]


NO_NUMBER = 2**63 - 1  # the lowest number of a revisited emitter, which has none in the batch


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
    return EmitterState(history, gaps, progress.location if progress is not None else "")
