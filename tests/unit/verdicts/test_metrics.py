"""A minute's metrics from its verdicts, as numbered tables of cases, each with the reason its answer is right:
the metrics, the latency buckets, and the counts they are derived from, which add up and take away."""

from __future__ import annotations

import random
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pytest

from khipu.verdicts.metrics import (
    MINUTE_MS,
    MinuteCounts,
    MinuteKey,
    MinuteMetrics,
    change_counts,
    counts_by_hop,
    counts_by_minute,
    counts_by_minute_columns,
    histogram_percentile,
    latency_bucket,
    latency_buckets,
    metrics_of,
    minute_metrics,
    minutes_touched,
    percentile,
    verdict_counts,
)

KEY = MinuteKey("orders", "orders/sink", 5 * MINUTE_MS)


class Stored(NamedTuple):
    verdict: str
    latency_ms: int | None = None
    cause: str | None = None


class Case(NamedTuple):
    number: int
    outcomes: list[Stored]
    counts: tuple[int, int, int, int, int]  # delivered, lost, duplicate, trace_lost, pending
    rates: tuple[float, float]  # loss, duplicate
    latencies: tuple[int | None, int | None, int | None]  # p50, p95, p99
    reason: str


def delivered(*latencies: int | None) -> list[Stored]:
    return [Stored("DELIVERED", ms) for ms in latencies]


# fmt: off
CASES = [
    Case(1, [], (0, 0, 0, 0, 0), (0.0, 0.0), (None, None, None),
         "no verdict in the minute: zero counts, rates over one verdict rather than a division by zero"),
    Case(2, delivered(30, 10, 20), (3, 0, 0, 0, 0), (0.0, 0.0), (20, 30, 30),
         "three latencies sorted 10, 20, 30: the median is the middle one; 95 % of the way rounds to the last"),
    Case(3, [*delivered(5, 5, 5), Stored("LOST")], (3, 1, 0, 0, 0), (0.25, 0.0), (5, 5, 5),
         "one LOST among four verdicts: loss rate 1/4; the LOST has no latency and adds none"),
    Case(4, [Stored("DUPLICATE", 7), *delivered(9)], (1, 0, 1, 0, 0), (0.0, 0.5), (7, 9, 9),
         "a duplicate is a verdict with its own latency: duplicate rate 1/2, two latencies"),
    Case(5, [Stored("LOST"), Stored("PENDING"), Stored("TRACE_LOST"), Stored("TRACE_LOST")],
         (0, 1, 0, 2, 1), (0.25, 0.0), (None, None, None),
         "PENDING and TRACE_LOST are judged verdicts too: they count in the denominator"),
    Case(6, [Stored("CONFIRMED_LOST"), Stored("RETRACTED", 50), *delivered(10)], (1, 0, 0, 0, 0), (1 / 3, 0.0),
         (10, 50, 50),
         "final verdicts count: a confirmed loss is a loss (1 of 3 verdicts); a retracted one was delivered late "
         "and has its latency"),
    Case(7, delivered(None, 8, None), (3, 0, 0, 0, 0), (0.0, 0.0), (8, 8, 8),
         "verdicts without a latency are counted but leave the percentiles to those that have one"),
    Case(8, delivered(20, 10), (2, 0, 0, 0, 0), (0.0, 0.0), (10, 20, 20),
         "two latencies: the median's rank 0.5 rounds half to even, to the lower one"),
    Case(9, delivered(*range(100, -1, -1)), (101, 0, 0, 0, 0), (0.0, 0.0), (50, 95, 99),
         "latencies 0..100 in any order: each percentile is the value of its rank"),
    Case(10, [*delivered(5, 5), Stored("LOST"), Stored("ABORTED"), Stored("ABORTED"), Stored("SUPERSEDED")],
         (2, 1, 0, 0, 0), (1 / 3, 0.0), (5, 5, 5),
         "ABORTED and SUPERSEDED are Kafka working as designed: counted apart, in no rate's denominator (1 loss "
         "of 3 judged, not of 6)"),
    Case(11, [Stored("DUPLICATE", 9, "reprocessed_after_abort"), Stored("DUPLICATE", 7, "rewind_replay"),
              *delivered(8, 8)], (2, 0, 1, 0, 0), (0.0, 0.25), (8, 9, 9),
         "a re-read by an exactly-once processor after an abort is shown but not a duplicate against the stream: "
         "1 duplicate of 4 judged; its latency is a latency all the same"),
    Case(12, [*delivered(10, 20, -30_412, -5)], (4, 0, 0, 0, 0), (0.0, 0.0), (10, 20, 20),
         "a negative latency (received before it was written) is clock skew, never a latency: counted apart, the "
         "percentiles are of 10 and 20 only"),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=[f"{c.number}" for c in CASES])
