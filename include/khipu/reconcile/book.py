"""The stored verdicts as the settle rules see them: Verdict values in, changes with their history out.

Both judges store through here: the streaming detector's writer (:meth:`VerdictBook.record`) and
reconciliation (:meth:`VerdictBook.apply`). The store keeps rows; this side turns them into
:class:`~khipu.detector.model.Verdict` values and back, and says what the history records.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
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
        guards: Sequence[Mapping[str, Any] | None],
        history: Sequence[Mapping[str, Any] | None],
    ) -> set[tuple[str, str]]: ...

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


@dataclass(frozen=True)
class Recorded:
    """What the detector's batch did: the changes stored, and every judged hop's verdict as stored now."""

    changes: list[Change]
    current: dict[tuple[str, str], Verdict]


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

    def apply(self, changes: Sequence[Change], at_ms: int) -> set[tuple[str, str]]:
        """Store the changes with their history, each only if its row is still what it was decided against,
        and recompute the metrics of every minute a changed verdict is in. Returns the keys that changed
        meanwhile (not applied)."""
        guards = [_guard(c.previous) for c in changes]
        history = [history_entry(change, at_ms) for change in changes]
        conflicts = self.rows.store_changes([verdict_row(c.verdict) for c in changes], guards, history)
        applied = [c for c in changes if (c.verdict.message_id, c.verdict.hop) not in conflicts]
        self.refresh_metrics([c.verdict for c in applied] + [c.previous for c in applied if c.previous])
        return conflicts

    def refresh_metrics(self, verdicts: Iterable[Verdict]) -> None:
        """Recompute the metrics of the (stream, hop, minute) of each verdict from what is stored."""
        minutes = minutes_touched([verdict_row(v) for v in verdicts])
        if minutes:
            outcomes = self.rows.read_outcomes([minute.span for minute in minutes])
            self.rows.upsert_metrics([minute_metrics(minute, outcomes[minute.span]) for minute in minutes])

    def record(self, judged: Iterable[Verdict], at_ms: int, attempts: int = 3) -> Recorded:
        """The detector's new verdicts, settled against what is stored (late evidence never makes one worse).
        A verdict whose row changed meanwhile is settled again against the new row."""
        pending = list(judged)
        changes: list[Change] = []
        current: dict[tuple[str, str], Verdict] = {}
        for _ in range(attempts):
            stored = self.stored_verdicts({v.message_id for v in pending})
            batch: list[Change] = []
            for verdict in pending:
                before = stored.get(verdict.message_id, {}).get(verdict.hop)
                change = settle(before, verdict)
                key = (verdict.message_id, verdict.hop)
                if change is not None:
                    batch.append(change)
                    stored.setdefault(verdict.message_id, {})[verdict.hop] = change.verdict
                    current[key] = change.verdict
                elif before is not None:
                    current[key] = before
            conflicts = self.apply(batch, at_ms)
            changes.extend(c for c in batch if (c.verdict.message_id, c.verdict.hop) not in conflicts)
            pending = [v for v in pending if (v.message_id, v.hop) in conflicts]
            if not pending:
                break
        if pending:
            raise RuntimeError(f"{len(pending)} verdicts kept changing under this writer; the batch is retried")
        self.refresh_metrics(current.values())  # a replayed batch refreshes what a failed one may have missed
        return Recorded(changes, current)


def _guard(previous: Verdict | None) -> dict[str, Any] | None:
    if previous is None:
        return None
    return {"verdict": previous.kind.value, "decided_ms": previous.decided_ms, "late_evidence": previous.late_evidence}
