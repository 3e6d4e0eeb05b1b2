"""Emitter sequence gaps in the store (SQLite and PostgreSQL): which missing traces they may explain."""

from __future__ import annotations

import pytest

from khipu.store import Store

pytestmark = pytest.mark.integration
T = "orders"


def sent(seq: int, partition: int, offset: int) -> tuple[str, str, int, int, str | None, int | None, int | None]:
    return ("sink-e1", "sink", seq, 1000 + seq, T, partition, offset)


def mark(seq: int) -> tuple[str, str, int, int, str | None, int | None, int | None]:
    return ("sink-e1", "sink", seq, 1000 + seq, None, None, None)


def test_a_lost_trace_is_explained_and_a_skip_is_not(store: Store) -> None:
    # offsets 0..5 on partition 0; the trace of offset 2 (seq 2) lost; offsets 4 never traced (skipped)
    assert store.record_emitter_sequences([sent(0, 0, 0), sent(1, 0, 1), sent(3, 0, 3), sent(4, 0, 5)], 1) == 1
    assert store.trace_lost_at("sink", T, 0, 2)
    assert not store.trace_lost_at("sink", T, 0, 4)  # no gap in the numbers around it: never traced
    assert not store.trace_lost_at("other", T, 0, 2)


def test_interleaved_partitions_at_a_low_rate_the_lost_one_is_found_on_its_own_partition(store: Store) -> None:
    # round robin over 3 partitions; seq 4 (partition 1, offset 1) lost
    rows = [sent(0, 0, 0), sent(1, 1, 0), sent(2, 2, 0), sent(3, 0, 1), sent(5, 2, 1), sent(6, 0, 2), sent(7, 1, 2)]
    store.record_emitter_sequences(rows, 1)
    assert store.trace_lost_at("sink", T, 1, 1)  # neither neighbour's partition, but the only record missing
    assert not store.trace_lost_at("sink", T, 0, 1)


def test_a_skip_next_to_a_lost_trace_is_told_apart_by_the_run_it_sits_in(store: Store) -> None:
    # run on partition 0: offsets 10, [11 lost], 12; meanwhile partition 1 jumped 20 -> 22 (21 skipped)
    rows = [sent(0, 1, 20), sent(1, 0, 10), sent(3, 0, 12), sent(4, 1, 22)]
    store.record_emitter_sequences(rows, 1)
    assert store.trace_lost_at("sink", T, 0, 11)
    assert not store.trace_lost_at("sink", T, 1, 21)  # two records missing for one lost trace: p0 is the run


def test_a_late_number_fills_its_gap(store: Store) -> None:
    store.record_emitter_sequences([sent(0, 0, 0), sent(2, 0, 2)], 1)
    assert store.trace_lost_at("sink", T, 0, 1)
    store.record_emitter_sequences([sent(1, 0, 1)], 2)  # arrived late, from another trace partition
    assert not store.trace_lost_at("sink", T, 0, 1)
    assert store.trace_gaps("sink") == []


def test_a_mark_reveals_a_last_trace_lost_before_a_quiet_spell(store: Store) -> None:
    store.record_emitter_sequences([sent(0, 0, 0), sent(1, 0, 1)], 1)
    assert not store.trace_lost_at("sink", T, 0, 2)  # nothing says anything was lost yet
    store.record_emitter_sequences([mark(3)], 2)  # the emitter was at 3: number 2 went missing
    assert store.trace_lost_at("sink", T, 0, 2)
    assert not store.trace_lost_at("sink", T, 0, 3)  # one lost trace explains one record


def test_an_emitter_first_seen_above_zero_lost_its_first_traces(store: Store) -> None:
    store.record_emitter_sequences([sent(1, 0, 1), sent(2, 0, 2)], 1)
    assert store.trace_lost_at("sink", T, 0, 0)
    assert store.trace_gaps("sink") == [(0, 1)]


def test_two_lost_traces_in_a_row_are_explained_together(store: Store) -> None:
    # partition 1 offsets 10, [11 lost], [12 lost], 13, with a trace of partition 0 between the two losses
    rows = [sent(0, 1, 10), sent(2, 0, 5), sent(4, 1, 13)]
    assert store.record_emitter_sequences(rows, 1) == 2
    assert store.trace_lost_at("sink", T, 1, 11) and store.trace_lost_at("sink", T, 1, 12)