def test_minute_metrics(case: Case) -> None:
    got = minute_metrics(KEY, case.outcomes)
    assert (got.stream, got.hop, got.minute_ms) == KEY, case.reason
    assert (got.delivered, got.lost, got.duplicate, got.trace_lost, got.pending) == case.counts, case.reason
    assert (got.loss_rate, got.duplicate_rate) == case.rates, case.reason
    assert (got.latency_p50_ms, got.latency_p95_ms, got.latency_p99_ms) == case.latencies, case.reason
    kinds = [o.verdict for o in case.outcomes]
    assert (got.aborted, got.superseded) == (kinds.count("ABORTED"), kinds.count("SUPERSEDED")), case.reason
    assert got.reprocessed == sum(o.cause == "reprocessed_after_abort" for o in case.outcomes), case.reason
    negative = [o.latency_ms for o in case.outcomes if o.latency_ms is not None and o.latency_ms < 0]
    assert got.skewed == len(negative), case.reason
    assert got.skew_worst_ms == (latency_bucket(min(negative)) if negative else None), case.reason


def test_the_columns_of_a_batch_count_as_the_rows_do() -> None:
    """counts_by_minute_columns (the detector's writer, numpy) and counts_by_minute (a row at a time) agree, with
    causes, Kafka's semantics and skew in the mix."""
    rng = random.Random(3)
    kinds = [
        ("DELIVERED", None), ("DUPLICATE", "rewind_replay"), ("DUPLICATE", "reprocessed_after_abort"),
        ("LOST", "skipped_by_consumer"), ("ABORTED", None), ("SUPERSEDED", "compacted"), ("RESENT", None),
    ]  # fmt: skip
    rows = []
    for _ in range(2_000):
        verdict, cause = rng.choice(kinds)
        latency = rng.choice([None, rng.randrange(0, 5_000), rng.randrange(-40_000, 0)])
        rows.append({"stream": rng.choice("ab"), "hop": rng.choice("xyz"), "verdict": verdict, "cause": cause,
                     "decided_ms": rng.randrange(0, 5 * MINUTE_MS), "latency_ms": latency})  # fmt: skip
    columns = {name: [row[name] for row in rows] for name in rows[0]}
    by_columns = counts_by_minute_columns(
        columns["stream"], columns["hop"], columns["verdict"], columns["decided_ms"], columns["latency_ms"],
        columns["cause"],
    )  # fmt: skip
    assert by_columns == counts_by_minute(rows)
    assert sum(c.reprocessed for c in by_columns.values()) == sum(r["cause"] == "reprocessed_after_abort" for r in rows)
    assert sum(c.skewed for c in by_columns.values()) == sum((r["latency_ms"] or 0) < 0 for r in rows)


def test_the_numbers_are_the_same_however_the_verdicts_are_ordered() -> None:
    outcomes = [Stored("LOST"), *delivered(3, 1, 2), Stored("DUPLICATE", 9)]
    first: MinuteMetrics = minute_metrics(KEY, outcomes)
    assert minute_metrics(KEY, list(reversed(outcomes))) == first


def test_a_batch_touches_each_minute_of_each_stream_and_hop_once_at_the_minute_start() -> None:
    rows = [
        {"stream": "orders", "hop": "a", "decided_ms": MINUTE_MS - 1},
        {"stream": "orders", "hop": "a", "decided_ms": 0},  # the same minute again
        {"stream": "orders", "hop": "a", "decided_ms": MINUTE_MS},  # the next minute starts here
        {"stream": "orders", "hop": "b", "decided_ms": 10},
        {"stream": "payments", "hop": "a", "decided_ms": 3 * MINUTE_MS + 5},
    ]
    assert minutes_touched(rows) == [
        MinuteKey("orders", "a", 0),
        MinuteKey("orders", "a", MINUTE_MS),
        MinuteKey("orders", "b", 0),
        MinuteKey("payments", "a", 3 * MINUTE_MS),
    ]
    assert MinuteKey("orders", "a", MINUTE_MS).span == ("orders", "a", MINUTE_MS, 2 * MINUTE_MS)


def test_false_loss_rate_is_retracted_over_every_loss_once_said() -> None:
    outcomes = [Stored("LOST"), Stored("CONFIRMED_LOST"), Stored("RETRACTED", 5), Stored("RETRACTED", 6), *delivered(1)]
    got = minute_metrics(KEY, outcomes)
    assert (got.confirmed_lost, got.retracted, got.false_loss_rate) == (1, 2, 0.5)  # 2 of 4 LOSTs were false
    assert minute_metrics(KEY, delivered(1)).false_loss_rate is None  # no loss said: no rate to speak of


