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

**Kafka working as designed is counted apart.** ABORTED (a transaction that aborted) and SUPERSEDED (a record
compaction removed behind a later one of its key) are neither losses nor deliveries: they have counts of
their own and are in no rate's denominator. A DUPLICATE caused by an exactly-once processor reprocessing
after an aborted transaction is counted as ``reprocessed``, not in the duplicate rate (its output was
written once). **A latency clock skew makes impossible** (negative: received before it was written, written
on before it was read) is not a latency: it goes to the skew histogram, never into the percentiles.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from khipu.verdicts.model import NOT_COUNTED_DUPLICATES, VerdictKind

MINUTE_MS = 60_000
COUNTED = (
    VerdictKind.DELIVERED,
    VerdictKind.LOST,
    VerdictKind.DUPLICATE,
    VerdictKind.TRACE_LOST,
    VerdictKind.PENDING,
    VerdictKind.CONFIRMED_LOST,
    VerdictKind.RETRACTED,
    VerdictKind.ABORTED,
    VerdictKind.SUPERSEDED,
)  # every kind a stored verdict has
# a resent or unrecoverable loss was a confirmed loss all the same: its minute's loss rate does not change
COUNTED_AS = {VerdictKind.RESENT: VerdictKind.CONFIRMED_LOST, VerdictKind.UNRECOVERABLE: VerdictKind.CONFIRMED_LOST}
REPROCESSED = "reprocessed"  # the count of a DUPLICATE whose cause is not counted against the stream
# MinuteCounts' fields and the stored count columns
COUNT_NAMES = (*(kind.value.lower() for kind in COUNTED), REPROCESSED)
APART = ("aborted", "superseded")  # Kafka working as designed: in no rate's denominator
# the counts a rate is a share of (its denominator): the metrics, the alerts, the exporter and the view all use these
JUDGED_COUNTS = tuple(name for name in COUNT_NAMES if name not in APART)
EXACT_UP_TO_MS = 1000  # latencies up to here keep their own bucket
_COUNT_OF = {kind.value: kind.value.lower() for kind in COUNTED} | {
    kind.value: counted.value.lower() for kind, counted in COUNTED_AS.items()
}  # a verdict kind -> the count it adds to
_NOT_COUNTED = frozenset(cause.value for cause in NOT_COUNTED_DUPLICATES)
_DECADES = 10 ** np.arange(3, 19, dtype=np.int64)  # 1e3 .. 1e18: each one reached drops one more digit
_SCALES = 10 ** np.arange(0, 17, dtype=np.int64)


