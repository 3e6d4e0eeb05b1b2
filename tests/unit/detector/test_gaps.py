"""Gap bookkeeping as values: what a batch of sequence numbers changes in an emitter's stored gaps."""

from __future__ import annotations

import pytest

from khipu.detector.gaps import (
    EmitterBatch,
    EmitterState,
    EmitterUpdate,
    TraceGap,
    batches_by_emitter,
    plan_sequence_updates,
)
from khipu.detector.sequences import EmitterHistory, Run

NOW = 9_000
NOTICED = 111  # when the stored gaps were first recorded
SETTLED = 10**9  # the trace topic read far past every number here: every gap is settled


def gap(from_seq: int, to_seq: int, noticed_ms: int = NOTICED) -> TraceGap:
    return TraceGap("sink", from_seq, to_seq, 1000 + from_seq - 1, 1000 + to_seq, noticed_ms)


def plan(state: EmitterState, *numbers: int) -> EmitterUpdate:
    batch = EmitterBatch.of("sink", [(n, 1000 + n) for n in numbers])
    [update] = plan_sequence_updates({"e1": state}, {"e1": batch}, NOW, settled_ms=SETTLED)
    return update


# Numbers up to 20 folded into the base; 22 and 23 seen above it. Gap 7 holds 1..5, gap 8 holds 12, gap 9 holds 21.
FOLDED = EmitterState(
    EmitterHistory(20, 1020, (Run(22, 1022, 23, 1023),)), {7: gap(1, 6), 8: gap(12, 13), 9: gap(21, 22)}
)


def test_a_very_late_number_inside_a_gap_splits_it_and_both_pieces_keep_its_times() -> None:
    update = plan(FOLDED, 3)
    assert update.updated == {7: TraceGap("sink", 1, 3, 1000, 1006, NOTICED)}  # the row keeps the lower piece
    assert update.inserted == (TraceGap("sink", 4, 6, 1000, 1006, NOTICED),)  # the upper one is a new row
    assert (update.deleted, update.new_gaps) == ((), 0)  # a split is no new loss
    assert update.history is None  # a late number is nothing new above the base: the progress stays


def test_a_very_late_number_at_either_end_of_a_gap_shrinks_it() -> None:
    assert plan(FOLDED, 1).updated == {7: TraceGap("sink", 2, 6, 1000, 1006, NOTICED)}
    assert plan(FOLDED, 5).updated == {7: TraceGap("sink", 1, 5, 1000, 1006, NOTICED)}
    assert plan(FOLDED, 1).inserted == plan(FOLDED, 5).inserted == ()


def test_a_very_late_number_that_was_a_whole_gap_removes_it() -> None:
    update = plan(FOLDED, 12)
    assert (update.deleted, update.updated, update.inserted) == ((8,), {}, ())


def test_two_late_numbers_in_one_gap_split_the_piece_the_first_left() -> None:
    update = plan(FOLDED, 4, 2)
    assert update.updated == {7: TraceGap("sink", 1, 2, 1000, 1006, NOTICED)}
    assert update.inserted == (TraceGap("sink", 3, 4, 1000, 1006, NOTICED), TraceGap("sink", 5, 6, 1000, 1006, NOTICED))


def test_recomputed_gaps_keep_when_they_were_noticed_and_a_shrunk_gap_is_no_new_loss() -> None:
    # 0-1, 3-4 and 7 seen: gaps 2 (row 1) and 5..6 (row 2); then 6 arrives
    history = EmitterHistory(-1, None, (Run(0, 1000, 1, 1001), Run(3, 1003, 4, 1004), Run(7, 1007, 7, 1007)))
    state = EmitterState(history, {1: gap(2, 3), 2: gap(5, 7)})
    update = plan(state, 6)
    assert update.updated == {2: TraceGap("sink", 5, 6, 1004, 1006, NOTICED)}  # what is left of row 2, as noticed
    assert (update.deleted, update.inserted) == ((), ())  # gap 2..3 recomputed the same: left as it is
    assert update.new_gaps == 0
    assert update.history is not None and [(r.first_seq, r.last_seq) for r in update.history.runs] == [
        (0, 1),
        (3, 4),
        (6, 7),
    ]


