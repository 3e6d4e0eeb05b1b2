"""The detector's verdicts, one row per (message id, hop), and the per-minute metrics of each stream and hop.

A minute's metrics (``verdict_metrics``) are the sum of its parts (``verdict_metric_parts``): counts per
kind and a latency histogram per (stream, hop, minute) and writer's part. A writer replaces a part of its
own (:meth:`VerdictRepository.replace_part`: the detector, once per micro-batch, for the verdicts it keeps
in the verdict archive rather than as rows); every change of a stored verdict adds what it moves to the
part ``changes`` (:meth:`VerdictRepository.store_changes`). Either way, in the same transaction, the
minutes touched are summed again from all their parts.

The store only adds integers up (:class:`MinuteTotals`: count columns and JSON histograms, a format it
owns). What a verdict counts as, and the rates and percentiles of a sum, are the domain's
(:mod:`khipu.verdicts.metrics`): a change comes in with its counts already worked out, and the metrics of a
sum come from the ``summarize`` function the writer hands in.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from sqlalchemy import (
    Connection,
    case,
    delete,
    func,
    insert,
    select,
    tuple_,
    update,
)

from khipu.store import schema
from khipu.store.engine import StoreEngine, insert_of, update_many, upsert

VERDICT_COLUMNS = (
    "stream",
    "hop_kind",
    "verdict",
    "cause",
    "count",
    "topic",
    "partition",
    "offset",
    "group_id",
    "location",
    "observed_ms",
    "latency_ms",
    "e2e_latency_ms",
    "decided_ms",
    "detail",
    "first_seen_ms",
    "decided_by",
    "evidence_kind",
    "late_evidence",
)
COUNT_COLUMNS = (
    "delivered", "lost", "duplicate", "trace_lost", "pending", "confirmed_lost", "retracted", "aborted", "superseded",
    "reprocessed",
)  # fmt: skip
MINUTE_COLUMNS = ("stream", "hop", "minute_ms")
CHANGES_PART = "changes"  # the part store_changes adds every change of a stored verdict to
ROLLUP_PART = "rollup"  # the part holding the sum of a whole span of old minutes, at the span's first minute
CHUNK = 500  # ids (or minutes) per IN (...) query
VERDICT_KEY = ("message_id", "hop")
GUARDED = ("verdict", "decided_ms")  # with late_evidence: what a stored verdict must still be for a change to apply
UNSUMMED = {**dict.fromkeys(COUNT_COLUMNS, 0), "loss_rate": 0.0, "duplicate_rate": 0.0}  # a new minute's row, held

Minute = tuple[str, str, int]  # (stream, hop, minute_ms)
MinuteOf = TypeVar("MinuteOf", bound=Minute)  # a Minute, or a tuple type of its own (khipu.verdicts.metrics.MinuteKey)


class MinuteCountsLike(Protocol):
    """Counts of verdicts of one (stream, hop, minute) (e.g. ``khipu.verdicts.metrics.MinuteCounts``): per
    counted kind, and per latency bucket; negative in a change that takes a verdict away."""

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


class MetricsLike(Protocol):
    """One (stream, hop, minute) row of metrics (e.g. ``khipu.verdicts.metrics.MinuteMetrics``)."""

    @property
    def false_loss_rate(self) -> float | None: ...
    @property
    def loss_rate(self) -> float: ...
    @property
    def duplicate_rate(self) -> float: ...
    @property
    def latency_p50_ms(self) -> int | None: ...
    @property
    def latency_p95_ms(self) -> int | None: ...
    @property
    def latency_p99_ms(self) -> int | None: ...


# The metrics of a minute from the sum of its parts (``khipu.verdicts.metrics.metrics_of``).
Summarize = Callable[[Minute, MinuteCountsLike], MetricsLike]


@dataclass(frozen=True, slots=True)
class MinuteTotals:
    """Counts as the store adds them up: one part of a minute as stored, or the sum of a minute's parts."""

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
    latency_histogram: Mapping[int, int] = field(default_factory=dict)  # bucket -> latencies; no zero entries
    skew_histogram: Mapping[int, int] = field(default_factory=dict)  # bucket -> impossible latencies

    @classmethod
    def of_row(cls, row: Any) -> MinuteTotals:
        """The totals of a stored part or metric row (its count columns and histograms' text)."""
        return totals_of(
            [int(getattr(row, name) or 0) for name in COUNT_COLUMNS],
            histogram_of_text(row.latency_histogram).items(),
            histogram_of_text(getattr(row, "skew_histogram", None)).items(),
        )

    @property
    def no_verdicts(self) -> bool:
        """Every count is zero (a minute of no verdict has no metrics row)."""
        return not any(_counts(self))

    @property
    def empty(self) -> bool:
        """Nothing counted: no verdict, no latency (a part of nothing, a change that moved nothing)."""
        return self.no_verdicts and not self.latency_histogram and not self.skew_histogram


