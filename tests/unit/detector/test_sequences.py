"""Emitter sequence gaps: lost traces counted, whatever order the numbers arrive in."""

from __future__ import annotations

import itertools
import random

import pytest

from khipu.detector.sequences import EmitterHistory, Run, SequenceGap, absorb


def seen(*numbers: int) -> list[tuple[int, int]]:
    return [(n, 1000 + n) for n in numbers]


def gaps_of(*batches: list[tuple[int, int]], keep: int = 1000) -> tuple[SequenceGap, ...]:
    """Every gap after absorbing the batches, the ones folded into the base included."""
    history, final = EmitterHistory(), {}
    for batch in batches:
        base = history.base_seq
        result = absorb(history, batch, keep)
        final = {g.from_seq: g for g in final.values() if g.from_seq <= base} | {g.from_seq: g for g in result.gaps}
        history = result.history
    return tuple(final[k] for k in sorted(final))


@pytest.mark.parametrize(
    ("numbers", "expected"),
    [
        pytest.param([0, 1, 2], (), id="no gap"),
        pytest.param([0, 2], (SequenceGap(1, 2, 1000, 1002),), id="one lost"),
        pytest.param([0, 1, 4, 5, 7], (SequenceGap(2, 4, 1001, 1004), SequenceGap(6, 7, 1005, 1007)), id="two gaps"),
        pytest.param([3, 4], (SequenceGap(0, 3, 1003, 1003),), id="first seen above zero: its first traces lost"),
        pytest.param([0, 0, 1, 1], (), id="repeats (a replayed batch) are nothing"),
    ],
)
def test_gaps(numbers: list[int], expected: tuple[SequenceGap, ...]) -> None:
    assert gaps_of(seen(*numbers)) == expected
    assert [g.size for g in expected] == [g.to_seq - g.from_seq for g in gaps_of(seen(*numbers))]


NUMBERS = [0, 1, 2, 4, 5, 6, 9, 10, 11, 12, 15]


def test_the_gaps_do_not_depend_on_the_order_or_batching_of_arrival() -> None:
    in_order = gaps_of(seen(*NUMBERS))
    assert [(g.from_seq, g.to_seq) for g in in_order] == [(3, 4), (7, 9), (13, 15)]
    rng = random.Random(4)
    for _ in range(200):
        shuffled = NUMBERS[:]
        rng.shuffle(shuffled)
        cuts = sorted(rng.sample(range(1, len(shuffled)), rng.randint(0, 4)))
        batches = [seen(*shuffled[i:j]) for i, j in itertools.pairwise([0, *cuts, len(shuffled)])]
        assert gaps_of(*batches) == in_order, batches


def test_numbers_are_kept_as_runs() -> None:
    history = absorb(EmitterHistory(), seen(*NUMBERS)).history
    assert history.runs == (
        Run(0, 1000, 2, 1002),
        Run(4, 1004, 6, 1006),
        Run(9, 1009, 12, 1012),
        Run(15, 1015, 15, 1015),
    )
    assert history.max_seq == 15


def test_a_replayed_batch_changes_nothing() -> None:
    first = absorb(EmitterHistory(), seen(*NUMBERS))
    again = absorb(first.history, seen(4, 5, 9))
    assert not again.changed and again.gaps == first.gaps and again.history == first.history


def test_runs_far_behind_fold_into_the_base_and_a_later_number_is_reported_late() -> None:
    result = absorb(EmitterHistory(), seen(0, 1, 3, 4, 20, 21), keep=10)
    assert result.history.base_seq == 4 and result.history.base_ms == 1004
    assert result.history.runs == (Run(20, 1020, 21, 1021),)
    assert [(g.from_seq, g.to_seq) for g in result.gaps] == [(2, 3), (5, 20)]  # all recomputed this time
    after = absorb(result.history, seen(2, 22), keep=10)
    assert after.late == (2,)  # below the base: it can only fill a stored gap
    assert [(g.from_seq, g.to_seq) for g in after.gaps] == [(5, 20)]  # above the base: recomputed


def test_keep_must_be_positive() -> None:
    with pytest.raises(ValueError, match="keep must be at least 1, got 0"):
        absorb(EmitterHistory(), [], keep=0)


def _absorb_one_by_one(history: EmitterHistory, seen: list[tuple[int, int]], keep: int) -> tuple[object, ...]:
    """The first implementation, number by number (the reference for the runs-at-once one)."""
    from bisect import bisect_right

    runs = list(history.runs)
    starts = [run.first_seq for run in runs]
    late: set[int] = set()
    fresh: dict[int, int] = {}
    for seq, at_ms in seen:
        if seq <= history.base_seq:
            late.add(seq)
            continue
        at = bisect_right(starts, seq) - 1
        if at < 0 or runs[at].last_seq < seq:
            fresh.setdefault(seq, at_ms)
    pieces = sorted([*runs, *(Run(seq, ms, seq, ms) for seq, ms in sorted(fresh.items()))], key=lambda r: r.first_seq)
    merged: list[Run] = []
    for run in pieces:
        if merged and run.first_seq <= merged[-1].last_seq + 1:
            last = merged[-1]
            if run.last_seq > last.last_seq:
                merged[-1] = Run(last.first_seq, last.first_ms, run.last_seq, run.last_ms)
        else:
            merged.append(run)
    horizon = merged[-1].last_seq - keep if merged else history.base_seq
    folded = [run for run in merged if run.last_seq <= horizon]
    base = (folded[-1].last_seq, folded[-1].last_ms) if folded else (history.base_seq, history.base_ms)
    return base, tuple(r for r in merged if r.last_seq > horizon), tuple(sorted(late)), bool(fresh)


@pytest.mark.parametrize("seed", range(5))
def test_numbers_absorbed_as_runs_say_what_absorbing_them_one_by_one_says(seed: int) -> None:
    rng = random.Random(seed)
    history = EmitterHistory()
    for _ in range(60):
        numbers = [rng.randrange(0, 400) for _ in range(rng.randrange(0, 40))]
        batch = [(n, 5_000 + rng.randrange(1000)) for n in numbers]
        expected = _absorb_one_by_one(history, batch, keep=120)
        result = absorb(history, batch, keep=120)
        got = ((result.history.base_seq, result.history.base_ms), result.history.runs, result.late, result.changed)
        assert got == expected
        history = result.history
