"""The stored verdicts as the settle rules see them: Verdict values in, changes with their history out.

Both judges store through here: the streaming detector's writer (:meth:`VerdictBook.record`) and
reconciliation (:meth:`VerdictBook.apply`). The store keeps rows; this side turns them into
:class:`~khipu.verdicts.model.Verdict` values and back, says what the history records, and what each
change does to its minutes' metrics (:func:`~khipu.verdicts.metrics.change_counts`), which the store adds
up in the same transaction as the row.

The plain first-time DELIVERED verdicts are not rows: they are in the verdict archive
(:mod:`khipu.verdicts.archive`). Reconciliation reads the archived verdicts of the messages it judges
(with Spark) and hands them in (``archived``): a message's verdicts are its SQL rows and those, the SQL
row winning per hop (:func:`khipu.verdicts.read.merged`), so a judgement agreeing with an archived
DELIVERED writes nothing and one changing it writes the SQL row that overrides it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from khipu.verdicts.metrics import CountsLike, MinuteCounts, MinuteKey, MinuteMetrics, change_counts, metrics_of
from khipu.verdicts.model import Cause, Verdict, VerdictKind
from khipu.verdicts.read import merged
from khipu.verdicts.settle import Change, settle_batch

UNSETTLED = (VerdictKind.LOST, VerdictKind.PENDING, VerdictKind.TRACE_LOST)  # what reconciliation re-decides


class VerdictRows(Protocol):
    """The store's verdict repository, as far as this book uses it."""

    def read_messages(self, message_ids: Collection[str]) -> list[dict[str, Any]]: ...

    def page(
        self,
        *,
        verdicts: Collection[str] = (),
        since_ms: int | None = None,
        late_evidence: bool | None = None,
        before: tuple[int, str, str] | None = None,
        limit: int = 50,
    ) -> list[dict[str, Any]]: ...

    def settled_messages(self, message_ids: Collection[str], unsettled_verdicts: Collection[str]) -> set[str]: ...

    def store_changes(
        self,
        rows: Sequence[Mapping[str, Any]],
        guards: Sequence[Mapping[str, Any] | None],
        history: Sequence[Mapping[str, Any] | Sequence[Mapping[str, Any]] | None],
        counts: Sequence[Mapping[MinuteKey, MinuteCounts]],
        summarize: Callable[[tuple[str, str, int], CountsLike], MinuteMetrics],
    ) -> set[tuple[str, str]]: ...


def verdict_row(verdict: Verdict) -> dict[str, Any]:
    return {
        "message_id": verdict.message_id,
        "stream": verdict.stream,
        "hop": verdict.hop,
        "hop_kind": verdict.hop_kind,
        "verdict": verdict.kind.value,
        "cause": verdict.cause.value if verdict.cause else None,
        "count": verdict.count,
        "topic": verdict.topic,
        "partition": verdict.partition,
        "offset": verdict.offset,
        "group": verdict.group,
        "location": verdict.location,
        "observed_ms": verdict.observed_ms,
        "latency_ms": verdict.latency_ms,
        "e2e_latency_ms": verdict.e2e_latency_ms,
        "decided_ms": verdict.decided_ms,
        "detail": verdict.detail,
        "first_seen_ms": verdict.first_seen_ms,
        "decided_by": verdict.decided_by,
        "evidence_kind": verdict.evidence_kind.value if verdict.evidence_kind else None,
        "late_evidence": verdict.late_evidence,
    }


def verdict_of(row: Mapping[str, Any]) -> Verdict:
    """A verdict from a stored row or a detector output row (``group`` or ``group_id``)."""

    def optional_int(name: str) -> int | None:
        value = row.get(name)
        return None if value is None else int(value)

    return Verdict(
        message_id=row["message_id"],
        stream=row["stream"],
        hop=row["hop"],
        hop_kind=row["hop_kind"],
        kind=VerdictKind(row["verdict"]),
        cause=Cause(row["cause"]) if row.get("cause") else None,
        count=int(row["count"]),
        topic=row["topic"],
        partition=optional_int("partition"),
        offset=optional_int("offset"),
        group=row.get("group_id", row.get("group")),
        location=row.get("location"),
        observed_ms=optional_int("observed_ms"),
        latency_ms=optional_int("latency_ms"),
        e2e_latency_ms=optional_int("e2e_latency_ms"),
        decided_ms=int(row["decided_ms"]),
        detail=row["detail"],
        first_seen_ms=optional_int("first_seen_ms"),
        decided_by=row.get("decided_by") or "detector",
        evidence_kind=VerdictKind(row["evidence_kind"]) if row.get("evidence_kind") else None,
        late_evidence=bool(row.get("late_evidence")),
    )


