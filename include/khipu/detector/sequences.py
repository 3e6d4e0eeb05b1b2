"""An emitter's sequence numbers: a number never seen is a trace the emitter lost.

Every trace and emitter mark carries its emitter's sequence number (0, 1, 2, ...). Counting the
missing numbers measures the trace channel itself: how many traces each emitter lost, and when.
(Which record a lost trace belonged to is told by back-pointers, not by these gaps: see
:attr:`khipu.trace.model.Trace.prev_offset`.)

Traces of one emitter reach the detector out of order: they are spread over the trace topic's
partitions, and a micro-batch (above all one capped by ``maxOffsetsPerTrigger`` while catching
up) ends at a different point on each. So the numbers seen are kept as runs of consecutive
numbers, and the gaps between runs are recomputed whenever a batch brings more: the result
depends only on what has been seen, never on the order it came in. Runs more than ``keep``
numbers behind the newest are folded into a base; a number that arrives even later still fills
its gap (:class:`Absorbed.late`).

A gap at the frontier of what has been read is not yet a loss: its numbers may sit on a partition the
batch did not read as far. A gap is *open* while the number after it was written later than
``open_after_ms`` (the caller's bound: how far the trace topic is read, less the grace); the fold never
passes an open gap, so it is judged again once the topic is read past it
(:func:`khipu.detector.gaps.plan_sequence_updates` stores and counts only the gaps that are not open).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Numbers = npt.NDArray[np.int64]
KEEP_RECENT = 100_000  # numbers behind an emitter's newest within which a late trace still counts fully


@dataclass(frozen=True, slots=True)
class Run:
    """Consecutive numbers seen, with the times of the first and the last."""

    first_seq: int
    first_ms: int
    last_seq: int
    last_ms: int


@dataclass(frozen=True, slots=True)
class EmitterHistory:
    """What is kept of one emitter: everything up to ``base_seq`` folded in, and the runs above it."""

    base_seq: int = -1  # -1: nothing folded yet (numbering starts at 0)
    base_ms: int | None = None
    runs: tuple[Run, ...] = ()  # sorted, disjoint, not adjacent, all above base_seq

    @property
    def max_seq(self) -> int:
        return self.runs[-1].last_seq if self.runs else self.base_seq


@dataclass(frozen=True, slots=True)
class SequenceGap:
    from_seq: int  # first missing number
    to_seq: int  # first number after the gap
    after_ms: int  # time of the number before the gap
    before_ms: int  # ... and of the number after it

    @property
    def size(self) -> int:
        return self.to_seq - self.from_seq


@dataclass(frozen=True, slots=True)
class Absorbed:
    history: EmitterHistory
    gaps: tuple[SequenceGap, ...]  # every gap above the *previous* base_seq, recomputed
    late: tuple[int, ...]  # numbers at or below the previous base_seq: they may fill older gaps
    changed: bool  # whether anything new was seen


def absorb(
    history: EmitterHistory,
    seen: Iterable[tuple[int, int]] | Numbers,
    keep: int = KEEP_RECENT,
    open_after_ms: int | None = None,
) -> Absorbed:
    """Add a batch of (sequence number, time) to an emitter's history; recompute its gaps above the base.

    ``seen``: pairs, or an (n, 2) array of them; a number seen twice counts with the time it first came with.
    The numbers are handled as runs with numpy (a batch holds tens of thousands per emitter).
    ``open_after_ms``: gaps whose number after came later than this are open (see the module's description)
    and are not folded into the base; None: no gap is open."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    pairs = seen if isinstance(seen, np.ndarray) else np.asarray(list(seen), dtype=np.int64)
    pairs = pairs.reshape(-1, 2).astype(np.int64, copy=False)
    numbers, times = pairs[:, 0], pairs[:, 1]
    below = numbers <= history.base_seq
    late = tuple(sorted(set(numbers[below].tolist())))
    numbers, times = numbers[~below], times[~below]
    distinct, first = np.unique(numbers, return_index=True)  # sorted; the first arrival of each
    at = times[first]
    runs = list(history.runs)
    if runs and len(distinct):  # numbers inside a run already kept are nothing new
        starts = np.asarray([run.first_seq for run in runs], dtype=np.int64)
        ends = np.asarray([run.last_seq for run in runs], dtype=np.int64)
        holder = np.searchsorted(starts, distinct, side="right") - 1
        inside = (holder >= 0) & (distinct <= ends[np.maximum(holder, 0)])
        distinct, at = distinct[~inside], at[~inside]
    merged = _merge(runs, _runs_of(distinct, at))
    gaps = _gaps(history.base_seq, history.base_ms, merged)
    horizon = merged[-1].last_seq - keep if merged else history.base_seq
    if open_after_ms is not None:  # never fold past a gap that traces not yet read may still fill
        first_open = next((gap.from_seq for gap in gaps if gap.before_ms > open_after_ms), None)
        if first_open is not None:
            horizon = min(horizon, first_open - 1)
    folded = [run for run in merged if run.last_seq <= horizon]
    base_seq, base_ms = (folded[-1].last_seq, folded[-1].last_ms) if folded else (history.base_seq, history.base_ms)
    kept = EmitterHistory(base_seq, base_ms, tuple(run for run in merged if run.last_seq > horizon))
    return Absorbed(kept, gaps, late, bool(len(distinct)))


def _runs_of(numbers: Numbers, times: Numbers) -> list[Run]:
    """Sorted distinct numbers (with their times) as runs of consecutive numbers."""
    if not len(numbers):
        return []
    breaks = np.nonzero(np.diff(numbers) > 1)[0]
    firsts, lasts = np.r_[0, breaks + 1], np.r_[breaks, len(numbers) - 1]
    return [
        Run(int(numbers[a]), int(times[a]), int(numbers[b]), int(times[b]))
        for a, b in zip(firsts.tolist(), lasts.tolist(), strict=True)
    ]


def _merge(runs: list[Run], fresh: list[Run]) -> list[Run]:
    pieces = sorted([*runs, *fresh], key=lambda run: run.first_seq)
    merged: list[Run] = []
    for run in pieces:
        if merged and run.first_seq <= merged[-1].last_seq + 1:
            last = merged[-1]
            merged[-1] = (
                Run(last.first_seq, last.first_ms, run.last_seq, run.last_ms) if run.last_seq > last.last_seq else last
            )
        else:
            merged.append(run)
    return merged


def _gaps(base_seq: int, base_ms: int | None, runs: list[Run]) -> tuple[SequenceGap, ...]:
    gaps = []
    prev_seq, prev_ms = base_seq, base_ms
    for run in runs:
        if run.first_seq > prev_seq + 1:
            after = run.first_ms if prev_ms is None else prev_ms
            gaps.append(SequenceGap(prev_seq + 1, run.first_seq, after, run.first_ms))
        prev_seq, prev_ms = run.last_seq, run.last_ms
    return tuple(gaps)
