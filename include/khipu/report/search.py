"""Finding any message: by its id or by a recovery attribute (``order_id=226``), newest first.

Three places hold what is known of a message: the SQL store (every verdict but the plain DELIVERED ones), the
verdict archive (those, with an index of the micro-batches that decided each message) and the trace archive
(every trace, Parquet by arrival hour; the only place recovery attributes are kept). A search asks:

- **by id**: the store (its primary key) and the verdict archive (its index), at any time; the trace archive's
  hours within the range;
- **by attribute**: the trace archive's hours within the range, only the streams whose registry entry declares
  that attribute; then the store and the verdict archive for the messages found.

The trace archive (a local folder or an object store) is scanned newest hour first, and a search reads at most
``max_scan_bytes`` of it (the Parquet files' size): an older part of the range that does not fit is left out, and
the answer says which hours were read, how much the range holds, the bound, and the ``until`` that searches the
next older part.

Given the registry as one person sees it (the view's), only the messages of its streams are found: another
team's message is not found, as one that does not exist.

The pure parts (:func:`parse_term`, :func:`plan_scan`, :func:`gather`) take everything as arguments; only
:func:`search` reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.dataset as ds

from khipu.access import reach_limit
from khipu.clock import iso_text
from khipu.reconcile.window import hour_start_ms
from khipu.registry.model import Registry
from khipu.report.limits import MAX_TIME_MS
from khipu.report.service import ReportQueryError
from khipu.retention.usage import hour_data_bytes
from khipu.storage.location import Location
from khipu.store import Store
from khipu.trace.archive import HOUR_MS, hour_folder, hour_of
from khipu.verdicts.archive import VerdictArchive
from khipu.verdicts.read import verdicts_of

MAX_SCAN_BYTES = 512 * 1024 * 1024  # of the trace archive's Parquet files a search reads at most
DEFAULT_RESULTS = 50
MAX_RESULTS = 500
ID_PREFIX = "id:"  # "id:a=b" looks for the message id "a=b", never for an attribute
ATTRIBUTE_TERM = re.compile(r"([A-Za-z_][A-Za-z0-9_.-]*)=([^=].*)", re.S)  # name=value; "abc==" is an id
STORE, VERDICT_ARCHIVE, TRACE_ARCHIVE = "store", "verdict archive", "trace archive"
_PLAIN_JSON = re.compile(r"[\x20\x21\x23-\x2e\x30-\x5b\x5d-\x7e]+")  # printable ASCII but " / \: as JSON writes it


@dataclass(frozen=True, slots=True)
class SearchTerm:
    """What the search box held: a message id, or a recovery attribute and its value."""

    text: str
    message_id: str | None = None
    attribute: str | None = None
    value: str | None = None

    @property
    def kind(self) -> str:
        return "message id" if self.message_id is not None else "recovery attribute"


def declared_attributes(registry: Registry) -> dict[str, tuple[str, ...]]:
    """Each recovery attribute the registry declares, with the streams declaring it."""
    declared: dict[str, set[str]] = {}
    for name, stream in registry.streams.items():
        for attribute in stream.recovery_attributes:
            declared.setdefault(attribute, set()).add(name)
    return {attribute: tuple(sorted(streams)) for attribute, streams in sorted(declared.items())}


def parse_term(text: str, declared: Mapping[str, Collection[str]]) -> SearchTerm:
    """``name=value`` with a declared recovery attribute's name is an attribute search; ``id:...`` and anything
    else is a message id. ``name=value`` with a name no stream declares is refused, naming those declared."""
    term = text.strip()
    known = ", ".join(sorted(declared)) or "none declared"
    if not term:
        raise ReportQueryError("q", text, f"a message id, or a recovery attribute as name=value ({known})")
    if term.startswith(ID_PREFIX) and len(term) > len(ID_PREFIX):
        return SearchTerm(text, message_id=term[len(ID_PREFIX) :])
    matched = ATTRIBUTE_TERM.fullmatch(term)
    if matched is None:
        return SearchTerm(text, message_id=term)
    name, value = matched.group(1), matched.group(2).strip()
    if name not in declared:
        raise ReportQueryError(
            "q",
            text,
            f"a recovery attribute the registry declares ({known}) as name=value, "
            f"or {ID_PREFIX}{term} for a message id holding '='",
        )
    return SearchTerm(text, attribute=name, value=value)


@dataclass(frozen=True, slots=True)
class ArchiveHour:
    hour: int  # ms // HOUR_MS
    bytes: int  # its Parquet files' size


@dataclass(frozen=True, slots=True)
class ScanPlan:
    """The trace-archive hours a search reads (newest first) out of those its range holds."""

    hours: tuple[int, ...]  # read, newest first
    scanned_bytes: int
    range_hours: int  # hours of the archive within the range
    range_bytes: int
    left_out: tuple[int, ...]  # older hours of the range not read (newest first)
    max_bytes: int

    @property
    def complete(self) -> bool:
        return not self.left_out

    @property
    def older_until_ms(self) -> int | None:
        """The ``until`` that searches the part left out: the start of the oldest hour read."""
        if self.complete:
            return None
        return (self.hours[-1] if self.hours else self.left_out[0] + 1) * HOUR_MS

    @property
    def note(self) -> str | None:
        """Why the range was not searched whole (None: it was)."""
        if self.complete:
            return None
        bound = f"a search reads at most {_size(self.max_bytes)} of the trace archive, newest hour first"
        held = f"the range holds {self.range_hours} trace-archive hours, {_size(self.range_bytes)}"
        if not self.hours:
            return (
                f"{held}, and its newest hour, {hour_of(self.left_out[0] * HOUR_MS)}, alone holds more than the bound "
                f"({bound}): no trace-archive hour was searched; traces are searched only where they fit"
            )
        oldest = self.left_out[-1]
        return (
            f"{held}; {bound}: searched {hour_of(self.hours[-1] * HOUR_MS)} .. {hour_of(self.hours[0] * HOUR_MS)} "
            f"({len(self.hours)} hours, {_size(self.scanned_bytes)}); not searched: {hour_of(oldest * HOUR_MS)} .. "
            f"{hour_of(self.left_out[0] * HOUR_MS)} ({len(self.left_out)} hours). Search again with until="
            f"{iso_text(self.older_until_ms or 0)} for those, or narrow the range"
        )


def plan_scan(hours: Iterable[ArchiveHour], since_ms: int, until_ms: int, max_bytes: int) -> ScanPlan:
    """The hours overlapping ``[since_ms, until_ms)``, newest first, read while their sizes add up to at most
    ``max_bytes``: the newest part of the range, without gaps; the older rest is left out."""
    within = sorted(
        (h for h in hours if h.hour * HOUR_MS < until_ms and (h.hour + 1) * HOUR_MS > since_ms),
        key=lambda h: -h.hour,
    )
    read: list[ArchiveHour] = []
    total = 0
    for hour in within:
        if total + hour.bytes > max_bytes:
            break
        read.append(hour)
        total += hour.bytes
    return ScanPlan(
        hours=tuple(h.hour for h in read),
        scanned_bytes=total,
        range_hours=len(within),
        range_bytes=sum(h.bytes for h in within),
        left_out=tuple(h.hour for h in within[len(read) :]),
        max_bytes=max_bytes,
    )


@dataclass(frozen=True, slots=True)
class Sighting:
    """One place a message was seen: a verdict (store or verdict archive) or a trace."""

    message_id: str
    stream: str | None
    at_ms: int  # a verdict's decision, a trace's time
    source: str  # STORE | VERDICT_ARCHIVE | TRACE_ARCHIVE
    hop: str | None = None
    verdict: str | None = None
    attributes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FoundMessage:
    message_id: str
    stream: str | None
    first_ms: int
    last_ms: int  # the newest sighting: what "newest first" orders by
    sources: tuple[str, ...]  # where it was seen: store, verdict archive, trace archive
    verdicts: dict[str, str]  # hop -> its verdict (the store's row winning over the archive's)
    attributes: dict[str, str]  # recovery attributes, from its traces
    traces: int  # traces read in the searched hours


def gather(sightings: Iterable[Sighting], limit: int) -> tuple[list[FoundMessage], bool]:
    """Sightings per message, newest first (by the newest sighting, then id); at most ``limit``, and whether
    more were found."""
    by_id: dict[str, list[Sighting]] = {}
    for sighting in sightings:
        by_id.setdefault(sighting.message_id, []).append(sighting)
    found = []
    for message_id, seen in by_id.items():
        verdicts: dict[str, str] = {}
        for s in sorted(seen, key=lambda s: s.source != STORE):  # the store's row wins per hop
            if s.hop is not None and s.verdict is not None:
                verdicts.setdefault(s.hop, s.verdict)
        attributes: dict[str, str] = {}
        for s in sorted(seen, key=lambda s: s.at_ms):
            attributes.update(s.attributes)
        found.append(
            FoundMessage(
                message_id=message_id,
                stream=next((s.stream for s in seen if s.stream), None),
                first_ms=min(s.at_ms for s in seen),
                last_ms=max(s.at_ms for s in seen),
                sources=tuple(
                    src for src in (STORE, VERDICT_ARCHIVE, TRACE_ARCHIVE) if any(s.source == src for s in seen)
                ),
                verdicts=dict(sorted(verdicts.items())),
                attributes=attributes,
                traces=sum(s.source == TRACE_ARCHIVE for s in seen),
            )
        )
    found.sort(key=lambda m: (-m.last_ms, m.message_id))
    return found[:limit], len(found) > limit


def verdict_sightings(rows: Iterable[Mapping[str, Any]]) -> list[Sighting]:
    """Verdict rows as :func:`khipu.verdicts.read.verdicts_of` gives them (an SQL row has ``announced_ms``, an
    archived one does not)."""
    return [
        Sighting(
            str(row["message_id"]),
            str(row["stream"]),
            int(row["decided_ms"]),
            STORE if "announced_ms" in row else VERDICT_ARCHIVE,
            hop=str(row["hop"]),
            verdict=str(row["verdict"]),
        )
        for row in rows
    ]


@dataclass(frozen=True, slots=True)
class SearchAnswer:
    term: str
    kind: str  # "message id" | "recovery attribute"
    since_ms: int
    until_ms: int | None  # None: up to the newest
    messages: list[FoundMessage]
    more: bool  # more messages matched than the limit
    complete: bool  # the whole range of the trace archive was searched
    hours_searched: int
    bytes_searched: int
    older_until_ms: int | None  # search again with this until for the part of the range left out
    notes: list[str] = field(default_factory=list)


def search(
    store: Store,
    registry: Registry,
    archive_dir: Location | Path | None,
    verdict_archive_dir: Location | Path | None,
    text: str,
    *,
    since_ms: int | None,
    until_ms: int | None,
    limit: int = DEFAULT_RESULTS,
    max_scan_bytes: int = MAX_SCAN_BYTES,
) -> SearchAnswer:
    """Messages matching the search box's ``text`` (an id or ``name=value``), newest first."""
    if not 1 <= limit <= MAX_RESULTS:
        raise ReportQueryError("limit", limit, f"1 to {MAX_RESULTS} messages")
    declared = declared_attributes(registry)
    term = parse_term(text, declared)
    since = 0 if since_ms is None else since_ms
    until = MAX_TIME_MS + 1 if until_ms is None else until_ms  # no end: a trace timed ahead of our clock too
    if until <= since:
        raise ReportQueryError("until", until, f"a time after since ({since}, {iso_text(since)})")
    plan = plan_scan(archive_hours(archive_dir), since, until, max_scan_bytes)
    notes = [plan.note] if plan.note else []
    reach = reach_limit(registry)
    if term.message_id is not None:
        traces = scan_traces(archive_dir, plan.hours, since, until, message_id=term.message_id)
        ids: list[str] = [term.message_id]
    else:
        assert term.attribute is not None and term.value is not None
        traces = scan_traces(
            archive_dir,
            plan.hours,
            since,
            until,
            attribute=(term.attribute, term.value),
            streams=declared[term.attribute],
        )
        ids = sorted({t.message_id for t in traces})
    if reach is not None:  # the streams this person sees
        traces = [t for t in traces if t.stream in reach.streams]
    if term.message_id is None:  # keep the newest ``limit`` messages (and one more: is there more?) before reading
        kept, _ = gather(traces, limit + 1)
        ids = [m.message_id for m in kept]
    if verdict_archive_dir is None:
        verdicts = verdicts_of(store.verdicts, None, ids)
    else:
        with VerdictArchive(verdict_archive_dir, store) as archive:
            verdicts = verdicts_of(store.verdicts, archive, ids)
    if verdicts.note:
        notes.append(verdicts.note)
    rows = [r for r in verdicts.rows if reach is None or str(r["stream"]) in reach.streams]
    wanted = set(ids)
    messages, more = gather([*(t for t in traces if t.message_id in wanted), *verdict_sightings(rows)], limit)
    return SearchAnswer(
        term=term.text,
        kind=term.kind,
        since_ms=since,
        until_ms=until_ms,
        messages=messages,
        more=more,
        complete=plan.complete,
        hours_searched=len(plan.hours),
        bytes_searched=plan.scanned_bytes,
        older_until_ms=plan.older_until_ms,
        notes=notes,
    )