def test_a_replayed_batch_changes_nothing() -> None:
    history = EmitterHistory(-1, None, (Run(0, 1000, 1, 1001), Run(3, 1003, 3, 1003)))
    update = plan(EmitterState(history, {1: gap(2, 3)}), 3, 1, 0)
    assert (update.history, update.deleted, update.updated, update.inserted, update.new_gaps) == (None, (), {}, (), 0)


def test_an_emitter_first_seen_above_zero_lost_its_first_numbers() -> None:
    update = plan(EmitterState(), 3, 4)
    assert update.inserted == (TraceGap("sink", 0, 3, 1003, 1003, NOW),)  # nothing before it: both times are 3's
    assert update.new_gaps == 1 and update.history == EmitterHistory(-1, None, (Run(3, 1003, 4, 1004),))
    assert update.updated_ms == NOW


def test_a_batch_is_grouped_per_emitter_under_its_first_location_and_planned_in_emitter_order() -> None:
    batches = batches_by_emitter([("e2", "proc", 5, 10), ("e1", "sink", 1, 11), ("e2", "proc-moved", 3, 12)])
    assert batches == {"e2": EmitterBatch.of("proc", ((5, 10), (3, 12))), "e1": EmitterBatch.of("sink", ((1, 11),))}
    assert batches["e2"].lowest_seq == 3
    assert [u.emitter_id for u in plan_sequence_updates({}, batches, NOW, settled_ms=SETTLED)] == ["e1", "e2"]


# Gaps across micro-batches: one emitter, numbers written at 1000 + n; ``settled`` is how far the trace topic is
# read, less the grace. (case, stored before, numbers in the batch, settled, stored after, counted new, left open)
OPEN_CASES = [
    # 1. 0-2 and 5-6 read, 3-4 still further down another partition (5 written at 1005, after 1004): open.
    (1, EmitterState(), (0, 1, 2, 5, 6), 1004, [], 0, 1),
    # 2. the same numbers read once the topic is read past 5's write: 3..4 is a loss, counted once.
    (2, EmitterState(), (0, 1, 2, 5, 6), 1005, [(3, 5)], 1, 0),
    # 3. how far the topic is read not known yet (a fresh start): nothing is counted, it stays open.
    (3, EmitterState(), (0, 1, 2, 5, 6), None, [], 0, 1),
    # 4. the next batch brings 3 and 4: there never was a gap, nothing is counted.
    (4, EmitterState(EmitterHistory(-1, None, (Run(0, 1000, 2, 1002), Run(5, 1005, 6, 1006)))), (3, 4), 1004, [], 0, 0),
    # 5. the next batch brings only 4: 3 is still open while 4 was written after the settled time.
    (5, EmitterState(EmitterHistory(-1, None, (Run(0, 1000, 2, 1002), Run(5, 1005, 6, 1006)))), (4,), 1003, [], 0, 1),
    # 6. looked at again with no numbers, once the topic is read past 5's write: 3..4 is settled and counted.
    (
        6,
        EmitterState(EmitterHistory(-1, None, (Run(0, 1000, 2, 1002), Run(5, 1005, 6, 1006))), {}, "sink"),
        (),
        1006,
        [(3, 5)],
        1,
        0,
    ),
    # 7. a stored (settled) gap stays stored, even when how far the topic is read starts over (a new checkpoint).
    (
        7,
        EmitterState(EmitterHistory(-1, None, (Run(0, 1000, 2, 1002), Run(5, 1005, 6, 1006))), {4: gap(3, 5)}),
        (7,),
        None,
        [(3, 5)],
        0,
        0,
    ),
]


