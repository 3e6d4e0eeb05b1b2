"""Emitter sequence gaps and back-pointers in the store (SQLite and PostgreSQL)."""

from __future__ import annotations

import itertools
import random

import pytest

from khipu.detector import gaps
from khipu.store import Store

pytestmark = pytest.mark.integration
T = "orders"


def record_emitter_sequences(channel: object, observed: object, now_ms: int, keep: int = gaps.KEEP_RECENT) -> int:
    """Record a batch with the trace topic read far past it (every gap settled); the new gaps counted."""
    return gaps.record_emitter_sequences(channel, observed, now_ms, keep, settled_ms=10**12).new_gaps  # type: ignore[arg-type]


def seen(*numbers: int, location: str = "sink") -> list[tuple[str, str, int, int]]:
    """(emitter id, location, sequence number, time) of traces or marks of one emitter."""
    return [(f"{location}-e1", location, n, 1000 + n) for n in numbers]


def test_missing_numbers_are_gaps_and_a_late_number_fills_its_gap(store: Store) -> None:
    assert record_emitter_sequences(store.channel, seen(0, 1, 3, 4, 7), 1) == 2
    assert store.channel.trace_gaps("sink") == [(2, 3), (5, 7)]
    assert record_emitter_sequences(store.channel, seen(6), 2) == 0  # 5..7 shrank to 5..6: the same loss, not new
    assert store.channel.trace_gaps("sink") == [(2, 3), (5, 6)]
    record_emitter_sequences(store.channel, seen(2, 5), 3)
    assert store.channel.trace_gaps("sink") == []
    assert store.channel.trace_gaps("other") == []


def test_an_emitter_first_seen_above_zero_lost_its_first_traces(store: Store) -> None:
    record_emitter_sequences(store.channel, seen(3, 4), 1)
    assert store.channel.trace_gaps("sink") == [(0, 3)]


def test_the_gaps_do_not_depend_on_the_order_or_batching_of_arrival(store: Store) -> None:
    numbers = [n for n in range(60) if n not in {4, 5, 17, 40, 41, 42, 59}]
    record_emitter_sequences(store.channel, seen(*numbers), 1)
    expected = store.channel.trace_gaps("sink")
    assert expected == [(4, 6), (17, 18), (40, 43)]
    shuffle = random.Random(7)
    for attempt in range(4):
        location = f"sink{attempt}"
        order = numbers[:]
        shuffle.shuffle(order)
        cuts = sorted(shuffle.sample(range(1, len(order)), 3))
        for batch, (start, stop) in enumerate(itertools.pairwise([0, *cuts, len(order)])):
            record_emitter_sequences(store.channel, seen(*order[start:stop], location=location), batch)
        assert store.channel.trace_gaps(location) == expected, order


def test_numbers_folded_into_the_base_still_fill_their_gap_when_they_arrive_very_late(store: Store) -> None:
    record_emitter_sequences(store.channel, seen(0, 2, 3, 4, 5), 1, keep=2)
    assert store.channel.trace_gaps("sink") == [(1, 2)]
    record_emitter_sequences(store.channel, seen(1), 2, keep=2)
    assert store.channel.trace_gaps("sink") == []


def test_a_very_late_number_splits_a_gap_below_the_base_and_the_pieces_stay(store: Store) -> None:
    record_emitter_sequences(store.channel, seen(0, 4, 5), 1, keep=2)
    record_emitter_sequences(store.channel, seen(10, 11, 12, 13), 2, keep=2)  # 0..5 folded into the base
    assert store.channel.trace_gaps("sink") == [(1, 4), (6, 10)]
    assert record_emitter_sequences(store.channel, seen(2), 3, keep=2) == 0  # a split is no new loss
    assert store.channel.trace_gaps("sink") == [(1, 2), (3, 4), (6, 10)]
    record_emitter_sequences(store.channel, seen(3), 4, keep=2)
    assert store.channel.trace_gaps("sink") == [(1, 2), (6, 10)]


def test_a_replayed_batch_finds_no_new_gap_and_leaves_the_gaps_as_they_were(store: Store) -> None:
    batch = seen(0, 2, 5)
    assert record_emitter_sequences(store.channel, batch, 1) == 2
    assert record_emitter_sequences(store.channel, batch, 2) == 0
    assert store.channel.trace_gaps("sink") == [(1, 2), (3, 5)]


def test_pointers_answer_for_their_exact_position_and_are_kept_once(store: Store) -> None:
    pointers = [("sink", "local", T, 0, 5), ("sink", "local", T, 1, 9), ("proc", "east", T, 0, 5)]
    assert store.channel.record_pointers(pointers, 1_000) == 3
    assert store.channel.record_pointers([*pointers, ("sink", "local", T, 0, 5)], 2_000) == 0  # a replayed batch
    assert store.channel.pointed_at("sink", "local", T, 0, 5)
    assert store.channel.pointed_at("sink", "local", T, 1, 9)
    assert store.channel.pointed_at("proc", "east", T, 0, 5)
    for other in [("sink", "local", T, 0, 6), ("sink", "local", T, 1, 5), ("proc", "local", T, 0, 5)]:
        assert not store.channel.pointed_at(*other), other
    assert not store.channel.pointed_at("sink", "local", "payments", 0, 5)


def test_pruning_drops_pointers_first_seen_before_the_cut(store: Store) -> None:
    store.channel.record_pointers([("sink", "local", T, 0, 1)], 1_000)
    store.channel.record_pointers([("sink", "local", T, 0, 2)], 5_000)
    store.channel.record_pointers([("sink", "local", T, 0, 1)], 6_000)  # seen again: keeps its first time
    assert store.channel.prune_pointers(before_ms=5_000) == 1
    assert not store.channel.pointed_at("sink", "local", T, 0, 1)
    assert store.channel.pointed_at("sink", "local", T, 0, 2)
