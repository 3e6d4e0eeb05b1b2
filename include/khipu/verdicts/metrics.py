"""Per-minute metrics of verdicts: counts per kind, loss and duplicate rates, latency percentiles.

A minute's metrics are derived (:func:`metrics_of`) from mergeable counts (:class:`MinuteCounts`: how
many verdicts of each kind, and a histogram of their latencies), so whoever writes verdicts aggregates
them and no one reads a minute's verdicts back:

- the detector's writer adds up the verdicts it writes to the verdict archive per (stream, hop,
  minute) (:func:`counts_by_minute_columns`) and stores them as a part of its own per micro-batch
  (``store.verdicts.replace_part``: a replayed batch replaces its part);
- every change of an SQL-stored verdict moves its counts (:func:`change_counts`: +1 for the new
  verdict, -1 for the one it replaces, wherever that one was kept) in the same transaction as the row
  (``store.verdicts.store_changes``);
- the store sums a minute's parts and hands the sum to :func:`metrics_of` for the rates and percentiles.

Latencies are counted per bucket (:func:`latency_bucket`): exact up to 1 s, three significant digits
above, so a minute's histogram stays small however many verdicts it has and the percentiles are exact
where latencies are small (off by less than 1 % above a second).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from khipu.verdicts.model import VerdictKind

MINUTE_MS = 60_000
COUNTED = (
    VerdictKind.DELIVERED,
    VerdictKind.LOST,
    VerdictKind.DUPLICATE,
    VerdictKind.TRACE_LOST,
    VerdictKind.PENDING,
    VerdictKind.CONFIRMED_LOST,
    VerdictKind.RETRACTED,
)  # every kind a stored verdict has; the rates are shares of these
# a resent or unrecoverable loss was a confirmed loss all the same: its minute's loss rate does not change
COUNTED_AS = {VerdictKind.RESENT: VerdictKind.CONFIRMED_LOST, VerdictKind.UNRECOVERABLE: VerdictKind.CONFIRMED_LOST}
COUNT_NAMES = tuple(kind.value.lower() for kind in COUNTED)  # MinuteCounts' fields and the stored count columns
EXACT_UP_TO_MS = 1000  # latencies up to here keep their own bucket
_COUNT_OF = {kind.value: kind.value.lower() for kind in COUNTED} | {
    kind.value: counted.value.lower() for kind, counted in COUNTED_AS.items()
}  # a verdict kind -> the count it adds to
_DECADES = 10 ** np.arange(3, 19, dtype=np.int64)  # 1e3 .. 1e18: each one reached drops one more digit
_SCALES = 10 ** np.arange(0, 17, dtype=np.int64)


class Outcome(Protocol):
    """What the metrics read of one verdict."""

    @property
    def verdict(self) -> str: ...
    @property
    def latency_ms(self) -> int | None: ...


class CountsLike(Protocol):
    """Counts of a minute: a :class:`MinuteCounts`, or the store's sum of a minute's parts."""

    @property
    def delivered(self) -> int: ...
    @property
    def lost(self) -> int: ...
    @property
    def duplicate(self) -> int: ...
    @property
    def trace_lost(self) -> int: ...
    @property
    def pending(self) -> int: ...
    @property
    def confirmed_lost(self) -> int: ...
    @property
    def retracted(self) -> int: ...
    @property
    def latency_histogram(self) -> Mapping[int, int]: ...


class MinuteKey(NamedTuple):
    stream: str
    hop: str
    minute_ms: int  # the minute's start

    @property
    def span(self) -> tuple[str, str, int, int]:
        """(stream, hop, from_ms, to_ms): the verdicts decided in this minute."""
        return self.stream, self.hop, self.minute_ms, self.minute_ms + MINUTE_MS


@dataclass(frozen=True, slots=True)
class MinuteMetrics:
    stream: str
    hop: str
    minute_ms: int
    delivered: int
    lost: int
    duplicate: int
    trace_lost: int
    pending: int
    confirmed_lost: int
    retracted: int
    false_loss_rate: float | None  # retracted / provisional LOST (lost + confirmed + retracted); None: no loss said
    loss_rate: float  # (lost + confirmed lost) / verdicts counted (0 when none)
    duplicate_rate: float
    latency_p50_ms: int | None  # None: no verdict of the minute has a latency
    latency_p95_ms: int | None
    latency_p99_ms: int | None


def latency_bucket(ms: int) -> int:
    """The bucket a latency is counted in: the latency itself from -1000 to 1000 ms; beyond, its magnitude
    rounded toward zero to three significant digits (12,345 -> 12,300; 1,009 -> 1,000; -12,345 -> -12,300).

    Negative latencies (clocks of two hosts apart) mirror the positive scheme rather than stay exact, so a
    skewed host cannot fill a histogram with one bucket per millisecond; a bucket is never further from
    zero than its latencies, and ``latency_bucket(-ms) == -latency_bucket(ms)``."""
    magnitude, scale = abs(ms), 1
    while magnitude >= EXACT_UP_TO_MS * scale:  # 1,000 .. 9,999: tens; 10,000 .. 99,999: hundreds; ...
        scale *= 10
    bucket = magnitude // scale * scale
    return bucket if ms >= 0 else -bucket


def latency_buckets(values: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """:func:`latency_bucket` of each latency of an int64 array, vectorised (no Python loop per value)."""
    latencies = np.asarray(values, dtype=np.int64)
    lowest = np.iinfo(np.int64).min
    if latencies.size and latencies.min() == lowest:
        raise ValueError(f"latency {lowest} ms has no int64 magnitude; expected latencies within ±(2**63 - 1) ms")
    magnitudes = np.abs(latencies)
    scales = _SCALES[np.searchsorted(_DECADES, magnitudes, side="right")]
    buckets: npt.NDArray[np.int64] = np.sign(latencies) * (magnitudes // scales * scales)
    return buckets


@dataclass(frozen=True, slots=True)
class MinuteCounts:
    """How many verdicts of each counted kind, and how many latencies in each bucket (zero entries
    dropped). Counts add up (:meth:`plus`) and a change is the difference of two (:meth:`minus`), so they
    may be negative in a delta; a minute's sum of every part never is."""

    delivered: int = 0
    lost: int = 0
    duplicate: int = 0
    trace_lost: int = 0
    pending: int = 0
    confirmed_lost: int = 0
    retracted: int = 0
    latency_histogram: Mapping[int, int] = field(default_factory=dict)  # latency_bucket -> latencies in it

    def __post_init__(self) -> None:
        histogram = dict(self.latency_histogram)  # its own copy: the value stays as it was made
        if 0 in histogram.values():
            histogram = {bucket: count for bucket, count in histogram.items() if count}
        object.__setattr__(self, "latency_histogram", histogram)

    @classmethod
    def of(cls, outcomes: Iterable[Outcome]) -> MinuteCounts:
        """The counts of these verdicts (RESENT and UNRECOVERABLE count as confirmed losses)."""
        counts: Counter[str] = Counter()
        latencies: Counter[int] = Counter()
        for outcome in outcomes:
            counts[count_name(outcome.verdict)] += 1
            if outcome.latency_ms is not None:
                latencies[latency_bucket(int(outcome.latency_ms))] += 1
        return _made(counts, latencies)

    @classmethod
    def like(cls, counts: CountsLike) -> MinuteCounts:
        """The same counts as a :class:`MinuteCounts`."""
        return _made({name: int(getattr(counts, name)) for name in COUNT_NAMES}, counts.latency_histogram)

    @classmethod
    def of_row(cls, row: Mapping[str, Any]) -> MinuteCounts:
        """The counts of a stored ``verdict_metrics`` or ``verdict_metric_parts`` row: its count columns and its
        ``latency_histogram`` text (none in a minute stored before migration 0008: no latencies)."""
        counts = {name: int(row.get(name) or 0) for name in COUNT_NAMES}
        return _made(counts, cls.histogram_of_json(row.get("latency_histogram")))

    @property
    def verdicts(self) -> int:
        """Every verdict counted (the rates' denominator)."""
        return sum(getattr(self, name) for name in COUNT_NAMES)

    @property
    def latency_count(self) -> int:
        """How many of the verdicts have a latency."""
        return sum(self.latency_histogram.values())

    @property
    def latency_sum_ms(self) -> int:
        """The sum of the latencies, each as its bucket (exact up to 1 s, a little under above)."""
        return sum(bucket * count for bucket, count in self.latency_histogram.items())

    def latencies_at_most(self, bounds_ms: Sequence[int]) -> list[int]:
        """How many latencies are in a bucket <= each bound (cumulative: a Prometheus histogram's ``le``)."""
        return [sum(n for bucket, n in self.latency_histogram.items() if bucket <= bound) for bound in bounds_ms]

    def plus(self, other: CountsLike) -> MinuteCounts:
        return self._combined(other, 1)

    def minus(self, other: CountsLike) -> MinuteCounts:
        return self._combined(other, -1)

    def _combined(self, other: CountsLike, sign: int) -> MinuteCounts:
        histogram = Counter(self.latency_histogram)
        for bucket, count in other.latency_histogram.items():
            histogram[bucket] += sign * count
        return _made({name: getattr(self, name) + sign * getattr(other, name) for name in COUNT_NAMES}, histogram)

    def histogram_json(self) -> str:
        """The histogram as compact JSON text, buckets in order: ``{"-3":1,"120":4,"12300":1}``."""
        entries = {str(bucket): self.latency_histogram[bucket] for bucket in sorted(self.latency_histogram)}
        return json.dumps(entries, separators=(",", ":"))

    @staticmethod
    def histogram_of_json(text: str | None) -> dict[int, int]:
        """The histogram :meth:`histogram_json` wrote (None or empty text: no latencies)."""
        if not text:
            return {}
        try:
            parsed = json.loads(text)
            if not isinstance(parsed, dict):
                raise TypeError(type(parsed).__name__)
            return _histogram((int(bucket), int(count)) for bucket, count in parsed.items())
        except (ValueError, TypeError) as exc:
            shown = text if len(text) <= 80 else f"{text[:77]}..."
            raise ValueError(
                f'latency histogram {shown!r} is not a JSON object of bucket -> count, e.g. {{"120":4}} ({exc})'
            ) from None