def archive_hours(archive_dir: Location | Path | None) -> list[ArchiveHour]:
    """The trace archive's hours with their Parquet files' bytes (an archive not there holds none), from one
    listing of the archive, a local folder or an object store alike."""
    if archive_dir is None:
        return []
    return [
        ArchiveHour(hour_start_ms(hour) // HOUR_MS, size)
        for hour, size in hour_data_bytes(Location.of(archive_dir, "archive")).items()
    ]


def scan_traces(
    archive_dir: Location | Path | None,
    hours: Sequence[int],
    since_ms: int,
    until_ms: int,
    *,
    message_id: str | None = None,
    attribute: tuple[str, str] | None = None,
    streams: Collection[str] = (),
) -> list[Sighting]:
    """The traces in these archive hours of one message, or of the messages of ``streams`` whose recovery
    attribute ``attribute`` (name, value) holds that value, timed within ``[since_ms, until_ms)``; read hour by
    hour and batch by batch (never a whole hour in memory)."""
    if archive_dir is None or not hours:
        return []
    root = Location.of(archive_dir, "archive")
    files = hour_files(root, hours)
    if not files:
        return []
    columns = ["message_id", "stream", "timestamp_ms", "attributes"]
    condition = (ds.field("timestamp_ms") >= since_ms) & (ds.field("timestamp_ms") < until_ms)
    if message_id is not None:
        condition &= ds.field("message_id") == message_id
    elif attribute is not None:
        condition &= ds.field("stream").isin(sorted(streams))
    found: list[Sighting] = []
    dataset = ds.dataset(files, format="parquet", filesystem=root.filesystem())
    for batch in dataset.to_batches(columns=columns, filter=condition):
        if attribute is not None:
            value = attribute[1]
            if _PLAIN_JSON.fullmatch(value):  # cheap first cut on the raw JSON text; the exact test below
                batch = batch.filter(pc.fill_null(pc.match_substring(batch.column("attributes"), value), False))
            if not batch.num_rows:
                continue
        for row in batch.to_pylist():
            attributes = _attributes(row["attributes"])
            if attribute is not None and attributes.get(attribute[0]) != attribute[1]:
                continue
            found.append(
                Sighting(
                    row["message_id"], row["stream"], int(row["timestamp_ms"]), TRACE_ARCHIVE, attributes=attributes
                )
            )
    return found


def hour_files(root: Location, hours: Iterable[int]) -> list[str]:
    """The Parquet files of these archive hours (ms // HOUR_MS), as paths in ``root``'s file system; what is
    being written or kept for bookkeeping (a name starting with ``.`` or ``_``) is not read."""
    return [
        path
        for hour in hours
        for path in (root / hour_folder(hour * HOUR_MS)).files(recursive=True)
        if path.endswith(".parquet")
    ]


def _attributes(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _size(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