class Outcome(Protocol):
    """What the metrics read of one verdict."""

    @property
    def verdict(self) -> str: ...
    @property
    def cause(self) -> str | None: ...
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
    def aborted(self) -> int: ...
    @property
    def superseded(self) -> int: ...
    @property
    def reprocessed(self) -> int: ...
    @property
    def latency_histogram(self) -> Mapping[int, int]: ...
    @property
    def skew_histogram(self) -> Mapping[int, int]: ...


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
    aborted: int
    superseded: int
    reprocessed: int
    false_loss_rate: float | None  # retracted / provisional LOST (lost + confirmed + retracted); None: no loss said
    loss_rate: float  # (lost + confirmed lost) / judged (every verdict but ABORTED and SUPERSEDED; 0 when none)
    duplicate_rate: float  # duplicate / judged (reprocessing after an abort is not a duplicate here)
    latency_p50_ms: int | None  # None: no verdict of the minute has a latency
    latency_p95_ms: int | None
    latency_p99_ms: int | None
    skewed: int  # latencies clock skew made impossible (in no percentile)
    skew_worst_ms: int | None  # the most impossible of them (negative), as its bucket


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
    aborted: int = 0
    superseded: int = 0
    reprocessed: int = 0
    latency_histogram: Mapping[int, int] = field(default_factory=dict)  # latency_bucket -> latencies in it
    skew_histogram: Mapping[int, int] = field(default_factory=dict)  # the same of impossible (negative) latencies

    def __post_init__(self) -> None:
        for name in ("latency_histogram", "skew_histogram"):
            histogram = dict(getattr(self, name))  # its own copy: the value stays as it was made
            if 0 in histogram.values():
                histogram = {bucket: count for bucket, count in histogram.items() if count}
            object.__setattr__(self, name, histogram)

    @classmethod
    def of(cls, outcomes: Iterable[Outcome]) -> MinuteCounts:
        """The counts of these verdicts (RESENT and UNRECOVERABLE count as confirmed losses; an impossible
        latency counts as skew)."""
        counts: Counter[str] = Counter()
        latencies: Counter[int] = Counter()
        skews: Counter[int] = Counter()
        for outcome in outcomes:
            counts[count_name(outcome.verdict, outcome.cause)] += 1
            if outcome.latency_ms is not None:
                bucket = latency_bucket(int(outcome.latency_ms))
                (skews if bucket < 0 else latencies)[bucket] += 1
        return _made(counts, latencies, skews)

    @classmethod
    def like(cls, counts: CountsLike) -> MinuteCounts:
        """The same counts as a :class:`MinuteCounts`."""
        values = {name: int(getattr(counts, name)) for name in COUNT_NAMES}
        return _made(values, counts.latency_histogram, counts.skew_histogram)

    @classmethod
    def of_row(cls, row: Mapping[str, Any]) -> MinuteCounts:
        """The counts of a stored ``verdict_metrics`` or ``verdict_metric_parts`` row: its count columns and its
        histograms' text (none in a minute stored before migration 0008: no latencies; 0010: no skew)."""
        counts = {name: int(row.get(name) or 0) for name in COUNT_NAMES}
        return _made(
            counts,
            cls.histogram_of_json(row.get("latency_histogram")),
            cls.histogram_of_json(row.get("skew_histogram")),
        )

    @property
    def verdicts(self) -> int:
        """Every verdict counted."""
        return sum(getattr(self, name) for name in COUNT_NAMES)

    @property
    def judged(self) -> int:
        """The verdicts the rates are shares of: all but Kafka's own semantics (ABORTED, SUPERSEDED)."""
        return sum(int(getattr(self, name)) for name in JUDGED_COUNTS)

    @property
    def skewed(self) -> int:
        """How many latencies clock skew made impossible."""
        return sum(self.skew_histogram.values())

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
        histograms = []
        for mine, theirs in (
            (self.latency_histogram, other.latency_histogram),
            (self.skew_histogram, other.skew_histogram),
        ):
            histogram = Counter(mine)
            for bucket, count in theirs.items():
                histogram[bucket] += sign * count
            histograms.append(histogram)
        counts = {name: getattr(self, name) + sign * getattr(other, name) for name in COUNT_NAMES}
        return _made(counts, *histograms)

    def histogram_json(self) -> str:
        """The histogram as compact JSON text, buckets in order: ``{"3":1,"120":4,"12300":1}``."""
        entries = {str(bucket): self.latency_histogram[bucket] for bucket in sorted(self.latency_histogram)}
        return json.dumps(entries, separators=(",", ":"))

    def skew_json(self) -> str:
        """The skew histogram as compact JSON text (:meth:`histogram_json`'s form)."""
        entries = {str(bucket): self.skew_histogram[bucket] for bucket in sorted(self.skew_histogram)}
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


def _made(
    counts: Mapping[str, int], histogram: Mapping[int, int], skews: Mapping[int, int] | None = None
) -> MinuteCounts:
    """A :class:`MinuteCounts` of counts by name (:data:`COUNT_NAMES`; a name not given is 0)."""
    return MinuteCounts(
        **{name: int(counts.get(name, 0)) for name in COUNT_NAMES},
        latency_histogram=histogram,
        skew_histogram=skews or {},
    )


def _histogram(entries: Iterable[tuple[int, int]]) -> dict[int, int]:
    """A histogram's entries added up per bucket, zero entries dropped, buckets in order."""
    summed: Counter[int] = Counter()
    for bucket, count in entries:
        summed[int(bucket)] += int(count)
    return {bucket: summed[bucket] for bucket in sorted(summed) if summed[bucket]}


def count_name(verdict: str, cause: str | None = None) -> str:
    """The count a verdict adds to (``"RESENT"`` -> ``"confirmed_lost"``; a DUPLICATE of a cause not counted
    against the stream -> ``"reprocessed"``)."""
    if verdict == VerdictKind.DUPLICATE.value and cause in _NOT_COUNTED:
        return REPROCESSED
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
    cause: str | None
    latency_ms: int | None


def counts_by_minute(rows: Iterable[Mapping[str, Any]]) -> dict[MinuteKey, MinuteCounts]:
    """The counts of verdict rows (``stream``, ``hop``, ``verdict``, ``cause``, ``decided_ms``, ``latency_ms``)
    per (stream, hop, minute decided in). For a few rows; :func:`counts_by_minute_columns` for a batch."""
    grouped: dict[MinuteKey, list[_RowOutcome]] = {}
    for row in rows:
        key = MinuteKey(row["stream"], row["hop"], minute_of(int(row["decided_ms"])))
        latency = row.get("latency_ms")
        outcome = _RowOutcome(row["verdict"], row.get("cause"), None if latency is None else int(latency))
        grouped.setdefault(key, []).append(outcome)
    return {key: MinuteCounts.of(outcomes) for key, outcomes in sorted(grouped.items())}