def _made(counts: Mapping[str, int], histogram: Mapping[int, int]) -> MinuteCounts:
    """A :class:`MinuteCounts` of counts by name (:data:`COUNT_NAMES`)."""
    return MinuteCounts(
        delivered=counts["delivered"],
        lost=counts["lost"],
        duplicate=counts["duplicate"],
        trace_lost=counts["trace_lost"],
        pending=counts["pending"],
        confirmed_lost=counts["confirmed_lost"],
        retracted=counts["retracted"],
        latency_histogram=histogram,
    )


def _histogram(entries: Iterable[tuple[int, int]]) -> dict[int, int]:
    """A histogram's entries added up per bucket, zero entries dropped, buckets in order."""
    summed: Counter[int] = Counter()
    for bucket, count in entries:
        summed[int(bucket)] += int(count)
    return {bucket: summed[bucket] for bucket in sorted(summed) if summed[bucket]}


def count_name(verdict: str) -> str:
    """The count a verdict kind adds to (``"RESENT"`` -> ``"confirmed_lost"``)."""
    try:
        return _COUNT_OF[verdict]
    except KeyError:
        known = ", ".join(sorted(_COUNT_OF))
        raise ValueError(f"verdict {verdict!r} is not a kind the metrics count; expected one of {known}") from None