class Bucketed(NamedTuple):
    number: int
    latency_ms: int
    bucket: int
    reason: str


# fmt: off
BUCKETS = [
    Bucketed(1, 0, 0, "zero is its own bucket"),
    Bucketed(2, 999, 999, "below a second every millisecond is its own bucket"),
    Bucketed(3, 1000, 1000, "1000 ms is exact: three significant digits already"),
    Bucketed(4, 1001, 1000, "above a second, rounded down to three significant digits: 1,00x -> 1,000"),
    Bucketed(5, 1009, 1000, "still the 1,000 bucket: a bucket is never above its latencies"),
    Bucketed(6, 1010, 1010, "the next bucket starts 10 ms on"),
    Bucketed(7, 9999, 9990, "four digits: tens"),
    Bucketed(8, 10_000, 10_000, "a power of ten is its own bucket"),
    Bucketed(9, 12_345, 12_300, "five digits: hundreds (the brief's example)"),
    Bucketed(10, 10**9, 10**9, "a billion is a power of ten, exact"),
    Bucketed(11, 1_234_567_890, 1_230_000_000, "ten digits: rounded down to tens of millions"),
    Bucketed(12, -1, -1, "a negative latency (clock skew) within a second stays exact"),
    Bucketed(13, -999, -999, "down to -999 ms"),
    Bucketed(14, -1001, -1000, "beyond -1 s the scheme mirrors: magnitude rounded toward zero"),
    Bucketed(15, -12_345, -12_300, "mirrored: -12,345 -> -12,300, the negative of 12,345's bucket"),
    Bucketed(16, 2**63 - 1, 9_220_000_000_000_000_000, "the largest int64 still has a bucket"),
]
# fmt: on


@pytest.mark.parametrize("case", BUCKETS, ids=[f"{c.number}" for c in BUCKETS])
def test_latency_bucket(case: Bucketed) -> None:
    assert latency_bucket(case.latency_ms) == case.bucket, case.reason
    assert latency_buckets(np.array([case.latency_ms], dtype=np.int64)).tolist() == [case.bucket], case.reason


def test_the_vectorised_buckets_are_the_same_as_one_at_a_time() -> None:
    rng = random.Random(11)
    edges = [b.latency_ms for b in BUCKETS] + [10**k + d for k in range(1, 19) for d in (-1, 0, 1)]
    drawn = [int(10 ** rng.uniform(0, 18.9)) * rng.choice((1, -1)) for _ in range(20_000)]
    values = [v for v in edges + [-v for v in edges] + drawn if abs(v) < 2**63]
    assert latency_buckets(np.array(values, dtype=np.int64)).tolist() == [latency_bucket(v) for v in values]


def test_a_bucket_keeps_its_sign_is_never_further_from_zero_and_is_its_own_bucket() -> None:
    for value in range(-25_000, 25_000, 7):
        bucket = latency_bucket(value)
        assert abs(bucket) <= abs(value) and (bucket == 0 or (bucket > 0) == (value > 0))
        assert latency_bucket(bucket) == bucket and latency_bucket(-value) == -bucket
        assert abs(value) - abs(bucket) < max(1, abs(value) // 100)  # off by less than 1 %


def test_the_lowest_int64_has_no_magnitude_and_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="latency -9223372036854775808 ms has no int64 magnitude"):
        latency_buckets(np.array([5, -(2**63)], dtype=np.int64))


def test_latencies_above_a_second_are_counted_and_ranked_by_their_bucket() -> None:
    got = minute_metrics(KEY, delivered(1_234, 12_345, 12_399, 900))
    assert (got.latency_p50_ms, got.latency_p95_ms, got.latency_p99_ms) == (12_300, 12_300, 12_300)
    assert MinuteCounts.of(delivered(1_234, 12_345, 12_399, 900)).latency_histogram == {900: 1, 1_230: 1, 12_300: 2}
    assert minute_metrics(KEY, delivered(1_234, 900)).latency_p50_ms == 900  # rank 0.5 rounds to even: the lower


def test_percentiles_of_a_histogram_are_those_of_its_latencies_when_each_is_its_own_bucket() -> None:
    rng = random.Random(5)
    for _ in range(200):
        values = [rng.randint(0, 1000) for _ in range(rng.randint(1, 60))]
        histogram = MinuteCounts.of(delivered(*values)).latency_histogram
        for fraction in (0.0, 0.5, 0.95, 0.99, 1.0):
            assert histogram_percentile(histogram, fraction) == percentile(values, fraction)
    assert histogram_percentile({}, 0.5) is None and histogram_percentile({10: -1}, 0.5) is None  # a delta's