def history_entry(change: Change, at_ms: int) -> dict[str, Any] | None:
    """A line of the verdict's history when what it says changed (its kind or cause), else None: a first decision
    at the moment it was judged (its ``decided_ms``, the minute its figures count it in), a change at ``at_ms``, when
    it was stored."""
    new, old = change.verdict, change.previous
    if old is not None and (old.kind, old.cause) == (new.kind, new.cause):
        return None
    return {
        "message_id": new.message_id,
        "hop": new.hop,
        "stream": new.stream,
        "at_ms": new.decided_ms if old is None else at_ms,
        "from_verdict": old.kind.value if old else None,
        "to_verdict": new.kind.value,
        "cause": new.cause.value if new.cause else None,
        "decided_by": new.decided_by,
        "reason": change.reason,
    }


@dataclass(frozen=True)
class StoredVerdicts:
    """The verdicts of some messages, and which of them are the verdict archive's (no SQL row)."""

    by_message: dict[str, dict[str, Verdict]]  # message id -> hop -> verdict
    archived: frozenset[tuple[str, str]] = frozenset()  # (message id, hop): :meth:`VerdictBook.apply` needs them


@dataclass(frozen=True)
class Recorded:
    """What the detector's batch did: the changes stored, and every judged hop's verdict as stored now."""

    changes: list[Change]
    current: dict[tuple[str, str], Verdict]
    apart: list[Verdict] = field(default_factory=list)  # decided, kept elsewhere by the caller (the verdict archive)