def minute_of(decided_ms: int) -> int:
    return decided_ms // MINUTE_MS * MINUTE_MS


def minutes_touched(rows: Iterable[Mapping[str, Any]]) -> list[MinuteKey]:
    """The (stream, hop, minute) of each verdict row (``stream``, ``hop``, ``decided_ms``), once each, sorted."""
    return sorted({MinuteKey(r["stream"], r["hop"], minute_of(int(r["decided_ms"]))) for r in rows})


class _RowOutcome(NamedTuple):
    verdict: str
    latency_ms: int | None


def counts_by_minute(rows: Iterable[Mapping[str, Any]]) -> dict[MinuteKey, MinuteCounts]:
    """The counts of verdict rows (``stream``, ``hop``, ``verdict``, ``decided_ms``, ``latency_ms``) per
    (stream, hop, minute decided in). For a few rows; :func:`counts_by_minute_columns` for a batch."""
    grouped: dict[MinuteKey, list[_RowOutcome]] = {}
    for row in rows:
        key = MinuteKey(row["stream"], row["hop"], minute_of(int(row["decided_ms"])))
        latency = row.get("latency_ms")
        grouped.setdefault(key, []).append(_RowOutcome(row["verdict"], None if latency is None else int(latency)))
    return {key: MinuteCounts.of(outcomes) for key, outcomes in sorted(grouped.items())}


