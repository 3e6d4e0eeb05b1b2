"""A retention run: remove what is older than its kind's cutoff (:mod:`khipu.retention.policy`), keeping what a
pending resend still needs, and say what went and what is kept.

What a resend needs of a confirmed loss (a CONFIRMED_LOST verdict on a stream whose resend is not ``off``): its
verdicts (the loss itself, and the read hop's DELIVERED a processor's write-hop loss is resent from) and its
traces (the recovery attributes a resend hook is given). For those messages, whatever their age:

- the store's verdicts and history are not deleted;
- a verdict-archive hour about to go first copies their archived verdicts into the store (where a row of the
  same message and hop wins anyway: :mod:`khipu.verdicts.read`);
- a trace-archive hour about to go is reduced to their traces (``batch_id=-1``: no detector batch has that
  key), rather than removed.

A dry run says all of it and changes nothing: store deletions run in transactions that are rolled back, so its
counts are exact.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from khipu.registry.model import Registry, ResendMode
from khipu.retention.policy import REMOVABLE_VERDICTS, RetentionPlan
from khipu.retention.usage import archive_hours, folder_bytes
from khipu.storage.location import Location
from khipu.storage.parquet import parquet_bytes
from khipu.store import Store
from khipu.store.verdicts import Summarize
from khipu.trace import archive
from khipu.trace.archive import HOUR_MS, hour_of
from khipu.verdicts.archive import VerdictArchive
from khipu.verdicts.model import VerdictKind

log = logging.getLogger(__name__)

KEPT_BATCH = "batch_id=-1"  # a trace-archive hour rewritten to the traces a pending resend needs
ROLLUP_SPAN_MS = HOUR_MS  # old per-minute metrics become per-hour


@dataclass(frozen=True, slots=True)
class Pinned:
    """Messages whose confirmed loss still waits for a resend: kept whatever their age."""

    message_ids: frozenset[str]
    hours: frozenset[str]  # the trace-archive hours their traces are in (as the resend reads them)
    streams: frozenset[str]  # the streams whose confirmed losses a resend may still act on

    @property
    def described(self) -> str:
        return f"{len(self.message_ids)} confirmed loss(es) awaiting resend"


@dataclass(slots=True)
class RetentionReport:
    """What a run removed (or would, in a dry run), by kind, and what it kept back."""

    plan: RetentionPlan
    dry_run: bool
    removed: dict[str, int] = field(default_factory=dict)  # kind -> rows, hours or bytes (named in the kind)
    kept: dict[str, str] = field(default_factory=dict)  # kind -> what was kept back and why
    lines: list[str] = field(default_factory=list)  # the progress log, in order

    def say(self, progress: Callable[[str], None], line: str) -> None:
        self.lines.append(line)
        progress(line)

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "now_ms": self.plan.now_ms,
            "cutoffs": {kind: hour_of(at) for kind, at in self.plan.cutoffs().items()},
            "removed": dict(self.removed),
            "kept": dict(self.kept),
        }


def pinned_for_resend(store: Store, registry: Registry) -> Pinned:
    """The confirmed losses a resend may still act on (their stream's resend is not ``off``; a stream the
    registry no longer has cannot be resent), and the trace-archive hours their traces are in."""
    resendable = {name for name, stream in registry.streams.items() if stream.resend.mode is not ResendMode.OFF}
    losses = [row for row in store.verdicts.of_kind(VerdictKind.CONFIRMED_LOST) if row["stream"] in resendable]
    hours = {
        hour_of(h * HOUR_MS)
        for row in losses
        for h in range(
            (int(row["first_seen_ms"] or row["decided_ms"]) - HOUR_MS) // HOUR_MS, int(row["decided_ms"]) // HOUR_MS + 1
        )
    }
    return Pinned(frozenset(row["message_id"] for row in losses), frozenset(hours), frozenset(resendable))


def run_retention(
    store: Store,
    trace_archive: Location | Path,
    verdict_archive: Location | Path,
    registry: Registry,
    plan: RetentionPlan,
    summarize: Summarize,
    *,
    dry_run: bool = False,
    progress: Callable[[str], None] = log.info,
) -> RetentionReport:
    """Remove everything older than the plan's cutoffs, kind by kind, keeping what a pending resend needs (see
    the module's doc); a dry run changes nothing and reports the same. Safe to repeat: a second run at the same
    ``now`` removes nothing more. Each archive is a local folder or an object-store prefix."""
    trace_root = Location.of(trace_archive, "trace archive")
    verdict_root = Location.of(verdict_archive, "verdict archive")
    report = RetentionReport(plan, dry_run)
    would = "would remove" if dry_run else "removed"
    pinned = pinned_for_resend(store, registry)
    if pinned.message_ids:
        report.say(progress, f"keeping the verdicts and traces of {pinned.described}, whatever their age")

    hours, freed, rewritten = _prune_trace_archive(trace_root, plan.trace_archive_before_ms, pinned, dry_run)
    report.removed.update({"trace_archive_hours": hours, "trace_archive_bytes": freed})
    if rewritten:
        report.kept["trace_archive"] = f"{rewritten} hour(s) reduced to the traces of {pinned.described}"
    before = hour_of(plan.trace_archive_before_ms)
    report.say(
        progress,
        f"trace archive: {would} {hours} hour(s) before {before}, {freed:,} bytes; {rewritten} kept for resends",
    )

    hours, freed, copied = _prune_verdict_archive(store, verdict_root, plan.verdict_archive_before_ms, pinned, dry_run)
    report.removed.update({"verdict_archive_hours": hours, "verdict_archive_bytes": freed})
    if copied:
        report.kept["verdict_archive"] = f"{copied} archived verdict(s) of {pinned.described} copied to the store"
    before = hour_of(plan.verdict_archive_before_ms)
    report.say(
        progress,
        f"verdict archive: {would} {hours} hour(s) before {before}, {freed:,} bytes; {copied} kept in the store",
    )

    verdicts, history = store.verdicts.prune(
        plan.verdicts_before_ms, sorted(REMOVABLE_VERDICTS), keep_losses_of=pinned.streams, dry_run=dry_run
    )
    report.removed.update({"verdicts": verdicts, "verdict_history": history})
    report.say(
        progress,
        f"store: {would} {verdicts:,} verdict(s) and {history:,} history entr(ies) decided before "
        f"{hour_of(plan.verdicts_before_ms)} (LOST and PENDING are kept at any age: reconciliation decides them)",
    )

    quarantined = store.channel.prune_quarantine(plan.quarantine_before_ms, dry_run=dry_run)
    gaps = store.channel.prune_gaps(plan.quarantine_before_ms, dry_run=dry_run)
    skips = store.heartbeat.prune_skips(plan.quarantine_before_ms, dry_run=dry_run)
    beats = store.heartbeat.prune(plan.heartbeats_before_ms, dry_run=dry_run)
    report.removed.update({"quarantine": quarantined, "trace_gaps": gaps, "trace_skips": skips, "heartbeats": beats})
    report.say(
        progress,
        f"store: {would} {quarantined:,} quarantined record(s) before {hour_of(plan.quarantine_before_ms)}, "
        f"{gaps:,} emitter sequence gap(s) and {skips:,} skipped trace-topic range(s) (their alert told) detected "
        f"before {hour_of(plan.quarantine_before_ms)}, {beats:,} heartbeat(s) before "
        f"{hour_of(plan.heartbeats_before_ms)}",
    )

    # old metrics go first and the roll-up starts where they end: a dry run, which removes nothing, counts the same
    metrics = store.verdicts.prune_metrics(plan.metrics_before_ms, dry_run=dry_run)
    folded = store.verdicts.roll_up(
        plan.minutes_before_ms, ROLLUP_SPAN_MS, summarize, since_ms=plan.metrics_before_ms, dry_run=dry_run
    )
    report.removed.update({"minute_metric_parts_rolled_up": folded, "metrics": metrics})
    report.say(
        progress,
        f"metrics: {'would roll' if dry_run else 'rolled'} {folded:,} per-minute part(s) before "
        f"{hour_of(plan.minutes_before_ms)} into hours; {would} {metrics:,} metric row(s) before "
        f"{hour_of(plan.metrics_before_ms)}",
    )
    return report


def _prune_trace_archive(root: Location, before_ms: int, pinned: Pinned, dry_run: bool) -> tuple[int, int, int]:
    """Remove the trace archive's hours before ``before_ms``; an hour holding a pinned message's traces is rewritten
    to hold only those. Returns (hours removed, bytes freed, hours rewritten)."""
    cutoff = hour_of(before_ms)
    removed = freed = rewritten = 0
    for hour in archive_hours(root):
        if hour >= cutoff:
            break
        folder = root / f"hour={hour}"
        size = folder_bytes(folder)
        kept = _kept_traces(folder, pinned.message_ids, dry_run) if hour in pinned.hours else None
        if kept is not None:
            rewritten += 1
            freed += size - kept
            continue
        removed += 1
        freed += size
        if not dry_run:
            folder.delete()
    return removed, freed, rewritten


def _kept_traces(folder: Location, message_ids: Collection[str], dry_run: bool) -> int | None:
    """Reduce an hour folder to the traces of these messages (one file, batch_id=-1) and return its new size in
    bytes; None (left as it is) when it holds none of them. The kept file is written whole
    (:meth:`Location.write_bytes`: a local file renamed into place, an object uploaded in one piece) before the
    other batches' folders go, so the traces are always there (for a moment twice: readers drop a trace archived
    twice) and a run that stops half-way is finished by the next. A dry run measures the file in memory and
    writes nothing."""
    batches = folder.child_folders("batch_id=")
    files = [path for name in batches for path in (folder / name).files() if path.endswith(".parquet")]
    if not files:
        return None
    dataset = ds.dataset(files, format="parquet", schema=archive.SCHEMA, filesystem=folder.filesystem())
    table = dataset.to_table(filter=ds.field("message_id").isin(sorted(message_ids)))
    if not table.num_rows:
        return None
    data = parquet_bytes(table)
    if dry_run:
        return len(data)
    if batches != [KEPT_BATCH]:
        (folder / KEPT_BATCH / "part-0.parquet").write_bytes(data)
        for name in batches:
            if name != KEPT_BATCH:
                (folder / name).delete()
    return folder_bytes(folder)


def _prune_verdict_archive(
    store: Store, root: Location, before_ms: int, pinned: Pinned, dry_run: bool
) -> tuple[int, int, int]:
    """Remove the verdict archive's hours before ``before_ms`` (and their index rows), first copying the pinned
    messages' archived verdicts into the store. Returns (hours removed, bytes freed, verdicts copied)."""
    cutoff = hour_of(before_ms)
    going = [hour for hour in archive_hours(root) if hour < cutoff]
    if not going:
        return 0, 0, 0
    freed = sum(folder_bytes(root / f"hour={hour}") for hour in going)
    with VerdictArchive(root, store) as verdicts:
        pinned_hours = [hour for hour in going if hour in pinned.hours]
        kept = verdicts.read_messages(pinned.message_ids, hours=pinned_hours) if pinned_hours else []
        if dry_run:
            return len(going), freed, len(kept)
        if kept:
            stored = {
                (r["message_id"], r["hop"]) for r in store.verdicts.read_messages({r["message_id"] for r in kept})
            }
            store.verdicts.upsert([_as_row(r) for r in kept if (r["message_id"], r["hop"]) not in stored])
        verdicts.prune(before_ms)
    return len(going), freed, len(kept)


def _as_row(archived: Mapping[str, Any]) -> dict[str, Any]:
    """An archived verdict as the store's upsert takes it (``group`` for ``group_id``)."""
    row = dict(archived)
    row["group"] = row.pop("group_id", None)
    return row