def _summed(entries: Iterable[tuple[int, int]]) -> dict[int, int]:
    summed: Counter[int] = Counter()
    for bucket, count in entries:
        summed[int(bucket)] += int(count)
    return {bucket: summed[bucket] for bucket in sorted(summed) if summed[bucket]}


def totals_of(
    counts: Sequence[int], histogram: Iterable[tuple[int, int]], skews: Iterable[tuple[int, int]] = ()
) -> MinuteTotals:
    """Totals of counts in :data:`COUNT_COLUMNS` order and histograms' entries (added up per bucket, zeros
    dropped)."""
    values = dict(zip(COUNT_COLUMNS, (int(count) for count in counts), strict=True))
    return MinuteTotals(**values, latency_histogram=_summed(histogram), skew_histogram=_summed(skews))


def added(first: MinuteCountsLike, second: MinuteCountsLike) -> MinuteTotals:
    """The sum of two counts: column by column, bucket by bucket."""
    counts = [a + b for a, b in zip(_counts(first), _counts(second), strict=True)]
    return totals_of(
        counts,
        [*first.latency_histogram.items(), *second.latency_histogram.items()],
        [*first.skew_histogram.items(), *second.skew_histogram.items()],
    )


def histogram_text(histogram: Mapping[int, int]) -> str:
    """A histogram as stored: compact JSON, buckets in order (``{"-3":1,"120":4,"12300":1}``)."""
    entries = {str(bucket): int(histogram[bucket]) for bucket in sorted(histogram) if histogram[bucket]}
    return json.dumps(entries, separators=(",", ":"))


def histogram_of_text(text: str | None) -> dict[int, int]:
    """The histogram :func:`histogram_text` stored (None: a minute stored before migration 0008, none)."""
    if not text:
        return {}
    parsed = json.loads(text)
    if not isinstance(parsed, dict):
        raise ValueError(f"a stored latency histogram is a JSON object of bucket -> count, not {text[:80]!r}")
    return {int(bucket): int(count) for bucket, count in parsed.items()}


def _counts(counts: MinuteCountsLike) -> list[int]:
    return [int(getattr(counts, name)) for name in COUNT_COLUMNS]