def counts_by_minute_columns(
    stream: npt.ArrayLike,
    hop: npt.ArrayLike,
    verdict: npt.ArrayLike,
    decided_ms: npt.ArrayLike,
    latency_ms: npt.ArrayLike,
) -> dict[MinuteKey, MinuteCounts]:
    """:func:`counts_by_minute` of a batch given as columns (numpy arrays, pyarrow arrays, pandas series), with
    numpy: no Python loop per row, only one per (stream, hop, minute) of the batch. ``latency_ms`` marks a
    verdict without a latency as null (None, NaN, a pyarrow null)."""
    stream_codes, streams = _codes(stream, "stream")
    hop_codes, hops = _codes(hop, "hop")
    kind_codes, kinds = _codes(verdict, "verdict")
    decided = np.asarray(decided_ms, dtype=np.int64)
    has_latency, latencies = _latencies(latency_ms)
    lengths = {"stream": len(stream_codes), "hop": len(hop_codes), "verdict": len(kind_codes),
               "decided_ms": len(decided), "latency_ms": len(has_latency)}  # fmt: skip
    if len(set(lengths.values())) > 1:
        raise ValueError(f"the columns of a batch have one value per verdict; got lengths {lengths}")
    minutes, minute_codes = np.unique(decided // MINUTE_MS * MINUTE_MS, return_inverse=True)
    counted = np.array([COUNT_NAMES.index(count_name(str(kind))) for kind in kinds], dtype=np.int64)[kind_codes]
    # one code per (stream, hop, minute) of the batch, and one row of counts per code
    groups, group_codes = np.unique(
        (stream_codes * len(hops) + hop_codes) * len(minutes) + minute_codes, return_inverse=True
    )
    width = len(COUNT_NAMES)
    counts = np.bincount(group_codes * width + counted, minlength=len(groups) * width).reshape(len(groups), width)
    # the latencies sorted by (group, bucket): each run of equal pairs is one histogram entry
    timed_groups, buckets = group_codes[has_latency], latency_buckets(latencies)
    order = np.lexsort((buckets, timed_groups))
    timed_groups, buckets = timed_groups[order], buckets[order]
    run_starts = np.flatnonzero(
        np.concatenate(([True], (timed_groups[1:] != timed_groups[:-1]) | (buckets[1:] != buckets[:-1])))
    )[: len(order)]
    entries = np.diff(np.append(run_starts, len(order)))
    first_run = np.searchsorted(timed_groups[run_starts], np.arange(len(groups) + 1))
    found: dict[MinuteKey, MinuteCounts] = {}
    for group, code in enumerate(groups.tolist()):
        stream_hop, minute = divmod(code, len(minutes))
        stream_code, hop_code = divmod(stream_hop, len(hops))
        runs = slice(first_run[group], first_run[group + 1])
        histogram = dict(zip(buckets[run_starts[runs]].tolist(), entries[runs].tolist(), strict=True))
        key = MinuteKey(str(streams[stream_code]), str(hops[hop_code]), int(minutes[minute]))
        found[key] = _made(dict(zip(COUNT_NAMES, counts[group].tolist(), strict=True)), histogram)
    return dict(sorted(found.items()))


def _codes(values: npt.ArrayLike, name: str) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.object_]]:
    """A column as codes into its distinct values (pandas' hash table, not a sort of strings)."""
    import pandas as pd  # here, not at the top: the readers of the metrics never load it

    codes, uniques = pd.factorize(np.asarray(values, dtype=object))
    missing = int((codes < 0).sum())
    if missing:
        raise ValueError(f"{missing} of {len(codes)} rows have no {name} (null in the {name} column)")
    return np.asarray(codes, dtype=np.int64), np.asarray(uniques, dtype=object)


def _latencies(values: npt.ArrayLike) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
    """Which rows have a latency, and those latencies (in ms, int64)."""
    import pandas as pd

    raw = np.asarray(values)
    if raw.dtype.kind in "iu":
        return np.ones(len(raw), dtype=np.bool_), raw.astype(np.int64)
    as_float = pd.to_numeric(pd.Series(raw, dtype=object if raw.dtype.kind == "O" else None)).to_numpy(
        dtype=np.float64, na_value=np.nan
    )
    has_latency = ~np.isnan(as_float)
    return has_latency, as_float[has_latency].astype(np.int64)


