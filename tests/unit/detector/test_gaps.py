"""Gap bookkeeping as values: what a batch of sequence numbers changes in an emitter's stored gaps."""

from __future__ import annotations

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


def gap(from_seq: int, to_seq: int, noticed_ms: int = NOTICED) -> TraceGap:
    return TraceGap("sink", from_seq, to_seq, 1000 + from_seq - 1, 1000 + to_seq, noticed_ms)


def plan(state: EmitterState, *numbers: int) -> EmitterUpdate:
    batch = EmitterBatch.of("sink", [(n, 1000 + n) for n in numbers])
    [update] = plan_sequence_updates({"e1": state}, {"e1": batch}, NOW)
    return update


# Numbers up to 20 folded into the base; 22 and 23 seen above it. Gap 7 holds 1..5, gap 8 holds 12.
FOLDED = EmitterState(EmitterHistory(20, 1020, (Run(22, 1022, 23, 1023),)), {7: gap(1, 6), 8: gap(12, 13)})


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


def test_recomputed_gaps_keep_when_they_were_noticed_and_a_shrunk_gap_counts_as_new() -> None:
    # 0-1, 3-4 and 7 seen: gaps 2 (row 1) and 5..6 (row 2); then 6 arrives
    history = EmitterHistory(-1, None, (Run(0, 1000, 1, 1001), Run(3, 1003, 4, 1004), Run(7, 1007, 7, 1007)))
    state = EmitterState(history, {1: gap(2, 3), 2: gap(5, 7)})
    update = plan(state, 6)
    assert update.updated == {}  # gap 2..3 recomputed with the same bounds and times: left as it is
    assert update.deleted == (2,)
    assert update.inserted == (TraceGap("sink", 5, 6, 1004, 1006, NOW),)
    assert update.new_gaps == 1
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
    assert [u.emitter_id for u in plan_sequence_updates({}, batches, NOW)] == ["e1", "e2"]