def counts_by_minute_columns(
    stream: npt.ArrayLike,
    hop: npt.ArrayLike,
    verdict: npt.ArrayLike,
    decided_ms: npt.ArrayLike,
    latency_ms: npt.ArrayLike,
    cause: npt.ArrayLike | None = None,
) -> dict[MinuteKey, MinuteCounts]:
    """:func:`counts_by_minute` of a batch given as columns (numpy arrays, pyarrow arrays, pandas series), with
    numpy: no Python loop per row, only one per (stream, hop, minute) of the batch. ``latency_ms`` marks a
    verdict without a latency as null (None, NaN, a pyarrow null); ``cause`` (None: no verdict has one) only
    matters to a DUPLICATE."""
    import pandas as pd  # here, not at the top: the readers of the metrics never load it

    stream_codes, streams = _codes(stream, "stream")
    hop_codes, hops = _codes(hop, "hop")
    kind_codes, kinds = _codes(verdict, "verdict")
    no_cause = np.full(len(kind_codes), None, dtype=object)
    cause_codes, causes = pd.factorize(no_cause if cause is None else np.asarray(cause, dtype=object))  # None: -1
    decided = np.asarray(decided_ms, dtype=np.int64)
    has_latency, latencies = _latencies(latency_ms)
    lengths = {"stream": len(stream_codes), "hop": len(hop_codes), "verdict": len(kind_codes),
               "cause": len(cause_codes), "decided_ms": len(decided), "latency_ms": len(has_latency)}  # fmt: skip
    if len(set(lengths.values())) > 1:
        raise ValueError(f"the columns of a batch have one value per verdict; got lengths {lengths}")
    # the count each distinct (verdict, cause) adds to, looked up once per pair
    width_causes = len(causes) + 1
    pairs, pair_of_row = np.unique(kind_codes * width_causes + cause_codes + 1, return_inverse=True)
    pair_counts = [
        COUNT_NAMES.index(
            count_name(
                str(kinds[pair // width_causes]), causes[pair % width_causes - 1] if pair % width_causes else None
            )
        )
        for pair in pairs.tolist()
    ]
    counted = np.asarray(pair_counts, dtype=np.int64)[pair_of_row] if len(pairs) else np.zeros(0, dtype=np.int64)
    minutes, minute_codes = np.unique(decided // MINUTE_MS * MINUTE_MS, return_inverse=True)
    # one code per (stream, hop, minute) of the batch, and one row of counts per code
    groups, group_codes = np.unique(
        (stream_codes * len(hops) + hop_codes) * len(minutes) + minute_codes, return_inverse=True
    )
    width = len(COUNT_NAMES)
    counts = np.bincount(group_codes * width + counted, minlength=len(groups) * width).reshape(len(groups), width)
    buckets = latency_buckets(latencies)
    timed = group_codes[has_latency]
    possible = _histograms(timed[buckets >= 0], buckets[buckets >= 0], len(groups))
    impossible = _histograms(timed[buckets < 0], buckets[buckets < 0], len(groups))
    found: dict[MinuteKey, MinuteCounts] = {}
    for group, code in enumerate(groups.tolist()):
        stream_hop, minute = divmod(code, len(minutes))
        stream_code, hop_code = divmod(stream_hop, len(hops))
        key = MinuteKey(str(streams[stream_code]), str(hops[hop_code]), int(minutes[minute]))
        found[key] = _made(
            dict(zip(COUNT_NAMES, counts[group].tolist(), strict=True)), possible[group], impossible[group]
        )
    return dict(sorted(found.items()))


def _histograms(
    group_codes: npt.NDArray[np.int64], buckets: npt.NDArray[np.int64], groups: int
) -> list[dict[int, int]]:
    """Per group, its latencies' histogram (bucket -> count), from each latency's group and bucket."""
    order = np.lexsort((buckets, group_codes))
    timed_groups, buckets = group_codes[order], buckets[order]
    run_starts = np.flatnonzero(
        np.concatenate(([True], (timed_groups[1:] != timed_groups[:-1]) | (buckets[1:] != buckets[:-1])))
    )[: len(order)]
    entries = np.diff(np.append(run_starts, len(order)))
    first_run = np.searchsorted(timed_groups[run_starts], np.arange(groups + 1))
    return [
        dict(zip(buckets[run_starts[first_run[g] : first_run[g + 1]]].tolist(),
                 entries[first_run[g] : first_run[g + 1]].tolist(), strict=True))
        for g in range(groups)
    ]  # fmt: skip


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
    judged = summed.judged or 1
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
        aborted=summed.aborted,
        superseded=summed.superseded,
        reprocessed=summed.reprocessed,
        false_loss_rate=summed.retracted / said_lost if said_lost else None,
        loss_rate=(summed.lost + summed.confirmed_lost) / judged,
        duplicate_rate=summed.duplicate / judged,
        latency_p50_ms=histogram_percentile(summed.latency_histogram, 0.50),
        latency_p95_ms=histogram_percentile(summed.latency_histogram, 0.95),
        latency_p99_ms=histogram_percentile(summed.latency_histogram, 0.99),
        skewed=summed.skewed,
        skew_worst_ms=min(summed.skew_histogram, default=None),
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