def change_counts(
    added: Iterable[Mapping[str, Any]], removed: Iterable[Mapping[str, Any]]
) -> dict[MinuteKey, MinuteCounts]:
    """What storing the ``added`` verdict rows in place of the ``removed`` ones does to the counts, per minute:
    +1 (and its latency) for each added verdict in its minute, -1 (and its latency) for each removed one in
    its own, wherever it was kept (an SQL row, or the verdict archive: its count is in the detector's part,
    and the -1 cancels it). Minutes the change leaves as they were are absent."""
    moved = counts_by_minute(added)
    for key, counts in counts_by_minute(removed).items():
        moved[key] = moved.get(key, MinuteCounts()).minus(counts)
    return {key: counts for key, counts in sorted(moved.items()) if counts != MinuteCounts()}


def counts_by_hop(metric_rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], MinuteCounts]:
    """The counts of minute metric rows (``store.verdicts.read_metrics``) added up per (stream, hop)."""
    found: dict[tuple[str, str], MinuteCounts] = {}
    for row in metric_rows:
        key = (str(row["stream"]), str(row["hop"]))
        found[key] = found.get(key, MinuteCounts()).plus(MinuteCounts.of_row(row))
    return found


def verdict_counts(
    exceptions: Mapping[tuple[str, str, str, str], int], metric_rows: Iterable[Mapping[str, Any]]
) -> dict[tuple[str, str, str, str], int]:
    """(stream, hop, verdict, cause or "") -> verdicts of a window: every kind but DELIVERED as counted from
    its stored rows (``exceptions``: they are all SQL rows, and only rows know a cause), DELIVERED from the
    window's minute metrics (most DELIVERED verdicts are in the verdict archive, not rows)."""
    delivered = VerdictKind.DELIVERED.value
    found = {key: count for key, count in exceptions.items() if key[2] != delivered}
    for (stream, hop), counts in counts_by_hop(metric_rows).items():
        if counts.delivered:
            found[(stream, hop, delivered, "")] = counts.delivered
    return found


def metrics_of(key: tuple[str, str, int], counts: CountsLike) -> MinuteMetrics:
    """The metrics of one minute of a stream's hop (``key``: a :class:`MinuteKey`) from its counts: the
    rates over every verdict counted, the percentiles over the latency histogram (nearest rank, as
    :func:`percentile`; the value is the bucket's)."""
    stream, hop, minute_ms = key
    summed = MinuteCounts.like(counts)
    judged = summed.verdicts or 1
    said_lost = summed.lost + summed.confirmed_lost + summed.retracted
    return MinuteMetrics(
        stream=stream,
        hop=hop,
        minute_ms=minute_ms,
        delivered=summed.delivered,
        lost=summed.lost,
        duplicate=summed.duplicate,
        trace_lost=summed.trace_lost,
        pending=summed.pending,
        confirmed_lost=summed.confirmed_lost,
        retracted=summed.retracted,
        false_loss_rate=summed.retracted / said_lost if said_lost else None,
        loss_rate=(summed.lost + summed.confirmed_lost) / judged,
        duplicate_rate=summed.duplicate / judged,
        latency_p50_ms=histogram_percentile(summed.latency_histogram, 0.50),
        latency_p95_ms=histogram_percentile(summed.latency_histogram, 0.95),
        latency_p99_ms=histogram_percentile(summed.latency_histogram, 0.99),
    )


def minute_metrics(key: MinuteKey, outcomes: Iterable[Outcome]) -> MinuteMetrics:
    """The metrics of one minute of a stream's hop from every verdict of it."""
    return metrics_of(key, MinuteCounts.of(outcomes))


def percentile(values: Iterable[int], fraction: float) -> int | None:
    """The value at ``fraction`` of the sorted values (the nearest rank, rounded); None when there are none."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


def histogram_percentile(histogram: Mapping[int, int], fraction: float) -> int | None:
    """:func:`percentile` of the latencies a histogram counts, each as its bucket; None when it counts none
    (entries below one, which only a delta has, are left out)."""
    entries = sorted((bucket, count) for bucket, count in histogram.items() if count > 0)
    total = sum(count for _, count in entries)
    if not total:
        return None
    rank = min(total - 1, max(0, round(fraction * (total - 1))))
    below = 0
    for bucket, count in entries:
        below += count
        if rank < below:
            return bucket
    return entries[-1][0]  # not reached: the ranks end at total - 1
