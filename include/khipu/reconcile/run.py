"""One reconciliation run: read a window of the trace archive with Spark, re-decide what is not final.

1. Read the archive's hours (Parquet, partitioned by hour) from one horizon before the window to now:
   a message first seen just before the window keeps its earlier traces, and evidence that came
   after the horizon counts too (a late trace must never be outvoted by a read that stops early).
2. The window's messages (their first trace arrived in ``[start, end)``, by the trace topic's broker time, never
   an application's clock) minus those whose verdicts are all final already (DELIVERED, DUPLICATE,
   CONFIRMED_LOST, RETRACTED, ABORTED, SUPERSEDED, without late evidence): the rest (LOST, PENDING,
   TRACE_LOST, late evidence, or never judged) are re-decided with all their traces. The
   verdicts are the SQL rows and the verdict archive's plain DELIVERED ones (the SQL row winning per
   hop): the archive's hours are read with Spark too, and a message with archived verdicts is settled
   unless it has an open SQL row (the few of those are asked of the store by time, not by id), so
   the window's many delivered messages are never collected to the driver.
3. Back-pointers in the archive tell which positions an emitter received though its trace is
   missing; a pointer at a position where no trace of any message lies is a *lead*: the message
   there is named by reading the record's id header from Kafka (while the log holds it), and
   listed with what is known when it cannot be.
4. :func:`khipu.reconcile.window.rejudge` and :func:`khipu.verdicts.settle.settle` say what changes;
   the verdict book stores it with its history (nothing in a dry run).

Spark does the reading and the joins, and keeps the window's exceptions with their traces, pointers and
archived verdicts; the driver judges them a chunk of :data:`CHUNK_MESSAGES` at a time with the same
lookups the detector uses, so what it holds does not grow with the window.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from khipu.clock import iso_text
from khipu.detector.decide import Lookups
from khipu.detector.model import DetectorConfig
from khipu.kafka.connection import KafkaConnection
from khipu.kafka.records import record_headers
from khipu.reconcile.window import ReconcileWindow, changes_for, judge_lead, rejudge
from khipu.registry.model import Registry
from khipu.storage.location import Location
from khipu.trace.archive import ARRIVED, hour_of
from khipu.trace.archive import SCHEMA as ARCHIVED_TRACE
from khipu.trace.archive import spark_schema as archive_spark_schema
from khipu.trace.model import Trace, trace_from_columns
from khipu.tracing.headers import trace_context
from khipu.verdicts.archive import COLUMNS as ARCHIVED_COLUMNS
from khipu.verdicts.archive import SCHEMA as ARCHIVED_SCHEMA
from khipu.verdicts.book import StoredVerdicts
from khipu.verdicts.model import VerdictKind
from khipu.verdicts.settle import Change

log = logging.getLogger(__name__)
Position = tuple[str, str, int, int]  # (cluster, topic, partition, offset)


class VerdictBook(Protocol):
    """What reconciliation needs of the stored verdicts (:class:`khipu.verdicts.book.VerdictBook`)."""

    def settled_messages(self, message_ids: Collection[str], archived: Iterable[Mapping[str, Any]] = ()) -> set[str]:
        """Of these, the messages whose every verdict (SQL, or ``archived``: their verdict archive rows) is final
        and without late evidence."""
        ...

    def open_message_pages(self, since_ms: int) -> Iterator[list[str]]:
        """The messages with an SQL verdict decided since ``since_ms`` that is not final or has late evidence, a
        page at a time (a message may be named more than once)."""
        ...

    def stored(self, message_ids: Collection[str], archived: Iterable[Mapping[str, Any]] = ()) -> StoredVerdicts:
        """The verdicts of these messages, SQL rows winning over ``archived`` (their verdict archive rows)."""
        ...

    def apply(
        self, changes: Sequence[Change], at_ms: int, archived: Collection[tuple[str, str]] = ()
    ) -> set[tuple[str, str]]:
        """Store the changes with their history where the rows are still as read (``archived``: the keys whose
        previous verdict is an archived one: no row may exist yet); return the keys that changed meanwhile
        (not applied)."""
        ...


@dataclass(frozen=True, slots=True)
class Lead:
    """A record an emitter says it received whose position no trace of any message names."""

    location: str
    cluster: str
    topic: str
    partition: int
    offset: int
    seen_ms: int  # time of the trace that pointed at it
    message_id: str | None = None  # read from the record's id header, when the log still holds it
    why_unknown: str | None = None
    stream: str | None = None  # from the record's stream header


# What a reconciliation's Spark session is built with (spark/reconcile.py, the bench). The exceptions and their
# evidence are cached; Spark keeps a cached plan's shuffle partitions (200 by default) unless told that adaptive
# execution may coalesce them, and then every job reading the cache ran 200 tasks, whatever the window's size.
# The archive holds a folder per detector batch: listed by a Spark job of its own per read once they pass 32, where
# the driver lists a local or mounted folder in a fraction of the time.
SPARK_SETTINGS = {
    "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "true",
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
}
SHUFFLE_PARTITION_BYTES = 64 << 20  # archive bytes read per shuffle partition


def shuffle_partitions(archive_bytes: int, parallelism: int) -> int:
    """Shuffle partitions for a read of this many archive bytes: one per SHUFFLE_PARTITION_BYTES, at least one a
    core (Spark's fixed 200 cost a small window a task each, and would be too few for days of traffic)."""
    return max(parallelism, -(-archive_bytes // SHUFFLE_PARTITION_BYTES))


LISTED_CHANGES = 1_000  # changes a report names, of each verdict kind (it counts them all; the store holds them)
CHUNK_MESSAGES = 5_000  # messages judged at a time in the driver: all it holds of them, whatever the window's size


@dataclass(frozen=True)
class ReconcileReport:
    window: ReconcileWindow
    dry_run: bool
    traces_read: int = 0
    window_messages: int = 0
    redecided: int = 0
    chunks: int = 0  # the re-decided were judged in this many chunks of at most ``chunk_messages``
    changes: tuple[Change, ...] = ()  # named: every change, up to LISTED_CHANGES of each kind
    leads: tuple[Lead, ...] = ()
    seconds: float = 0.0
    counted: Mapping[str, int] | None = None  # every change by the kind it ended in (None: those of ``changes``)

    @property
    def by_kind(self) -> dict[str, int]:
        """How many changes ended in each verdict."""
        counted = self.counted if self.counted is not None else Counter(c.verdict.kind.value for c in self.changes)
        return dict(sorted(counted.items()))

    @property
    def confirmed_losses(self) -> list[Change]:
        return [c for c in self.changes if c.verdict.kind is VerdictKind.CONFIRMED_LOST]

    @property
    def retracted(self) -> list[Change]:
        return [c for c in self.changes if c.verdict.kind is VerdictKind.RETRACTED]

    def summary(self) -> dict[str, Any]:
        """A JSON-able account: what the Airflow task returns and logs."""
        return {
            "window": self.window.describe(),
            "dry_run": self.dry_run,
            "traces_read": self.traces_read,
            "window_messages": self.window_messages,
            "redecided": self.redecided,
            "chunks": self.chunks,
            "changes": sum(self.by_kind.values()),
            "changes_by_kind": dict(self.by_kind),
            "confirmed_losses": [_change_line(c) for c in self.confirmed_losses],
            "retracted": [_change_line(c) for c in self.retracted],
            "listed_at_most": LISTED_CHANGES,  # of each kind above; changes_by_kind counts them all
            "leads": [_lead_dict(lead) for lead in self.leads],
            "seconds": round(self.seconds, 1),
        }


class _Tally:
    """The run's changes as they are made: every one counted by kind, the first LISTED_CHANGES of each kept."""

    def __init__(self) -> None:
        self.counted: Counter[str] = Counter()
        self.listed: list[Change] = []

    def add(self, changes: Iterable[Change]) -> None:
        for change in changes:
            kind = change.verdict.kind.value
            self.counted[kind] += 1
            if self.counted[kind] <= LISTED_CHANGES:
                self.listed.append(change)


def _change_line(change: Change) -> dict[str, Any]:
    v = change.verdict
    return {"message_id": v.message_id, "stream": v.stream, "hop": v.hop, "verdict": v.kind.value, "why": change.reason}


def _lead_dict(lead: Lead) -> dict[str, Any]:
    return {name: getattr(lead, name) for name in Lead.__dataclass_fields__}


# A lead's message, read from the record at its position: (message id, stream, None) or (None, None, why not).
RecordNamer = Callable[[Lead], tuple[str | None, str | None, str | None]]


def reconcile(
    spark: Any,
    archive_dir: Location | Path,
    window: ReconcileWindow,
    registry: Registry,
    book: VerdictBook,
    lookups: Lookups,
    config: DetectorConfig,
    now_ms: int,
    *,
    dry_run: bool = False,
    name_record: RecordNamer | None = None,
    progress: Callable[[str], None] = log.info,
    verdict_archive_dir: Location | Path | None = None,
    chunk_messages: int = CHUNK_MESSAGES,
    work_dir: Location | Path | None = None,
) -> ReconcileReport:
    """Reconcile the window (see the module's steps); ``verdict_archive_dir``: the verdict archive, whose plain
    DELIVERED verdicts count as the messages' verdicts beside the book's SQL rows (None: there is none);
    ``chunk_messages``: how many of the exceptions the driver holds and judges at a time; ``work_dir``: where the
    run writes what its executors read (a folder or object-store prefix they all reach; default ``reconcile``
    beside the archive), removed when it ends."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    progress(f"reconciling {window.describe()}{' (dry run: nothing is written)' if dry_run else ''}")
    archive_root = Location.of(archive_dir, "archive")
    verdict_root = Location.of(verdict_archive_dir, "verdict archive") if verdict_archive_dir is not None else None
    work = Location.of(work_dir, "reconcile work dir") if work_dir is not None else archive_root.parent / "reconcile"
    hours = window.read_hours(now_ms)
    present = set(archive_root.child_folders("hour="))
    existing = [h for h in hours if f"hour={h}" in present]
    if not existing:
        progress(f"no archived traces in hours {hours[0]} .. {hours[-1]}: nothing to reconcile")
        return ReconcileReport(window, dry_run, seconds=time.monotonic() - started)
    archive_bytes = sum(
        info.size for h in existing for info in (archive_root / f"hour={h}").file_infos(recursive=True)
    )
    partitions = shuffle_partitions(archive_bytes, spark.sparkContext.defaultParallelism)
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    arrived = F.coalesce(*(F.col(name) for name in ARRIVED))  # the broker's time, never an application's
    archive = (  # listed once: each question below is a filter of it (its ``hour`` partition column prunes hours)
        spark.read.schema(archive_spark_schema())
        .option("basePath", archive_root.spark_url)
        .parquet(*[(archive_root / f"hour={h}").spark_url for h in existing])
    )
    if window.streams:
        archive = archive.where(F.col("stream").isin(list(window.streams)))
    traces = archive.where(arrived < max(window.read_to_ms, now_ms))
    # Nothing of the hours read is cached: each question below reads only the columns it needs from Parquet. The
    # window's messages stay in Spark; so do the exceptions (those without an archived verdict, and the open ones)
    # with their traces, pointers and archived verdicts, which come to the driver a chunk at a time to be judged.
    archived = _archived_verdicts(spark, verdict_root, hours)
    # a message first seen in the window has every trace archived in its hour or later (the archive's hour is its
    # traces' arrival), and its verdicts were decided after one of them arrived: the earlier hours are no answer
    since_start = [h for h in existing if h >= hour_of(window.start_ms)]
    archived_since = _archived_verdicts(spark, verdict_root, since_start) if archived is not None else None
    scratch: Location | None = None
    kept: list[Any] = []
    try:
        open_messages = None
        if archived is not None:
            # the open SQL verdicts of the window's messages were decided after its traces began (a verdict keeps the
            # time it was first decided): asked by time, a page at a time, and written to a file Spark reads (in the
            # work folder, which the executors reach as they reach the archive), so the driver never holds them all
            scratch = work / f"run-{uuid.uuid4().hex}"
            open_messages = _open_messages(spark, book, window.start_ms - window.horizon_ms, scratch, progress)
        exceptions = _window_exceptions(archive, arrived, window, archived_since, open_messages).persist()
        kept.append(exceptions)
        totals = exceptions.agg(F.sum("count").alias("messages"), F.count("message_id").alias("exceptions")).first()
        window_count, exception_count = int(totals.messages or 0), int(totals.exceptions)
        traces_read = traces.count()  # rows read (a trace archived twice counts twice here; it is judged once)
        progress(
            f"read {traces_read} traces from {len(existing)} archive hour(s) ({archive_bytes / 2**20:.1f} MiB, "
            f"{partitions} shuffle partitions); {window_count} messages in the window, "
            f"{exception_count} of them without an archived verdict or with an open one"
        )
        evidence = None
        if exception_count:
            their_hours = traces.where(F.col("hour") >= hour_of(window.start_ms))
            chunks = -(-exception_count // chunk_messages)
            evidence = _Evidence.of(traces, their_hours, archived_since, exceptions, chunks)
            kept += evidence.frames
        orphans = _untraced_positions(spark, traces, window)
        leads = _leads(_first_pointers(spark, traces, orphans), orphans, window, name_record)
        if leads:
            progress(f"{len(leads)} lead(s): records received whose position no trace names")
        tally, redecided = _Tally(), 0
        for chunk in range(evidence.chunks if evidence else 0):
            assert evidence is not None
            redecided += _judge_chunk(evidence, chunk, book, registry, lookups, config, window, now_ms, dry_run, tally)
            progress(f"re-decided {redecided} messages of {exception_count} ({chunk + 1} of {evidence.chunks} chunks)")
        tally.add(_judge_untraced(spark, traces, archived, leads, book, registry, now_ms, dry_run))
    finally:
        try:
            for frame in kept:
                frame.unpersist()
        finally:  # whatever became of Spark
            if scratch is not None:
                try:
                    scratch.delete()
                except OSError as exc:
                    log.warning("reconcile's working data %s not removed: %s", scratch.url, exc)
    report = ReconcileReport(
        window,
        dry_run,
        traces_read=traces_read,
        window_messages=window_count,
        redecided=redecided,
        chunks=evidence.chunks if evidence else 0,
        changes=tuple(tally.listed),
        leads=tuple(leads),
        seconds=time.monotonic() - started,
        counted=dict(tally.counted),
    )
    verb = "would change" if dry_run else "changed"
    progress(
        f"{window_count - redecided} already final; {verb} {sum(report.by_kind.values())} verdict(s) of {redecided} "
        f"re-decided messages ({', '.join(f'{k} {n}' for k, n in report.by_kind.items()) or 'none'}) "
        f"in {report.seconds:.1f} s"
    )
    return report


@dataclass(frozen=True)
class _Evidence:
    """What judging the window's exceptions needs, kept in Spark (cached: read from the archive once) and read a
    chunk at a time: each row's ``chunk`` is a hash of its message id."""

    chunks: int
    wanted: Any  # (message_id, open, chunk): the exceptions; ``open``: an SQL verdict of it is open
    traces: Any  # their traces (every column, a trace archived twice once), and ``chunk``
    pointers: Any  # (chunk, location, cluster, topic, partition, offset): back-pointers at their positions
    archived: Any  # their verdict archive rows and ``chunk`` (None: no verdict archive)

    @staticmethod
    def of(traces: Any, their_hours: Any, archived: Any, exceptions: Any, chunks: int) -> _Evidence:
        """``traces``: every hour read (the pointers at the exceptions' positions may be older than they are);
        ``their_hours``: those from the window's start on, which hold every trace of the exceptions; ``archived``:
        the verdict archive from the window's start on, which holds every archived verdict of them."""
        from pyspark.sql import functions as F

        chunk = F.pmod(F.xxhash64("message_id"), F.lit(chunks)).cast("int").alias("chunk")
        wanted = exceptions.where(F.col("message_id").isNotNull()).select("message_id", "open", chunk).persist()
        ids = F.broadcast(wanted.select("message_id", "chunk"))
        # one trace archived twice (a new detector checkpoint reading the topic again) is one trace, not a re-read:
        # a re-read leaves a trace of its own (another emitter sequence number, another time)
        distinct_trace = [name for name in ARCHIVED_TRACE.names if name != "prev_offsets"]
        their_traces = their_hours.join(ids, "message_id").dropDuplicates(distinct_trace).persist()
        positions = their_traces.where(" AND ".join(f"`{name}` IS NOT NULL" for name in POSITION))
        at_positions = F.broadcast(positions.select("chunk", *POSITION).distinct())
        theirs = _pointers(traces).join(at_positions, POSITION).select("chunk", "location", *POSITION)
        their_archived = archived.join(ids, "message_id").persist() if archived is not None else None
        return _Evidence(chunks, wanted, their_traces, theirs.distinct().persist(), their_archived)

    @property
    def frames(self) -> list[Any]:
        return [frame for frame in (self.wanted, self.traces, self.pointers, self.archived) if frame is not None]


def _judge_chunk(
    evidence: _Evidence,
    chunk: int,
    book: VerdictBook,
    registry: Registry,
    lookups: Lookups,
    config: DetectorConfig,
    window: ReconcileWindow,
    now_ms: int,
    dry_run: bool,
    tally: _Tally,
) -> int:
    """Judge one chunk of the exceptions: those of them whose verdicts are not all final already are re-decided by
    the detector's rules with all their traces, and the changes stored (unless a dry run). Returns how many were
    re-decided."""
    from pyspark.sql import functions as F

    mine = F.col("chunk") == chunk
    flagged = {row.message_id: bool(row.open) for row in evidence.wanted.where(mine).collect()}
    # an exception without an open SQL verdict: no archived verdict was found; the store says whether it is final
    settled = book.settled_messages([message for message, is_open in flagged.items() if not is_open])
    candidates = sorted(set(flagged) - settled)
    if not candidates:
        return 0
    by_message: dict[str, list[Trace]] = {}
    for row in evidence.traces.where(mine).drop("chunk").collect():
        by_message.setdefault(row.message_id, []).append(trace_from_columns(row.asDict()))
    pointed = {(r.location, r.cluster, r.topic, r.partition, r.offset) for r in evidence.pointers.where(mine).collect()}
    archived_rows = (
        [row.asDict() for row in evidence.archived.where(mine).drop("chunk").collect()]
        if evidence.archived is not None
        else []
    )
    known = book.stored(candidates, archived_rows)
    archive_pointed = _pointer_lookup(pointed, lookups)
    changes: list[Change] = []
    for message_id in candidates:
        message_traces = by_message.get(message_id, [])
        stream = registry.streams.get(message_traces[0].stream) if message_traces else None
        if stream is None:
            continue
        judged = rejudge(message_id, stream, message_traces, archive_pointed, config, window, now_ms)
        changes.extend(changes_for(known.by_message.get(message_id, {}), judged))
    tally.add(_stored(book, changes, now_ms, known.archived, dry_run))
    return len(candidates)


def _judge_untraced(
    spark: Any,
    traces: Any,
    archived: Any,
    leads: Sequence[Lead],
    book: VerdictBook,
    registry: Registry,
    now_ms: int,
    dry_run: bool,
) -> list[Change]:
    """The messages leads name (of a known stream) none of whose traces arrived, judged from the pointer and the
    record itself."""
    from pyspark.sql import functions as F

    named = sorted({lead.message_id for lead in leads if lead.message_id and lead.stream in registry.streams})
    if not named:
        return []
    traced = {row.message_id for row in traces.where(F.col("message_id").isin(named)).select("message_id").collect()}
    untraced = [lead for lead in leads if lead.message_id in set(named) - traced]
    if not untraced:
        return []
    ids = sorted({lead.message_id for lead in untraced if lead.message_id})
    archived_rows = (
        [row.asDict() for row in archived.where(F.col("message_id").isin(ids)).collect()]
        if archived is not None
        else []
    )
    known = book.stored(ids, archived_rows)
    changes: list[Change] = []
    for lead in untraced:
        assert lead.message_id is not None and lead.stream is not None
        judged = judge_lead(lead, lead.message_id, registry.streams[lead.stream], now_ms)
        changes.extend(changes_for(known.by_message.get(lead.message_id, {}), judged))
    return _stored(book, changes, now_ms, known.archived, dry_run)


def _stored(
    book: VerdictBook, changes: list[Change], now_ms: int, archived: Collection[tuple[str, str]], dry_run: bool
) -> list[Change]:
    """Store the changes (nothing in a dry run); those whose row changed meanwhile are left for the next run."""
    if dry_run or not changes:
        return changes
    conflicts = book.apply(changes, now_ms, archived)
    if conflicts:  # the detector wrote them meanwhile: they stay flagged for the next run
        log.info("%d verdict(s) changed while this run judged them: left for the next run", len(conflicts))
    return [c for c in changes if (c.verdict.message_id, c.verdict.hop) not in conflicts]


def _archived_verdicts(spark: Any, verdict_archive: Location | None, hours: Sequence[str]) -> Any:
    """The verdict archive's rows in these hours (a DataFrame of its columns), or None when it has none."""
    if verdict_archive is None:
        return None
    present = set(verdict_archive.child_folders("hour="))
    folders = [
        folder
        for folder in (verdict_archive / f"hour={h}" for h in hours if f"hour={h}" in present)
        if any(path.endswith(".parquet") for path in folder.files(recursive=True))
    ]  # an hour whose batches were all replayed into another hour holds no file
    if not folders:
        return None
    spark_types = {"string": "string", "int32": "int", "int64": "bigint", "bool": "boolean"}
    schema = ", ".join(f"`{field.name}` {spark_types[str(field.type)]}" for field in ARCHIVED_SCHEMA)
    frame = spark.read.schema(schema).option("basePath", verdict_archive.spark_url)
    return frame.parquet(*[folder.spark_url for folder in folders]).select(*ARCHIVED_COLUMNS)


def _open_messages(
    spark: Any, book: VerdictBook, since_ms: int, folder: Location, progress: Callable[[str], None]
) -> Any | None:
    """The messages with an SQL verdict decided since ``since_ms`` that is open (``VerdictBook.open_message_pages``)
    as a Spark frame of ``message_id`` (a message once per open row); None when there are none. The store's pages
    are written one at a time to a Parquet file in ``folder``, which Spark reads: the driver holds one page."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path, schema, rows = folder / "open-messages.parquet", pa.schema([("message_id", pa.string())]), 0
    if folder.is_local:
        folder.local_path.mkdir(parents=True, exist_ok=True)
        folder.local_path.chmod(0o755)  # the umask's 0700 would keep executors running as another user out
    with path.filesystem().open_output_stream(path.path) as stream, pq.ParquetWriter(stream, schema) as writer:
        for page in book.open_message_pages(since_ms):
            writer.write_table(pa.table({"message_id": page}, schema=schema))
            rows += len(page)
    if folder.is_local:
        path.local_path.chmod(0o644)
    progress(f"{rows} open SQL verdict row(s) decided since {iso_text(since_ms)}, written for Spark to read")
    return spark.read.parquet(path.spark_url) if rows else None


def _window_exceptions(
    archive: Any, arrived: Any, window: ReconcileWindow, archived: Any, open_messages: Any | None
) -> Any:
    """The window's messages as (message_id, open, count) rows: one per exception (a message without an archived
    verdict, ``open`` null; or with an open SQL verdict, ``open`` true; ``count`` 1) and the others counted in rows
    of a null message id. One aggregation by message id of its first arrival (from the hours up to the window's end:
    a trace arriving after it cannot be first), of whether the verdict archive holds a verdict of it, and of whether
    ``open_messages`` (:func:`_open_messages`) names it: one exchange, neither a join nor a broadcast, however many
    are open."""
    from pyspark.sql import functions as F

    none_ms, unknown = F.lit(None).cast("bigint"), F.lit(None).cast("boolean")
    columns = ("message_id", "first_ms", "archived", "open")
    first = (
        archive.where((F.col("hour") <= hour_of(window.end_ms - 1)) & (arrived < window.end_ms))
        .select("message_id", arrived, F.lit(False), unknown)
        .toDF(*columns)
    )
    if archived is not None:
        first = first.unionByName(archived.select("message_id", none_ms, F.lit(True), unknown).toDF(*columns))
    if open_messages is not None:  # ``archived`` unknown there: max() passes over it
        first = first.unionByName(open_messages.select("message_id", none_ms, unknown, F.lit(True)).toDF(*columns))
    messages = (
        first.groupBy("message_id")
        .agg(F.min("first_ms").alias("first_ms"), F.max("archived").alias("archived"), F.max("open").alias("open"))
        .where(F.col("first_ms") >= window.start_ms)  # a message only the verdict archive names has none: not here
    )
    exception = ~F.col("archived") | F.col("open").isNotNull()
    return messages.groupBy(
        F.when(exception, F.col("message_id")).alias("message_id"), F.when(exception, F.col("open")).alias("open")
    ).agg(F.count(F.lit(1)).alias("count"))


def _pointers(traces: Any) -> Any:
    """(location, cluster, topic, partition, offset, seen_ms): each back-pointer of an emitter's RECEIVED traces, a
    position it says it received (one row per pointer: not aggregated)."""
    from pyspark.sql import functions as F

    return traces.where("type = 'RECEIVED' AND prev_offsets IS NOT NULL").select(
        "location",
        "cluster",
        "topic",
        "partition",
        F.explode("prev_offsets").alias("offset"),
        F.col("timestamp_ms").alias("seen_ms"),
    )


POSITION = ["cluster", "topic", "partition", "offset"]
POSITION_SCHEMA = "cluster string, topic string, partition int, offset bigint"


def _untraced_positions(spark: Any, traces: Any, window: ReconcileWindow) -> set[Position]:
    """The positions a pointer made within the window names where no trace of any message lies: one aggregation by
    position of the window's pointers and the traces' positions. Only positions within the offsets the window's
    pointers span on each partition can match: the traces elsewhere (most of the hours read) are left out before the
    aggregation (a broadcast join with each partition's span), and a position is mostly pointed at and traced in the
    same files, so the partial aggregation sends on about one row per position."""
    from pyspark.sql import functions as F

    partition = ["cluster", "topic", "partition"]
    made = F.col("seen_ms")
    pointers = _pointers(traces).where((made >= window.start_ms) & (made < window.end_ms))
    spans = pointers.groupBy(*partition).agg(F.min("offset").alias("low"), F.max("offset").alias("high")).collect()
    spans = [span for span in spans if None not in span]  # a pointer partly unknown names no position
    if not spans:
        return set()
    spanned = spark.createDataFrame(spans, "cluster string, topic string, partition int, low bigint, high bigint")
    low, high = min(span.low for span in spans), max(span.high for span in spans)
    traced = (
        traces.where(F.col("offset").between(low, high))  # pushed down: Parquet skips row groups outside every span
        .select(*POSITION)
        .join(F.broadcast(spanned), partition)  # a null never matches: a position partly unknown is none
        .where(F.col("offset").between(F.col("low"), F.col("high")))
        .select(*POSITION, F.lit(False).alias("pointed"), F.lit(True).alias("traced"))
    )
    pointed = pointers.select(*POSITION, F.lit(True).alias("pointed"), F.lit(False).alias("traced"))
    untraced = (
        pointed.unionByName(traced)
        .groupBy(*POSITION)
        .agg(F.max("pointed").alias("pointed"), F.max("traced").alias("traced"))
        .where(F.col("pointed") & ~F.col("traced"))
    )
    return {(r.cluster, r.topic, r.partition, r.offset) for r in untraced.collect() if r.offset is not None}


PointerKey = tuple[str, str, str, int, int]  # (location, cluster, topic, partition, offset)


def _first_pointers(spark: Any, traces: Any, positions: Collection[Position]) -> dict[PointerKey, int]:
    """Of the emitters' back-pointers at these (few) positions, when each location first pointed at each."""
    from pyspark.sql import functions as F

    if not positions:
        return {}
    wanted = spark.createDataFrame(sorted(positions), POSITION_SCHEMA)
    found = (
        _pointers(traces)
        .join(F.broadcast(wanted), POSITION, "left_semi")
        .groupBy("location", *POSITION)
        .agg(F.min("seen_ms").alias("seen_ms"))
    )
    return {(r.location, r.cluster, r.topic, r.partition, r.offset): int(r.seen_ms) for r in found.collect()}


def _leads(
    first_pointed: Mapping[PointerKey, int],
    untraced: Collection[Position],
    window: ReconcileWindow,
    name_record: RecordNamer | None,
) -> list[Lead]:
    """Pointers first made within the window at positions where no trace of any message lies, each named from
    Kafka when possible (each window reports its own)."""
    found = [
        (key, seen_ms)
        for key, seen_ms in first_pointed.items()
        if key[1:] in untraced and window.start_ms <= seen_ms < window.end_ms
    ]
    leads = []
    for key, seen_ms in sorted(found, key=lambda item: (item[0][1:], item[0][0])):
        location, cluster, topic, partition, offset = key
        lead = Lead(location, cluster, topic, partition, offset, seen_ms)
        named = name_record(lead) if name_record else (None, None, "no Kafka connection to read the record with")
        leads.append(dataclasses.replace(lead, message_id=named[0], stream=named[1], why_unknown=named[2]))
    return leads


def _pointer_lookup(pointed: Collection[PointerKey], lookups: Lookups) -> Lookups:
    """The archive's back-pointers first, then whatever the detector's lookup knows (emitter marks)."""

    def pointed_at(location: str, cluster: str, topic: str, partition: int, offset: int) -> bool:
        if (location, cluster, topic, partition, offset) in pointed:
            return True
        return lookups.pointed_at(location, cluster, topic, partition, offset)

    return dataclasses.replace(lookups, pointed_at=pointed_at)


def kafka_record_namer(connections: Mapping[str, KafkaConnection]) -> RecordNamer:
    """Name a lead's message from the trace header (``khipu``) of the record at its position."""

    def name(lead: Lead) -> tuple[str | None, str | None, str | None]:
        connection = connections.get(lead.cluster)
        if connection is None:
            return None, None, f"no connection to cluster {lead.cluster!r}"
        headers, why = record_headers(connection, lead.topic, lead.partition, lead.offset)
        if headers is None:
            return None, None, why
        context = trace_context(list(headers.items()))
        if context is None:
            return None, None, "the record there carries no trace header"
        return context.message_id, context.stream, None

    return name