OUTCOMES = [
    Stored("LOST"),
    Stored("RESENT", 40),
    Stored("UNRECOVERABLE"),
    Stored("RETRACTED", 1_500),
    Stored("DUPLICATE", 12_345),
    Stored("PENDING"),
    Stored("TRACE_LOST", -3),
    *delivered(5, 5, None, 999, 1_001),
]


def test_counts_of_two_sets_of_verdicts_are_the_sum_of_their_counts() -> None:
    for cut in range(len(OUTCOMES) + 1):
        first, second = OUTCOMES[:cut], OUTCOMES[cut:]
        assert MinuteCounts.of(first).plus(MinuteCounts.of(second)) == MinuteCounts.of(OUTCOMES), cut
        assert metrics_of(KEY, MinuteCounts.of(first).plus(MinuteCounts.of(second))) == minute_metrics(KEY, OUTCOMES)


def test_minus_undoes_plus_and_drops_the_buckets_it_empties() -> None:
    whole, part = MinuteCounts.of(OUTCOMES), MinuteCounts.of(OUTCOMES[:4])
    assert whole.minus(part).plus(part) == whole
    assert whole.plus(part).minus(part) == whole
    assert part.minus(part) == MinuteCounts() and part.minus(part).latency_histogram == {}
    delta = MinuteCounts.of([Stored("DUPLICATE", 7)]).minus(MinuteCounts.of([Stored("DELIVERED", 7)]))
    assert (delta.delivered, delta.duplicate, delta.latency_histogram) == (-1, 1, {})  # same latency: no move


def test_resent_and_unrecoverable_count_as_confirmed_losses() -> None:
    counts = MinuteCounts.of(OUTCOMES)
    assert (counts.lost, counts.confirmed_lost, counts.verdicts) == (1, 2, len(OUTCOMES))
    assert (counts.latency_count, counts.latency_sum_ms) == (7, 40 + 1_500 + 12_300 + 5 + 5 + 999 + 1_000)
    assert counts.skew_histogram == {-3: 1}  # the one impossible latency, apart


def test_the_histogram_is_compact_json_and_reads_back() -> None:
    counts = MinuteCounts.of(OUTCOMES)
    text = counts.histogram_json()
    assert text == '{"5":2,"40":1,"999":1,"1000":1,"1500":1,"12300":1}'
    assert counts.skew_json() == '{"-3":1}'
    assert MinuteCounts.histogram_of_json(text) == counts.latency_histogram
    assert MinuteCounts.histogram_of_json(None) == {} == MinuteCounts.histogram_of_json("")
    row = {"delivered": 4, "lost": 1, "latency_histogram": text, "pending": None, "skew_histogram": '{"-3":1}'}
    assert MinuteCounts.of_row(row) == MinuteCounts(
        delivered=4, lost=1, latency_histogram=counts.latency_histogram, skew_histogram={-3: 1}
    )
    with pytest.raises(ValueError, match=r"latency histogram '\[1, 2\]' is not a JSON object of bucket -> count"):
        MinuteCounts.histogram_of_json("[1, 2]")


def test_a_verdict_of_a_kind_the_metrics_do_not_know_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="verdict 'MAYBE' is not a kind the metrics count; expected one of"):
        MinuteCounts.of([Stored("MAYBE")])


def row(stream: str, hop: str, verdict: str, decided_ms: int, latency_ms: int | None) -> dict[str, Any]:
    return {"stream": stream, "hop": hop, "verdict": verdict, "decided_ms": decided_ms, "latency_ms": latency_ms}