class VerdictRepository:
    """``store.verdicts``: verdicts and their metrics."""

    def __init__(self, engine: StoreEngine) -> None:
        self._engine = engine

    def upsert(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Insert or replace verdicts by (message id, hop): a replayed batch never stores one twice. The metrics
        are left as they are (a seed adds its counts with :meth:`replace_part`)."""
        with self._engine.begin() as tx:
            _upsert_verdicts(tx, rows)

    def replace_part(self, part: str, counts: Mapping[MinuteOf, MinuteCountsLike], summarize: Summarize) -> None:
        """Replace every minute of the part ``part`` (a writer's id, e.g. ``detector:<query id>:<batch id>``)
        with ``counts`` (per (stream, hop, minute_ms); empty counts store nothing) and sum each minute the
        part had or has again from all its parts, in one transaction: calling it twice with the same
        arguments leaves the same tables (a replayed batch replaces its own part)."""
        if not part or part in (CHANGES_PART, ROLLUP_PART) or len(part) > schema.NAME:
            raise ValueError(
                f"part {part!r}: expected a writer's id of 1 to {schema.NAME} characters other than "
                f"{CHANGES_PART!r} (store_changes keeps that one) and {ROLLUP_PART!r} (retention's roll-up)"
            )
        table = schema.verdict_metric_parts
        rows = [_part_values(minute, part, c) for minute, c in _minutes(counts).items() if not _totals(c).empty]
        with self._engine.begin() as tx:  # writes first: an SQLite writer takes its lock before it reads
            removed = tx.execute(delete(table).where(table.c.part == part).returning(*_minute_columns(table)))
            touched = {(r.stream, r.hop, int(r.minute_ms)) for r in removed}
            if rows:
                tx.execute(insert(table), rows)
            _sum_minutes(tx, touched | set(_minutes(counts)), summarize)

    def store_changes(
        self,
        rows: Sequence[Mapping[str, Any]],
        guards: Sequence[Mapping[str, Any] | None],
        history: Sequence[Mapping[str, Any] | Sequence[Mapping[str, Any]] | None],
        counts: Sequence[Mapping[MinuteOf, MinuteCountsLike]],
        summarize: Summarize,
    ) -> set[tuple[str, str]]:
        """Changed verdicts (rows as :meth:`upsert` takes them) with their history entries (one, several in order,
        or none per change) and what each does to
        the metrics, in one transaction, each only if its stored row is still what the change was decided
        against: ``guards[i]`` holds the ``verdict``, ``decided_ms`` and ``late_evidence`` the row must still
        have (None: no row may exist yet, e.g. the verdict replaced is in the verdict archive). ``counts[i]``
        is what change i moves per (stream, hop, minute) (+1 for the new verdict, -1 for the one it replaces,
        wherever that was kept: ``khipu.verdicts.metrics.change_counts``); the applied changes' counts are added
        to the part ``changes`` and the minutes they touch summed again (``summarize``). Returns the (message
        id, hop) keys not applied because the row changed meanwhile (another writer, e.g. reconciliation
        beside the detector); their history and counts are not written."""
        if not len(rows) == len(guards) == len(history) == len(counts):
            raise ValueError(
                f"one guard, history entry and counts per changed verdict: got {len(rows)} verdicts, "
                f"{len(guards)} guards, {len(history)} history entries, {len(counts)} counts"
            )
        table = schema.verdicts
        conflicts: set[tuple[str, str]] = set()
        inserts = [(row, entry) for row, guard, entry in zip(rows, guards, history, strict=True) if guard is None]
        updates = [(row, guard, entry) for row, guard, entry in zip(rows, guards, history, strict=True) if guard]
        with self._engine.begin() as tx:
            for start in range(0, len(inserts), CHUNK):
                chunk = [_verdict_values(row) for row, _ in inserts[start : start + CHUNK]]
                statement = insert_of(tx)(table).values(chunk).on_conflict_do_nothing()
                added_keys = {
                    (r.message_id, r.hop) for r in tx.execute(statement.returning(table.c.message_id, table.c.hop))
                }
                conflicts.update(
                    (v["message_id"], v["hop"]) for v in chunk if (v["message_id"], v["hop"]) not in added_keys
                )
            conflicts.update(_update_guarded(tx, [(_verdict_values(row), guard) for row, guard, _ in updates]))
            applied = [i for i, row in enumerate(rows) if (row["message_id"], row["hop"]) not in conflicts]
            entries = [dict(entry) for i in applied for entry in _entries(history[i])]
            if entries:
                tx.execute(insert(schema.verdict_history), entries)
            moved: dict[Minute, MinuteTotals] = {}
            for i in applied:
                for minute, change in _minutes(counts[i]).items():
                    moved[minute] = added(moved.get(minute, MinuteTotals()), change)
            _add_to_part(tx, CHANGES_PART, moved)
            _sum_minutes(tx, set(moved), summarize)
        return conflicts

    def unannounced_confirmed(self, limit: int = 1000) -> list[dict[str, Any]]:
        """CONFIRMED_LOST verdicts not yet announced (the confirmed-losses Asset), oldest first."""
        table = schema.verdicts
        query = (
            select(table)
            .where(table.c.verdict == "CONFIRMED_LOST", table.c.announced_ms.is_(None))
            .order_by(table.c.decided_ms, table.c.message_id)
            .limit(limit)
        )
        with self._engine.begin() as tx:
            return [dict(row._mapping) for row in tx.execute(query)]

    def mark_announced(self, keys: Collection[tuple[str, str]], at_ms: int) -> None:
        table = schema.verdicts
        with self._engine.begin() as tx:
            for message_id, hop in sorted(keys):
                tx.execute(
                    update(table).where(table.c.message_id == message_id, table.c.hop == hop).values(announced_ms=at_ms)
                )

    def read_messages(self, message_ids: Collection[str]) -> list[dict[str, Any]]:
        """Every stored verdict of these messages: their columns."""
        table, ids = schema.verdicts, sorted(set(message_ids))
        found: list[dict[str, Any]] = []
        with self._engine.begin() as tx:
            for start in range(0, len(ids), CHUNK):
                query = select(table).where(table.c.message_id.in_(ids[start : start + CHUNK]))
                found.extend(dict(row._mapping) for row in tx.execute(query))
        return found

    def settled_messages(self, message_ids: Collection[str], unsettled_verdicts: Collection[str]) -> set[str]:
        """Of these, the messages with stored verdicts none of which is one of ``unsettled_verdicts`` or
        carries late evidence."""
        table, ids = schema.verdicts, sorted(set(message_ids))
        open_rows = func.sum(
            case((table.c.verdict.in_(sorted(unsettled_verdicts)) | table.c.late_evidence.is_(True), 1), else_=0)
        )
        settled: set[str] = set()
        with self._engine.begin() as tx:
            for start in range(0, len(ids), CHUNK):
                query = (
                    select(table.c.message_id)
                    .where(table.c.message_id.in_(ids[start : start + CHUNK]))
                    .group_by(table.c.message_id)
                    .having(open_rows == 0)
                )
                settled.update(row.message_id for row in tx.execute(query))
        return settled

    def cause_counts(self, since_ms: int, verdicts: Collection[str]) -> dict[tuple[str, str], dict[str, int]]:
        """Per (stream, hop), how many verdicts of these kinds decided since ``since_ms`` had each cause."""
        table = schema.verdicts
        query = (
            select(table.c.stream, table.c.hop, table.c.cause, func.count())
            .where(table.c.decided_ms >= since_ms, table.c.verdict.in_(sorted(verdicts)))
            .group_by(table.c.stream, table.c.hop, table.c.cause)
        )
        found: dict[tuple[str, str], dict[str, int]] = {}
        with self._engine.begin() as tx:
            for stream, hop, cause, count in tx.execute(query):
                found.setdefault((stream, hop), {})[cause or "unknown"] = int(count)
        return found

    def history(self, message_id: str) -> list[dict[str, Any]]:
        """How the message's verdicts changed, oldest first."""
        table = schema.verdict_history
        query = select(table).where(table.c.message_id == message_id).order_by(table.c.at_ms, table.c.id)
        with self._engine.begin() as tx:
            return [dict(row._mapping) for row in tx.execute(query)]

    def histories(self, message_ids: Collection[str]) -> dict[str, list[dict[str, Any]]]:
        """How each of these messages' verdicts changed, oldest first (messages without history: absent)."""
        table, ids = schema.verdict_history, sorted(set(message_ids))
        found: dict[str, list[dict[str, Any]]] = {}
        with self._engine.begin() as tx:
            for start in range(0, len(ids), CHUNK):
                query = (
                    select(table)
                    .where(table.c.message_id.in_(ids[start : start + CHUNK]))
                    .order_by(table.c.at_ms, table.c.id)
                )
                for row in tx.execute(query):
                    found.setdefault(row.message_id, []).append(dict(row._mapping))
        return found

    def rows(self) -> list[dict[str, Any]]:
        """Every stored verdict (tests, small stores)."""
        return self.read()

    def read(self, stream: str | None = None, since_ms: int = 0) -> list[dict[str, Any]]:
        """Verdicts decided since ``since_ms`` (of one stream, when given), oldest first: their columns."""
        table = schema.verdicts
        query = select(table).where(table.c.decided_ms >= since_ms)
        if stream is not None:
            query = query.where(table.c.stream == stream)
        with self._engine.begin() as tx:
            return [dict(row._mapping) for row in tx.execute(query.order_by(table.c.decided_ms, table.c.message_id))]

    def page(
        self,
        *,
        verdicts: Collection[str] = (),
        stream: str | None = None,
        hop: str | None = None,
        cause: str | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
        late_evidence: bool | None = None,
        before: tuple[int, str, str] | None = None,
        limit: int = 50,
        streams: Collection[str] | None = None,
    ) -> list[dict[str, Any]]:
        """One page of verdicts, newest decision first, filtered; ``before`` is the (decided_ms, message id,
        hop) of the last row of the previous page (keyset paging: as fast on page 1,000 as on page 1).
        ``streams``: of these streams only (none: of none)."""
        table = schema.verdicts
        query = select(table)
        if verdicts:
            query = query.where(table.c.verdict.in_(sorted(verdicts)))
        if streams is not None:
            query = query.where(table.c.stream.in_(sorted(streams)))
        for column, value in ((table.c.stream, stream), (table.c.hop, hop), (table.c.cause, cause)):
            if value is not None:
                query = query.where(column == value)
        if since_ms is not None:
            query = query.where(table.c.decided_ms >= since_ms)
        if until_ms is not None:
            query = query.where(table.c.decided_ms < until_ms)
        if late_evidence is not None:
            query = query.where(table.c.late_evidence.is_(late_evidence))
        if before is not None:
            query = query.where(tuple_(table.c.decided_ms, table.c.message_id, table.c.hop) < tuple_(*before))
        query = query.order_by(table.c.decided_ms.desc(), table.c.message_id.desc(), table.c.hop.desc()).limit(limit)
        with self._engine.begin() as tx:
            return [dict(row._mapping) for row in tx.execute(query)]

    def kind_counts(self, since_ms: int, excluding: Collection[str] = ()) -> dict[tuple[str, str, str, str], int]:
        """(stream, hop, verdict, cause or "") -> how many stored verdict rows decided since ``since_ms`` say so,
        of every kind but those ``excluding`` names. Rows only: a count of every verdict of a kind, whether
        kept as a row or in the verdict archive, is in the minute metrics (:meth:`read_metrics`)."""
        table = schema.verdicts
        query = select(table.c.stream, table.c.hop, table.c.verdict, table.c.cause, func.count()).where(
            table.c.decided_ms >= since_ms
        )
        if excluding:
            query = query.where(table.c.verdict.not_in(sorted(excluding)))
        query = query.group_by(table.c.stream, table.c.hop, table.c.verdict, table.c.cause)
        with self._engine.begin() as tx:
            return {(s, h, v, c or ""): int(n) for s, h, v, c, n in tx.execute(query)}

    def read_metrics(self, stream: str | None = None, since_ms: int = 0) -> list[dict[str, Any]]:
        """Metric rows of the minutes since ``since_ms`` (of one stream, when given), oldest first."""
        table = schema.verdict_metrics
        query = select(table).where(table.c.minute_ms >= since_ms)
        if stream is not None:
            query = query.where(table.c.stream == stream)
        with self._engine.begin() as tx:
            return [dict(row._mapping) for row in tx.execute(query.order_by(table.c.minute_ms, table.c.hop))]

    # -- retention ----------------------------------------------------------------------------------------------

    def of_kind(self, verdict: str) -> list[dict[str, Any]]:
        """Every stored verdict of one kind, whatever its age: message id, hop, stream and times."""
        table = schema.verdicts
        columns = (table.c.message_id, table.c.hop, table.c.stream, table.c.first_seen_ms, table.c.decided_ms)
        with self._engine.begin() as tx:
            return [dict(row._mapping) for row in tx.execute(select(*columns).where(table.c.verdict == verdict))]

    def prune(
        self,
        before_ms: int,
        verdicts: Collection[str],
        keep_losses_of: Collection[str] = (),
        *,
        dry_run: bool = False,
    ) -> tuple[int, int]:
        """Delete the verdicts of these kinds decided before ``before_ms``, except every row of a message with a
        CONFIRMED_LOST on one of the streams ``keep_losses_of`` names (a resend may still need them), and the
        history of every (message, hop) left without a verdict row from before ``before_ms``; returns (verdicts,
        history entries) deleted (a dry run counts, keeps them). The metrics stay as they are: they count what
        was decided, whatever is kept of it."""
        table, history = schema.verdicts, schema.verdict_history
        loss = table.alias("loss")

        def pinned(message_id: Any) -> Any:
            return (
                select(loss.c.message_id)
                .where(
                    loss.c.message_id == message_id,
                    loss.c.verdict == "CONFIRMED_LOST",
                    loss.c.stream.in_(sorted(set(keep_losses_of))),
                )
                .exists()
            )

        old = [table.c.decided_ms < before_ms, table.c.verdict.in_(sorted(verdicts))]
        still_there = (
            select(table.c.message_id)
            .where(table.c.message_id == history.c.message_id, table.c.hop == history.c.hop)
            .exists()
        )
        old_history = [history.c.at_ms < before_ms, ~still_there]
        if keep_losses_of:
            old.append(~pinned(table.c.message_id))
            old_history.append(~pinned(history.c.message_id))
        with self._engine.begin(commit=not dry_run) as tx:
            removed = int(tx.execute(delete(table).where(*old)).rowcount or 0)
            forgotten = int(tx.execute(delete(history).where(*old_history)).rowcount or 0)
        return removed, forgotten

    def roll_up(
        self, before_ms: int, span_ms: int, summarize: Summarize, *, since_ms: int = 0, dry_run: bool = False
    ) -> int:
        """Fold the metric parts of the minutes from ``since_ms`` to ``before_ms`` (multiples of ``span_ms``) into
        one part per (stream, hop, span), :data:`ROLLUP_PART` at the span's first minute, and sum those spans'
        metrics again, one transaction per span: a window's counts and latency histograms are the same before and
        after, with a span's resolution. Returns how many part rows were folded (a dry run counts, changes
        nothing)."""
        if span_ms <= 0 or before_ms % span_ms or since_ms % span_ms:
            raise ValueError(f"roll_up: since_ms {since_ms} and before_ms {before_ms} must be multiples of {span_ms}")
        table = schema.verdict_metric_parts
        unfolded = select(table.c.stream, table.c.hop, table.c.minute_ms).where(
            table.c.minute_ms >= since_ms,
            table.c.minute_ms < before_ms,
            (table.c.part != ROLLUP_PART) | (table.c.minute_ms % span_ms != 0),
        )
        with self._engine.begin() as tx:
            spans = sorted({(r.stream, r.hop, int(r.minute_ms) // span_ms * span_ms) for r in tx.execute(unfolded)})
        folded = 0
        for stream, hop, start in spans:
            where = (
                table.c.stream == stream,
                table.c.hop == hop,
                table.c.minute_ms >= start,
                table.c.minute_ms < start + span_ms,
            )
            with self._engine.begin(commit=not dry_run) as tx:
                rows = tx.execute(delete(table).where(*where).returning(table)).all()
                folded += sum(1 for r in rows if r.part != ROLLUP_PART or int(r.minute_ms) != start)
                total = MinuteTotals()
                for row in rows:
                    total = added(total, MinuteTotals.of_row(row))
                if not total.empty:
                    tx.execute(insert(table), [_part_values((stream, hop, start), ROLLUP_PART, total)])
                metrics = schema.verdict_metrics
                tx.execute(
                    delete(metrics).where(
                        metrics.c.stream == stream,
                        metrics.c.hop == hop,
                        metrics.c.minute_ms >= start,
                        metrics.c.minute_ms < start + span_ms,
                    )
                )
                _sum_minutes(tx, {(stream, hop, start)}, summarize)
        return folded

    def prune_metrics(self, before_ms: int, *, dry_run: bool = False) -> int:
        """Delete the metrics (and their parts) of the minutes before ``before_ms``; returns how many metric rows
        (a dry run counts, keeps them)."""
        metrics, parts = schema.verdict_metrics, schema.verdict_metric_parts
        with self._engine.begin(commit=not dry_run) as tx:
            tx.execute(delete(parts).where(parts.c.minute_ms < before_ms))
            return int(tx.execute(delete(metrics).where(metrics.c.minute_ms < before_ms)).rowcount or 0)

    def oldest_minute(self) -> int | None:
        """The first minute with metrics (None: none)."""
        table = schema.verdict_metrics
        with self._engine.begin() as tx:
            found = tx.execute(select(func.min(table.c.minute_ms))).scalar()
        return None if found is None else int(found)

    def read_parts(self, stream: str | None = None, since_ms: int = 0) -> list[dict[str, Any]]:
        """The parts of the minutes since ``since_ms`` (of one stream, when given): what their metrics sum."""
        table = schema.verdict_metric_parts
        query = select(table).where(table.c.minute_ms >= since_ms)
        if stream is not None:
            query = query.where(table.c.stream == stream)
        order = (table.c.minute_ms, table.c.stream, table.c.hop, table.c.part)
        with self._engine.begin() as tx:
            return [dict(row._mapping) for row in tx.execute(query.order_by(*order))]


def _minutes(counts: Mapping[MinuteOf, MinuteCountsLike]) -> dict[Minute, MinuteCountsLike]:
    """The counts by plain (stream, hop, minute_ms) keys (a ``MinuteKey`` is one too), in order."""
    return {(str(s), str(h), int(m)): c for (s, h, m), c in sorted(counts.items())}


def _totals(counts: MinuteCountsLike) -> MinuteTotals:
    return totals_of(_counts(counts), counts.latency_histogram.items(), counts.skew_histogram.items())


def _minute_columns(table: Any) -> list[Any]:
    return [table.c[name] for name in MINUTE_COLUMNS]


def _part_values(minute: Minute, part: str, counts: MinuteCountsLike) -> dict[str, Any]:
    totals = _totals(counts)
    return {
        **dict(zip(MINUTE_COLUMNS, minute, strict=True)),
        "part": part,
        **dict(zip(COUNT_COLUMNS, _counts(totals), strict=True)),
        "latency_histogram": histogram_text(totals.latency_histogram),
        "skew_histogram": histogram_text(totals.skew_histogram),
    }


def _read_minutes(tx: Connection, table: Any, minutes: Sequence[Minute], *where: Any) -> list[Any]:
    """The rows of ``table`` of these minutes (and ``where``), CHUNK minutes a query."""
    found: list[Any] = []
    for start in range(0, len(minutes), CHUNK):
        chunk = minutes[start : start + CHUNK]
        found.extend(tx.execute(select(table).where(tuple_(*_minute_columns(table)).in_(chunk), *where)))
    return found


def _delete_minutes(tx: Connection, table: Any, minutes: Sequence[Minute], *where: Any) -> None:
    for start in range(0, len(minutes), CHUNK):
        chunk = minutes[start : start + CHUNK]
        tx.execute(delete(table).where(tuple_(*_minute_columns(table)).in_(chunk), *where))


def _hold(tx: Connection, table: Any, rows: Sequence[Mapping[str, Any]], key: Sequence[str]) -> None:
    """Insert the rows where missing and lock them all, in order, until the transaction ends (an upsert that
    changes nothing): a concurrent writer of the same rows waits, then reads what this one committed."""
    if rows:
        statement = insert_of(tx)(table)
        held = statement.on_conflict_do_update(index_elements=list(key), set_={key[-1]: statement.excluded[key[-1]]})
        tx.execute(held, [dict(row) for row in rows])


def _add_to_part(tx: Connection, part: str, moved: Mapping[Minute, MinuteCountsLike]) -> None:
    """Add counts to the part's rows of their minutes (a row summing to nothing is deleted)."""
    minutes = sorted(minute for minute, counts in moved.items() if not _totals(counts).empty)
    if not minutes:
        return
    table = schema.verdict_metric_parts
    _hold(tx, table, [_part_values(m, part, MinuteTotals()) for m in minutes], (*MINUTE_COLUMNS, "part"))
    stored = {(r.stream, r.hop, int(r.minute_ms)): r for r in _read_minutes(tx, table, minutes, table.c.part == part)}
    summed = {minute: added(MinuteTotals.of_row(stored[minute]), moved[minute]) for minute in minutes}
    kept = [_part_values(minute, part, counts) for minute, counts in summed.items() if not counts.empty]
    upsert(tx, table, kept, key=(*MINUTE_COLUMNS, "part"))
    _delete_minutes(tx, table, [minute for minute, counts in summed.items() if counts.empty], table.c.part == part)


def _sum_minutes(tx: Connection, minutes: Collection[Minute], summarize: Summarize) -> None:
    """Store each minute's metrics as the sum of all its parts (a minute summing to no verdict: none)."""
    ordered = sorted(minutes)
    if not ordered:
        return
    metrics, parts = schema.verdict_metrics, schema.verdict_metric_parts
    _hold(tx, metrics, [{**dict(zip(MINUTE_COLUMNS, m, strict=True)), **UNSUMMED} for m in ordered], MINUTE_COLUMNS)
    totals = dict.fromkeys(ordered, MinuteTotals())
    for row in _read_minutes(tx, parts, ordered):
        minute = (row.stream, row.hop, int(row.minute_ms))
        totals[minute] = added(totals[minute], MinuteTotals.of_row(row))
    rows = [_metric_values(m, counts, summarize(m, counts)) for m, counts in totals.items() if not counts.no_verdicts]
    upsert(tx, metrics, rows, key=MINUTE_COLUMNS)
    _delete_minutes(tx, metrics, [minute for minute, counts in totals.items() if counts.no_verdicts])


def _metric_values(minute: Minute, totals: MinuteTotals, figures: MetricsLike) -> dict[str, Any]:
    return {
        **dict(zip(MINUTE_COLUMNS, minute, strict=True)),
        **dict(zip(COUNT_COLUMNS, _counts(totals), strict=True)),
        "false_loss_rate": figures.false_loss_rate,
        "loss_rate": figures.loss_rate,
        "duplicate_rate": figures.duplicate_rate,
        "latency_p50_ms": figures.latency_p50_ms,
        "latency_p95_ms": figures.latency_p95_ms,
        "latency_p99_ms": figures.latency_p99_ms,
        "latency_histogram": histogram_text(totals.latency_histogram),
        "skew_histogram": histogram_text(totals.skew_histogram),
    }


def _entries(history: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None) -> list[Mapping[str, Any]]:
    if history is None:
        return []
    return [history] if isinstance(history, Mapping) else list(history)


def _verdict_values(r: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "message_id": r["message_id"],
        "hop": r["hop"],
        "group_id": r.get("group"),
        **{c: r.get(c) for c in VERDICT_COLUMNS if c != "group_id"},
        "decided_by": r.get("decided_by") or "detector",
        "late_evidence": bool(r.get("late_evidence")),
    }


def _update_guarded(
    tx: Connection, changed: Sequence[tuple[dict[str, Any], Mapping[str, Any]]]
) -> set[tuple[str, str]]:
    """Replace stored verdicts each only if its row is still what its guard says (``verdict``, ``decided_ms``,
    ``late_evidence``), a statement per ROWS_PER_STATEMENT of them (:func:`khipu.store.engine.update_many`);
    returns the keys not replaced (the row changed meanwhile, or is gone)."""
    rows = [
        {**v, **{f"was_{name}": g[name] for name in GUARDED}, "was_late_evidence": bool(g["late_evidence"])}
        for v, g in changed
    ]
    missed = update_many(tx, schema.verdicts, rows, VERDICT_KEY, (*GUARDED, "late_evidence"))
    return {(changed[i][0]["message_id"], changed[i][0]["hop"]) for i in missed}


def _upsert_verdicts(tx: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    values = [_verdict_values(r) for r in rows]
    if values:
        upsert(tx, schema.verdicts, values, key=("message_id", "hop"))