@pytest.mark.parametrize(("case", "state", "numbers", "settled", "stored", "new", "still_open"), OPEN_CASES)
def test_a_gap_is_a_loss_only_once_the_topic_is_read_past_the_number_after_it(
    case: int,
    state: EmitterState,
    numbers: tuple[int, ...],
    settled: int | None,
    stored: list[tuple[int, int]],
    new: int,
    still_open: int,
) -> None:
    batches = {"e1": EmitterBatch.of("sink", [(n, 1000 + n) for n in numbers])} if numbers else {}
    [update] = plan_sequence_updates({"e1": state}, batches, NOW, settled_ms=settled, revisit=["e1"])
    kept = {gap_id: g for gap_id, g in state.gaps.items() if gap_id not in update.deleted}
    kept.update(update.updated)
    after = sorted((g.from_seq, g.to_seq) for g in [*kept.values(), *update.inserted])
    assert (after, update.new_gaps, update.open_gaps) == (stored, new, still_open), case


def test_an_emitter_with_nothing_open_and_no_numbers_is_not_looked_at() -> None:
    assert plan_sequence_updates({}, {}, NOW, settled_ms=SETTLED, revisit=["gone"]) == []


def test_the_fold_never_passes_an_open_gap() -> None:
    # keep 2: 0..9 with 3 missing, read up to 1002 only: 3 is open, so nothing from 2 on is folded
    batch = EmitterBatch.of("sink", [(n, 1000 + n) for n in range(10) if n != 3])
    [update] = plan_sequence_updates({}, {"e1": batch}, NOW, keep=2, settled_ms=1002)
    assert update.history is not None and update.history.base_seq == 2 and update.open_gaps == 1
    [later] = plan_sequence_updates({"e1": EmitterState(update.history, {}, "sink")}, {}, NOW, keep=2,
                                    settled_ms=1004, revisit=["e1"])  # fmt: skip
    assert [(g.from_seq, g.to_seq) for g in later.inserted] == [(3, 4)] and later.new_gaps == 1


@pytest.mark.parametrize("lost", [(), (7,), (100, 101, 398)])
def test_traces_spread_over_partitions_and_read_in_uneven_batches_count_only_what_was_lost(
    lost: tuple[int, ...],
) -> None:
    """One emitter's traces over 4 trace-topic partitions (as a producer spreads them by key); each micro-batch
    reads a different number of records from each partition, so numbers above the slowest partition's frontier
    arrive a batch or more later. Only the numbers really missing count as lost traces, once, whatever the
    batching; before the gap tracker waited for the topic to be read past a gap, every batch counted the
    frontier's holes as new gaps."""
    written = {n: 1000 + n for n in range(400) if n not in lost}  # the time each number was written to the topic
    partitions = [[n for n in written if n % 7 % 4 == p] for p in range(4)]
    read = [0, 0, 0, 0]
    state, gaps, counted, batch = EmitterState(), {}, 0, 0
    while any(read[p] < len(partitions[p]) for p in range(4)):
        batch += 1
        numbers = []
        for p in range(4):
            take = 5 + 13 * ((p + batch) % 4)  # uneven: the batch ends at a different point on each partition
            numbers += partitions[p][read[p] : read[p] + take]
            read[p] += take
        newest = [written[partitions[p][min(read[p], len(partitions[p])) - 1]] for p in range(4)]
        settled = max(newest) if all(r >= len(partitions[p]) for p, r in enumerate(read)) else min(newest) - 1
        emitter_batch = EmitterBatch.of("sink", [(n, written[n]) for n in numbers])
        [update] = plan_sequence_updates({"e1": state}, {"e1": emitter_batch} if numbers else {}, NOW,
                                         settled_ms=settled, revisit=["e1"])  # fmt: skip
        counted += update.new_gaps
        gaps = {i: g for i, g in gaps.items() if i not in update.deleted} | dict(update.updated)
        gaps |= {len(gaps) + 1000 * batch + k: g for k, g in enumerate(update.inserted)}
        state = EmitterState(update.history or state.history, gaps, "sink")
    stored = sorted((g.from_seq, g.to_seq) for g in gaps.values())
    assert sorted(n for a, b in stored for n in range(a, b)) == sorted(lost)  # exactly the numbers lost
    assert counted == len(stored)  # each gap counted once, when it settled; none for numbers read late
