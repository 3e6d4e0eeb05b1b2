"""The stored verdicts as the settle rules see them: Verdict values in, changes with their history out.

Both judges store through here: the streaming detector's writer (:meth:`VerdictBook.record`) and
reconciliation (:meth:`VerdictBook.apply`). The store keeps rows; this side turns them into
:class:`~khipu.detector.model.Verdict` values and back, and says what the history records.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Protocol

from khipu.detector.model import Cause, Verdict, VerdictKind
from khipu.reconcile.settle import Change, settle
from khipu.verdicts.metrics import minute_metrics, minutes_touched

UNSETTLED = (VerdictKind.LOST, VerdictKind.PENDING, VerdictKind.TRACE_LOST)  # what reconciliation re-decides


class VerdictRows(Protocol):
    """The store's verdict repository, as far as this book uses it."""

    def read_messages(self, message_ids: Collection[str]) -> list[dict[str, Any]]: ...

    def settled_messages(self, message_ids: Collection[str], unsettled_verdicts: Collection[str]) -> set[str]: ...

    def store_changes(
        self,
        rows: Sequence[Mapping[str, Any]],
        history: Sequence[Mapping[str, Any]],
        clear_late_evidence: Collection[str] = (),
    ) -> None: ...

    def read_outcomes(self, spans: Iterable[tuple[str, str, int, int]]) -> Mapping[tuple[str, str, int, int], Any]: ...

    def upsert_metrics(self, metrics: Sequence[Any]) -> None: ...


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
    """A line of the verdict's history when what it says changed (its kind or cause), else None."""
    new, old = change.verdict, change.previous
    if old is not None and (old.kind, old.cause) == (new.kind, new.cause):
        return None
    return {
        "message_id": new.message_id,
        "hop": new.hop,
        "stream": new.stream,
        "at_ms": at_ms,
        "from_verdict": old.kind.value if old else None,
        "to_verdict": new.kind.value,
        "cause": new.cause.value if new.cause else None,
        "decided_by": new.decided_by,
        "reason": change.reason,
    }


class VerdictBook:
    def __init__(self, rows: VerdictRows) -> None:
        self.rows = rows

    def settled_messages(self, message_ids: Collection[str]) -> set[str]:
        return self.rows.settled_messages(message_ids, [kind.value for kind in UNSETTLED])

    def stored_verdicts(self, message_ids: Collection[str]) -> dict[str, dict[str, Verdict]]:
        found: dict[str, dict[str, Verdict]] = {}
        for row in self.rows.read_messages(message_ids):
            found.setdefault(row["message_id"], {})[row["hop"]] = verdict_of(row)
        return found

    def apply(self, changes: Sequence[Change], reconciled: Collection[str], at_ms: int) -> None:
        """Store the changes with their history, clear the reconciled messages' late evidence, and recompute
        the metrics of every minute a changed verdict left or joined."""
        history = [entry for change in changes if (entry := history_entry(change, at_ms)) is not None]
        written = [verdict_row(c.verdict) for c in changes]
        self.rows.store_changes(written, history, reconciled)
        left = [verdict_row(c.previous) for c in changes if c.previous is not None]
        minutes = minutes_touched([*written, *left])
        if minutes:
            outcomes = self.rows.read_outcomes([minute.span for minute in minutes])
            self.rows.upsert_metrics([minute_metrics(minute, outcomes[minute.span]) for minute in minutes])

    def record(self, judged: Iterable[Verdict], at_ms: int) -> list[Change]:
        """The detector's new verdicts, settled against what is stored (late evidence never makes one worse)."""
        judged = list(judged)
        stored = self.stored_verdicts({v.message_id for v in judged})
        changes = []
        for verdict in judged:
            change = settle(stored.get(verdict.message_id, {}).get(verdict.hop), verdict)
            if change is not None:
                changes.append(change)
                stored.setdefault(verdict.message_id, {})[verdict.hop] = change.verdict
        self.apply(changes, (), at_ms)
        return changes