class VerdictBook:
    def __init__(self, rows: VerdictRows) -> None:
        self.rows = rows

    def settled_messages(self, message_ids: Collection[str], archived: Iterable[Mapping[str, Any]] = ()) -> set[str]:
        """Of these, the messages with a verdict none of which reconciliation re-decides (LOST, PENDING,
        TRACE_LOST, or late evidence). ``archived``: the messages' verdicts in the verdict archive (plain
        DELIVERED, final): a message with those and no open SQL row is settled too."""
        ids = set(message_ids)
        settled = self.rows.settled_messages(ids, [kind.value for kind in UNSETTLED])
        only_archived = {str(row["message_id"]) for row in archived} & (ids - settled)
        if only_archived:  # those with an SQL row too are open: the SQL side did not call them settled
            only_archived -= {str(row["message_id"]) for row in self.rows.read_messages(only_archived)}
        return settled | only_archived

    def open_message_pages(self, since_ms: int, page_rows: int = 10_000) -> Iterator[list[str]]:
        """The messages with an SQL verdict decided since ``since_ms`` that reconciliation re-decides (LOST,
        PENDING, TRACE_LOST, or late evidence): the few beside the many settled by archived DELIVERED ones. A page
        at a time, so a caller holds at most ``page_rows`` of them; a message with several open hops, or open and
        with late evidence, is named once per such row."""
        for verdicts, late in (([kind.value for kind in UNSETTLED], None), ((), True)):
            before: tuple[int, str, str] | None = None
            while True:
                rows = self.rows.page(
                    verdicts=verdicts, since_ms=since_ms, late_evidence=late, before=before, limit=page_rows
                )
                if rows:
                    yield [str(row["message_id"]) for row in rows]
                if len(rows) < page_rows:
                    break
                before = (int(rows[-1]["decided_ms"]), str(rows[-1]["message_id"]), str(rows[-1]["hop"]))

    def stored(self, message_ids: Collection[str], archived: Iterable[Mapping[str, Any]] = ()) -> StoredVerdicts:
        """The verdicts of these messages: their SQL rows, and ``archived`` (their verdict archive rows) where
        SQL has none for the hop."""
        wanted = set(message_ids)
        sql = self.rows.read_messages(wanted)
        in_sql = {(str(row["message_id"]), str(row["hop"])) for row in sql}
        mine = [row for row in archived if row["message_id"] in wanted]
        found: dict[str, dict[str, Verdict]] = {}
        for row in merged(sql, mine):
            found.setdefault(row["message_id"], {})[row["hop"]] = verdict_of(row)
        keys = {(str(row["message_id"]), str(row["hop"])) for row in mine} - in_sql
        return StoredVerdicts(found, frozenset(keys))

    def stored_verdicts(
        self, message_ids: Collection[str], archived: Iterable[Mapping[str, Any]] = ()
    ) -> dict[str, dict[str, Verdict]]:
        """The verdicts of these messages by message id and hop (see :meth:`stored`)."""
        return self.stored(message_ids, archived).by_message

    def apply(
        self, changes: Sequence[Change], at_ms: int, archived: Collection[tuple[str, str]] = ()
    ) -> set[tuple[str, str]]:
        """Store the changes with their history, each only if its row is still what it was decided against,
        and with what each moves in its minutes' metrics (-1 for the verdict replaced, +1 for the new one).
        ``archived``: the (message id, hop) of changes whose previous verdict is one of the verdict archive
        (kept there, not as a row): such a change is stored only if no row exists yet. Returns the keys that
        changed meanwhile (not applied)."""
        guards = [None if _key(c.verdict) in archived else _guard(c.previous) for c in changes]
        history = [
            [*_first_decision(change.previous), *filter(None, [history_entry(change, at_ms)])]
            if _key(change.verdict) in archived
            else history_entry(change, at_ms)
            for change in changes
        ]
        counts = [
            change_counts([verdict_row(c.verdict)], [verdict_row(c.previous)] if c.previous else []) for c in changes
        ]
        return self.rows.store_changes([verdict_row(c.verdict) for c in changes], guards, history, counts, metrics_of)

    def record(
        self,
        judged: Iterable[Verdict],
        at_ms: int,
        attempts: int = 3,
        archived: Mapping[tuple[str, str], Verdict] | None = None,
        apart: Callable[[Change], bool] | None = None,
        feeders: Mapping[tuple[str, str], Collection[str]] | None = None,
    ) -> Recorded:
        """The detector's new verdicts, settled against what is stored (late evidence never makes one worse).
        A verdict whose row changed meanwhile is settled again against the new row. ``archived``: verdicts of
        the verdict archive by (message id, hop), settled against where no row is stored. ``apart``: changes
        the caller keeps elsewhere (the plain first-time DELIVERED verdicts, in the verdict archive) are not
        stored here but returned in :attr:`Recorded.apart`. ``feeders``: each processor write hop's input read hops
        (:func:`khipu.verdicts.settle.settle_batch`)."""
        pending = list(judged)
        in_archive = archived or {}
        changes: list[Change] = []
        current: dict[tuple[str, str], Verdict] = {}
        kept_apart: list[Verdict] = []
        for _ in range(attempts):
            stored = self.stored_verdicts({v.message_id for v in pending})
            batch: list[Change] = []
            replacing_archived: set[tuple[str, str]] = set()
            rows = {_key(v): stored.get(v.message_id, {}).get(v.hop) for v in pending}
            befores = {key: row if row is not None else in_archive.get(key) for key, row in rows.items()}
            known: dict[str, dict[str, Verdict]] = {m: dict(hops) for m, hops in stored.items()}
            for (message_id, hop), verdict in in_archive.items():
                known.setdefault(message_id, {}).setdefault(hop, verdict)
            settled = settle_batch(pending, known, feeders)
            for verdict, change in zip(pending, settled, strict=True):
                key = _key(verdict)
                row, before = rows[key], befores[key]
                if change is not None and apart is not None and apart(change):
                    kept_apart.append(change.verdict)
                    current[key] = change.verdict
                elif change is not None:
                    batch.append(change)
                    current[key] = change.verdict
                    if row is None and before is not None:
                        replacing_archived.add(key)
                elif before is not None:
                    current[key] = before
            conflicts = self.apply(batch, at_ms, replacing_archived)
            changes.extend(c for c in batch if _key(c.verdict) not in conflicts)
            pending = [v for v in pending if _key(v) in conflicts]
            if not pending:
                break
        if pending:
            raise RuntimeError(f"{len(pending)} verdicts kept changing under this writer; the batch is retried")
        return Recorded(changes, current, kept_apart)


def _first_decision(previous: Verdict | None) -> list[dict[str, Any]]:
    """The history line of an archived verdict's first decision (an archived verdict has none): written when a
    change replaces it, so the history reads from the start."""
    if previous is None:
        return []
    return [
        {
            "message_id": previous.message_id,
            "hop": previous.hop,
            "stream": previous.stream,
            "at_ms": previous.decided_ms,
            "from_verdict": None,
            "to_verdict": previous.kind.value,
            "cause": previous.cause.value if previous.cause else None,
            "decided_by": previous.decided_by,
            "reason": "decided",
        }
    ]


def _key(verdict: Verdict) -> tuple[str, str]:
    return verdict.message_id, verdict.hop


def _guard(previous: Verdict | None) -> dict[str, Any] | None:
    if previous is None:
        return None
    return {"verdict": previous.kind.value, "decided_ms": previous.decided_ms, "late_evidence": previous.late_evidence}
