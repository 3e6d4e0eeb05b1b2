"""Compacting the archives: which hours are closed, and the run (from the retention DAG) that compacts them.

Each archive hour the detector will not write again is rewritten as a bounded number of files
(:mod:`khipu.storage.compaction` says how, and why a crash at any point loses nothing). An hour is closed when both
hold:

1. the detector has read the trace topic past the hour's end by :data:`CLOSED_MARGIN_MS` (its heartbeat's
   ``read_to``, the trace topic's time). Every trace of the hour (its arrival time is the topic's) is then in
   the trace archive; and every verdict the verdict archive files under the hour (by when it was decided, the
   detector's clock) was written by a batch that ran before the one that read that far, Spark running one batch
   at a time. The margin covers the clocks of the broker and the executors being apart;
2. the batch the archive's commit record names, the only one Spark may still replay
   (:func:`khipu.storage.batches.last_batch`), wrote nothing in it: a replay removes its earlier files.

An hour that is closed and not compacted yet is compacted; one that is not closed waits for a later run. A
micro-batch folder that still appears in a compacted hour (a late writer) makes it not compacted: the next run
merges it in. A second run finds nothing to do.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from khipu.clock import iso_text
from khipu.retention.usage import archive_hours
from khipu.storage.batches import last_batch
from khipu.storage.compaction import Compaction, CompactionSpec, HourListing, compact_hour, list_hour
from khipu.storage.location import Location
from khipu.trace import archive as trace_archive
from khipu.trace.archive import HOUR_MS, hour_start_ms
from khipu.verdicts import archive as verdict_archive

log = logging.getLogger(__name__)

CLOSED_MARGIN_MS = 10 * 60_000  # read past an hour's end by this much before it is closed
MIB = 1024 * 1024


def why_open(hour: str, read_to_ms: int | None, replayable: Collection[str], margin_ms: int) -> str | None:
    """Why an archive hour may still be written (None: it is closed). ``replayable``: the hours (YYYY-MM-DD-HH)
    the batch that may be replayed wrote in."""
    closes_ms = hour_start_ms(hour) + HOUR_MS + margin_ms
    if read_to_ms is None:
        return "the detector has not said how far it has read the trace topic"
    if read_to_ms < closes_ms:
        return f"the detector has read to {iso_text(read_to_ms)}, not {margin_ms // 60_000} min past the hour's end"
    if hour in replayable:
        return "the newest micro-batch wrote in it and may still be replayed"
    return None


@dataclass(frozen=True, slots=True)
class HourCompacted:
    """One hour compacted (or, in a dry run, that would be), with the seconds it took."""

    hour: str
    compaction: Compaction | None  # None: a dry run
    listing: HourListing
    seconds: float

    def describe(self, archive: str) -> str:
        before = self.listing
        if self.compaction is None:
            return f"{archive} hour {self.hour}: would compact {len(before.files):,} files, {_size(before.bytes)}"
        done = self.compaction
        copies = done.rows_before - done.rows_after
        return (
            f"{archive} hour {self.hour}: {done.files_before:,} files -> {done.files_after:,}, "
            f"{_size(done.bytes_before)} -> {_size(done.bytes_after)}, {done.rows_after:,} rows"
            f"{f' ({copies:,} written twice, kept once)' if copies else ''}, {self.seconds:.1f} s"
        )


@dataclass(slots=True)
class ArchiveCompaction:
    """What a run did to one archive."""

    name: str
    hours: list[HourCompacted] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)  # hour -> why it is not closed
    already: int = 0  # hours found compacted

    def as_dict(self) -> dict[str, Any]:
        """Per hour compacted (or, in a dry run, to compact): files and bytes before and after, seconds; then the
        totals, how many hours were compacted before and why the others wait."""
        by_hour = {
            hour.hour: {
                "files_before": len(hour.listing.files),
                "files_after": hour.compaction.files_after if hour.compaction else None,
                "bytes_before": hour.listing.bytes,
                "bytes_after": hour.compaction.bytes_after if hour.compaction else None,
                "seconds": round(hour.seconds, 3),
            }
            for hour in self.hours
        }
        return {
            "hours": sorted(by_hour),
            "by_hour": by_hour,
            "files_before": sum(figures["files_before"] or 0 for figures in by_hour.values()),
            "files_after": sum(figures["files_after"] or 0 for figures in by_hour.values()),
            "bytes_before": sum(figures["bytes_before"] or 0 for figures in by_hour.values()),
            "bytes_after": sum(figures["bytes_after"] or 0 for figures in by_hour.values()),
            "already_compacted": self.already,
            "waiting": dict(self.waiting),
        }


def compact_archive(
    root: Location,
    spec: CompactionSpec,
    read_to_ms: int | None,
    target_bytes: int,
    *,
    margin_ms: int = CLOSED_MARGIN_MS,
    dry_run: bool = False,
    progress: Callable[[str], None] = log.info,
) -> ArchiveCompaction:
    """Compact every closed hour of the archive not compacted yet, oldest first, saying each in a line (files
    before -> after, bytes, seconds); a dry run lists them and changes nothing."""
    report = ArchiveCompaction(spec.name)
    pending = last_batch(root)
    replayable = {name.removeprefix("hour=") for name in pending.hour_folders} if pending is not None else set()
    for hour in archive_hours(root):
        reason = why_open(hour, read_to_ms, replayable, margin_ms)
        if reason is not None:
            report.waiting[hour] = reason
            continue
        listing = list_hour(root, f"hour={hour}")
        if listing.compacted:
            report.already += 1
            continue
        started = time.monotonic()
        done = None if dry_run else compact_hour(root, listing, spec, target_bytes)
        compacted = HourCompacted(hour, done, listing, time.monotonic() - started)
        report.hours.append(compacted)
        progress(compacted.describe(spec.name))
    if not report.hours:
        progress(
            f"{spec.name}: nothing to compact ({report.already} hour(s) compacted before, "
            f"{len(report.waiting)} not closed yet)"
        )
    for hour, reason in report.waiting.items():
        log.debug("%s hour %s waits: %s", spec.name, hour, reason)
    return report


def compact_archives(
    trace_root: Location,
    verdict_root: Location,
    read_to_ms: int | None,
    target_mib: int,
    *,
    dry_run: bool = False,
    progress: Callable[[str], None] = log.info,
) -> dict[str, ArchiveCompaction]:
    """Both archives' closed hours compacted into files of about ``target_mib`` MiB (:func:`compact_archive`)."""
    return {
        spec.name: compact_archive(root, spec, read_to_ms, target_mib * MIB, dry_run=dry_run, progress=progress)
        for root, spec in ((trace_root, trace_archive.COMPACTION), (verdict_root, verdict_archive.COMPACTION))
    }


def _size(n: int) -> str:
    return f"{n / MIB:,.1f} MiB" if n >= MIB else f"{n:,} B"