def random_rows(count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    kinds = ["DELIVERED"] * 20 + ["LOST", "DUPLICATE", "TRACE_LOST", "PENDING", "CONFIRMED_LOST", "RETRACTED",
                                  "RESENT", "UNRECOVERABLE"]  # fmt: skip
    return [
        row(
            rng.choice(("orders", "payments")),
            rng.choice(("a -> b", "b -> c", "c -> d")),
            rng.choice(kinds),
            rng.randint(0, 6 * MINUTE_MS - 1),
            None if rng.random() < 0.1 else rng.choice((rng.randint(-50, 1_200), rng.randint(0, 10**7))),
        )
        for _ in range(count)
    ]


def test_counts_by_minute_group_rows_by_stream_hop_and_the_minute_decided_in() -> None:
    rows = [
        row("orders", "a", "DELIVERED", MINUTE_MS - 1, 10),
        row("orders", "a", "RESENT", 0, None),
        row("orders", "a", "LOST", MINUTE_MS, None),  # the next minute
        row("payments", "a", "DELIVERED", 5, 1_234),
    ]
    assert counts_by_minute(rows) == {
        MinuteKey("orders", "a", 0): MinuteCounts(delivered=1, confirmed_lost=1, latency_histogram={10: 1}),
        MinuteKey("orders", "a", MINUTE_MS): MinuteCounts(lost=1),
        MinuteKey("payments", "a", 0): MinuteCounts(delivered=1, latency_histogram={1_230: 1}),
    }


def test_the_columns_variant_counts_as_the_rows_one_does() -> None:
    rows = random_rows(5_000, seed=3)

    def column(name: str) -> list[Any]:
        return [r[name] for r in rows]

    expected = counts_by_minute(rows)
    assert len(expected) == 2 * 3 * 6
    as_numpy = counts_by_minute_columns(
        np.array(column("stream")),
        np.array(column("hop"), dtype=object),
        np.array(column("verdict")),
        np.array(column("decided_ms"), dtype=np.int64),
        np.array([np.nan if v is None else v for v in column("latency_ms")]),  # null as NaN
    )
    assert as_numpy == expected
    as_arrow = counts_by_minute_columns(*(pa.array(column(n)) for n in ("stream", "hop", "verdict", "decided_ms",
                                                                        "latency_ms")))  # fmt: skip
    assert as_arrow == expected  # a pyarrow null is a verdict without a latency
    assert counts_by_minute_columns([], [], [], [], []) == {} == counts_by_minute([])


def test_the_columns_variant_refuses_columns_of_different_lengths_and_null_verdicts() -> None:
    with pytest.raises(ValueError, match="one value per verdict; got lengths"):
        counts_by_minute_columns(["s"], ["h"], ["DELIVERED"], [1, 2], [None])
    with pytest.raises(ValueError, match=r"1 of 2 rows have no verdict \(null in the verdict column\)"):
        counts_by_minute_columns(["s", "s"], ["h", "h"], ["DELIVERED", None], [1, 2], [None, None])


def test_a_change_moves_one_count_from_the_previous_verdict_to_the_new_one() -> None:
    lost = row("orders", "a", "LOST", 30_000, None)
    retracted = row("orders", "a", "RETRACTED", 30_000, 900)
    assert change_counts([retracted], [lost]) == {
        MinuteKey("orders", "a", 0): MinuteCounts(lost=-1, retracted=1, latency_histogram={900: 1})
    }
    first = row("orders", "a", "LOST", 90_000, None)
    assert change_counts([first], []) == {MinuteKey("orders", "a", MINUTE_MS): MinuteCounts(lost=1)}
    moved = change_counts([row("orders", "a", "DUPLICATE", 90_000, 5)], [row("orders", "a", "DELIVERED", 30_000, 5)])
    assert moved == {
        MinuteKey("orders", "a", 0): MinuteCounts(delivered=-1, latency_histogram={5: -1}),
        MinuteKey("orders", "a", MINUTE_MS): MinuteCounts(duplicate=1, latency_histogram={5: 1}),
    }  # each in its own minute
    assert change_counts([lost], [lost]) == {}  # nothing moves: no minute to touch


def test_a_windows_verdicts_are_the_exceptions_rows_and_delivered_from_the_minutes() -> None:
    minutes = [
        {"stream": "orders", "hop": "a", "minute_ms": 0, "delivered": 5, "lost": 1, "latency_histogram": '{"7":5}'},
        {"stream": "orders", "hop": "a", "minute_ms": MINUTE_MS, "delivered": 2, "latency_histogram": None},
        {"stream": "orders", "hop": "b", "minute_ms": 0, "delivered": 0, "duplicate": 1},
    ]
    exceptions = {("orders", "a", "LOST", "skipped_by_consumer"): 1, ("orders", "a", "DELIVERED", ""): 1}
    assert verdict_counts(exceptions, minutes) == {
        ("orders", "a", "LOST", "skipped_by_consumer"): 1,  # causes come from the rows
        ("orders", "a", "DELIVERED", ""): 7,  # every DELIVERED of the minutes, rows or archived
    }
    by_hop = counts_by_hop(minutes)
    assert by_hop[("orders", "a")] == MinuteCounts(delivered=7, lost=1, latency_histogram={7: 5})
    assert by_hop[("orders", "a")].latencies_at_most([5, 7, 100]) == [0, 5, 5]
