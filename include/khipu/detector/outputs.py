"""Where the detector's results go, written per micro-batch (``foreachBatch``), each idempotently.

- verdicts: settled against what is stored (:mod:`khipu.verdicts.settle`: late evidence never makes a
  verdict worse) and upserted by (message id, hop), so a batch replayed after a restart never stores
  a verdict twice, with the verdict's history; LOST verdicts are also produced to the lost-messages topic
  (at-least-once: a replay may repeat one there; consumers key on message id + hop);
- metrics per stream / hop / minute: recomputed from the stored verdicts of the minutes touched
  (:mod:`khipu.verdicts.metrics`);
- the raw-trace archive: Parquet partitioned by hour and batch, overwritten on replay;
- malformed records: the store's quarantine, once per trace-topic position (topic, partition, offset and line:
  each line of a batch record is quarantined on its own);
- back-pointers: records an emitter says it received whose trace was not in the batch (what
  tells TRACE_LOST from LOST), kept long enough for every message they concern to be decided;
- emitter sequence numbers: their gaps count the traces each emitter lost (channel health;
  :mod:`khipu.detector.gaps`);
- the heartbeat: every query's progress, into the store.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Producer
from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame
from pyspark.sql.streaming.listener import StreamingQueryListener
from sqlalchemy import event
from sqlalchemy.exc import SQLAlchemyError

from khipu.detector import records
from khipu.detector.bucket import AHEAD, VERDICT_FIELDS
from khipu.detector.clock import read_to_ms, running_read_to_ms, source_offsets
from khipu.detector.committed import STORE_UNAVAILABLE
from khipu.detector.gaps import record_emitter_sequences
from khipu.detector.jvm_errors import JvmCallFailed, compact_jvm_error, interrupted
from khipu.detector.outage import WaitingReporter, write_with_retries
from khipu.detector.packed import JUDGED, PACKED_FIELDS, RECORD_FIELDS, RECORDS, unanswered_asks, unpack
from khipu.detector.parse import quarantine_reason
from khipu.detector.records import TRACE
from khipu.detector.trail import first_read_offsets, partition_trails, skipped_offsets, with_oldest_unread
from khipu.kafka import KafkaAdmin, KafkaConnection, KafkaUnavailable
from khipu.storage.location import Location
from khipu.store import Store
from khipu.store.heartbeat import PartitionTrail
from khipu.trace import archive
from khipu.trace.archive import HOUR_MS, hour_of
from khipu.verdicts.archive import COLUMNS as ARCHIVE_COLUMNS
from khipu.verdicts.archive import VerdictArchive, conform, verdict_table
from khipu.verdicts.book import Recorded, VerdictBook, verdict_of, verdict_row
from khipu.verdicts.metrics import counts_by_minute_columns, metrics_of
from khipu.verdicts.model import VerdictKind
from khipu.verdicts.settle import Change

log = logging.getLogger(__name__)
PRUNE_EVERY_MS = 60_000
KEPT_BATCHES = 10  # a batch's figures wait this many batches for its progress event


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class BatchFigures:
    """What the writer learns of each batch that the heartbeat reports (shared in the driver): messages in flight
    and state bytes per bucket, as the processor last reported them, and the newest record time read from each
    trace-topic partition (:mod:`khipu.detector.clock`)."""

    def __init__(self) -> None:
        self._buckets: dict[int, tuple[int, int]] = {}
        self.newest_read_ms: dict[int, int] = {}
        self.read_to_ms: int | None = None  # the writer's newest figure of how far the topic is read
        # By batch id, until the batch's progress event takes them (it may come after the next batch's writer started;
        # the writer and the listener are two threads): the lines (traces, marks and malformed lines) the batch's
        # trace records held (a record holds a batch of traces, so Spark's numInputRows counts records, not what the
        # detector read), and the batch's serial part (none: the writer did not finish it).
        self._taken_lock = threading.Lock()
        self.lines: dict[int, int] = {}
        self.serial: dict[int, SerialTime] = {}
        self.last_progress_ms = _now_ms()  # the query's newest sign of progress (a batch, an idle trigger, its start)

    def batch_done(self, batch_id: int, *, lines: int | None = None, serial: SerialTime | None = None) -> None:
        """What the writer learnt of ``batch_id`` (its lines, then its serial part), for that batch's heartbeat; a
        batch's figures not taken within KEPT_BATCHES batches (its progress event never came) are dropped."""
        with self._taken_lock:
            if lines is not None:
                self.lines[batch_id] = lines
            if serial is not None:
                self.serial[batch_id] = serial
            for kept in (self.lines, self.serial):
                for old in [b for b in kept if b <= batch_id - KEPT_BATCHES]:
                    del kept[old]

    def take(self, batch_id: int) -> tuple[int | None, SerialTime | None]:
        """The writer's lines and serial part of ``batch_id`` (None: it did not see or finish it), once."""
        with self._taken_lock:
            return self.lines.pop(batch_id, None), self.serial.pop(batch_id, None)

    def report(self, bucket: int, messages: int, state_bytes: int) -> None:
        self._buckets[bucket] = (messages, state_bytes)

    def read(self, partition: int, newest_ms: int) -> None:
        self.newest_read_ms[partition] = max(newest_ms, self.newest_read_ms.get(partition, newest_ms))

    @property
    def messages(self) -> int:
        return sum(m for m, _ in self._buckets.values())

    @property
    def state_bytes(self) -> int:
        return sum(b for _, b in self._buckets.values())


@dataclass(frozen=True, slots=True)
class SerialTime:
    """Where a batch's writer (foreachBatch, on the driver) spent its time: ``collect_ms``, the wall time of the
    batch's one Spark job, from its start to its results decoded on the driver (the executors work); ``driver_ms``,
    the writer's wall time besides it (no task of the query runs: the executors wait for the driver); ``driver_cpu_ms``,
    the writer thread's CPU in the whole call (the results' Arrow decoding included; the JVM's own driver threads
    are not in it)."""

    collect_ms: int
    driver_ms: int
    driver_cpu_ms: int

    @classmethod
    def measured(cls, started_s: float, collect_s: float, ended_s: float, cpu_s: float) -> SerialTime:
        """From perf_counter readings (the call's start, the collect's wall time, its end) and thread CPU seconds."""
        return cls(round(collect_s * 1000), round((ended_s - started_s - collect_s) * 1000), round(cpu_s * 1000))

    def as_columns(self) -> dict[str, int]:
        return {"collect_ms": self.collect_ms, "driver_ms": self.driver_ms, "driver_cpu_ms": self.driver_cpu_ms}


class ReadProgress:
    """After each batch, how far the trace topic is read (:func:`khipu.detector.clock.read_to_ms`), recorded in
    the store before the next batch runs: that batch decides with it. A partition is read to its end when its
    latest offset, asked now, is where this batch ended (its offsets from the query's offset log); otherwise to
    the newest record time read from it. Beside it, how far the detector trails the topic and what the batch skipped
    (:mod:`khipu.detector.trail`), from the same ask of the broker."""

    def __init__(
        self,
        checkpoint: Location | Path,
        query: str,
        topic: str,
        connection: KafkaConnection,
        max_offsets_per_trigger: int | None = None,
    ) -> None:
        self.checkpoint, self.query, self.topic, self.connection = checkpoint, query, topic, connection
        self.max_offsets_per_trigger = max_offsets_per_trigger
        self._admin: KafkaAdmin | None = None
        self._ended: tuple[int, int] | None = None  # (batch id, when its writer returned), in this process
        self._trails: list[PartitionTrail] = []  # the trail last recorded (its oldest unread records' times reused)
        self._recorded_batch: int | None = None  # the newest batch whose trail is recorded (None: not read yet)

    def ended(self, batch_id: int) -> None:
        """The writer of ``batch_id`` returns now: Spark plans the next batch after this."""
        self._ended = (batch_id, _now_ms())

    def run_ahead(self, batch_id: int, store: Store) -> int | None:
        """Before the batch's Spark job: how far the trace topic will be read when it ends
        (:func:`khipu.detector.clock.running_read_to_ms`), recorded for its processor; None when not known, or
        not recorded (the store did not answer: the batch decides on what the last one read, as it would have)."""
        previous = self._ended[1] if self._ended is not None and self._ended[0] == batch_id - 1 else None
        if previous is None:
            return None
        ends = self._batch_ends(batch_id)
        running = running_read_to_ms(previous, self._batch_ends(batch_id - 1), ends or {}, self.max_offsets_per_trigger)
        if running is None:
            return None
        try:
            store.heartbeat.record_running_read_to(self.query, running)
        except (*STORE_UNAVAILABLE, SQLAlchemyError) as exc:  # a store not migrated to 0013 too: never fail a batch
            log.warning("batch %d: how far it will read not recorded (%s): it decides on what the last one read",
                        batch_id, exc)  # fmt: skip
            return None
        return running

    def advance(
        self,
        batch_id: int,
        newest_read_ms: Mapping[int, int],
        store: Store,
        first_read: Mapping[int, int] | None = None,
    ) -> int | None:
        """After batch ``batch_id``: how far the trace topic is read, recorded; and how far the detector trails it, with
        what the batch skipped (``first_read``: the lowest offset it read per partition,
        :func:`khipu.detector.trail.first_read_offsets`; None: not judged), recorded beside
        (:meth:`_record_trail`)."""
        ends = self._batch_ends(batch_id)
        if not ends:
            return None
        asked = _now_ms()
        if self._admin is None:
            self._admin = KafkaAdmin(self.connection, timeout_s=10)
        try:
            marks = self._admin.watermarks([(self.topic, partition) for partition in ends]).found
        except KafkaUnavailable as exc:
            log.warning("latest offsets of %s unknown (%s): how far it is read stays where it was", self.topic, exc)
            return None
        latest = {partition: end for (_, partition), (_, end) in marks.items()}
        read_to = read_to_ms(asked, ends, latest, newest_read_ms)
        if read_to is not None:
            store.heartbeat.record_read_to(self.query, read_to, asked)
        bounds = {partition: bound for (_, partition), bound in marks.items()}
        try:
            self._record_trail(batch_id, ends, bounds, asked, first_read, store)
        except (*STORE_UNAVAILABLE, SQLAlchemyError) as exc:  # a store not migrated to 0016 too: never fail a batch
            log.warning("batch %d: how far the detector trails %s not recorded (%s)", batch_id, self.topic, exc)
        return read_to

    def _record_trail(
        self,
        batch_id: int,
        ends: Mapping[int, int],
        bounds: Mapping[int, tuple[int, int]],
        asked_ms: int,
        first_read: Mapping[int, int] | None,
        store: Store,
    ) -> None:
        """How far the detector trails each partition after ``batch_id`` (:mod:`khipu.detector.trail`: where it ended,
        the log's bounds, the oldest record not read yet and its time), and the offsets the batch skipped, logged as
        an error and recorded for the trail alert. A batch that recorded its trail before, run again after a restart,
        judges no skip: it read those offsets the first time."""
        assert self._admin is not None  # advance made it
        if self._recorded_batch is None:  # after a start: the newest batch a run of this checkpoint recorded
            self._trails = store.heartbeat.trail(self.query)
            self._recorded_batch = max((trail.batch_id for trail in self._trails), default=-1)
        replayed = batch_id <= self._recorded_batch
        trails = with_oldest_unread(
            self._admin, self.topic, partition_trails(batch_id, ends, bounds, asked_ms), self._trails
        )
        starts = self._batch_ends(batch_id - 1) if batch_id > 0 and first_read is not None and not replayed else None
        skips = []
        if starts is not None and first_read is not None:
            log_starts = {partition: start for partition, (start, _) in bounds.items()}
            skips = skipped_offsets(batch_id, starts, ends, first_read, log_starts, asked_ms)
        store.heartbeat.record_trail(self.query, trails)
        if skips:
            store.heartbeat.record_skips(self.query, skips)
            log.error(
                "batch %d skipped %d offsets of %s the broker removed before it read them (%s): the messages they "
                "traced are never judged",
                batch_id,
                sum(skip.offsets for skip in skips),
                self.topic,
                ", ".join(f"partition {s.partition} offsets {s.from_offset}..{s.to_offset - 1}" for s in skips),
            )
        self._trails, self._recorded_batch = trails, max(batch_id, self._recorded_batch)

    def _batch_ends(self, batch_id: int) -> dict[int, int] | None:
        """Where the batch ended on each partition, from the query's offset log (its last line: the source's)."""
        path = Location.of(self.checkpoint, "checkpoint") / "offsets" / str(batch_id)
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            log.warning("batch %d: the query's offset log %s unreadable (%s): how far the trace topic is read stays "
                        "where it was, and verdicts wait", batch_id, path.url, exc)  # fmt: skip
            return None
        return source_offsets(lines[-1], self.topic) if lines else None


@dataclass(frozen=True, slots=True)
class BatchKeys:
    """Micro-batch ids made unique across checkpoints: a new checkpoint starts again at batch 0, and its outputs
    (archive folders, the decided index, metric parts) must not replace an earlier checkpoint's. A batch's key
    is ``epoch_s * SPAN + first_batch + batch_id``, ``epoch_s`` the second its checkpoint was first started.

    A checkpoint a rescale wrote (:mod:`khipu.detector.rescale`) continues the one it rescaled: the same
    ``epoch_s``, and ``first_batch`` the key after that one's last committed batch, so its batch 0 replaces what an
    unfinished batch of the other wrote, as Spark's own replay of that batch would."""

    epoch_s: int = 0
    first_batch: int = 0

    SPAN: ClassVar[int] = 10**8  # batch ids per checkpoint: six years of 2-second batches

    def key(self, batch_id: int) -> int:
        if batch_id < 0 or not self.first_batch + batch_id < self.SPAN:
            raise ValueError(
                f"micro-batch id {batch_id} out of 0..{self.SPAN - 1 - self.first_batch}: start a new checkpoint"
            )
        return self.epoch_s * self.SPAN + self.first_batch + batch_id


class DetectorWriter:
    """foreachBatch of the detector's query: what the processor let through and decided, to where it goes."""

    def __init__(
        self,
        store_url: str,
        archive_path: str,
        verdict_archive_path: str,
        lost_topic: str | None,
        connection: KafkaConnection,
        keep_pointers_ms: int,
        known_streams: tuple[str, ...],
        batch_keys: BatchKeys | None = None,
        hops: Mapping[str, list[Any]] | None = None,
        figures: BatchFigures | None = None,
        progress: ReadProgress | None = None,
        reporter: WaitingReporter | None = None,
        grace_ms: int = 0,
        feeders: Mapping[tuple[str, str], tuple[str, ...]] | None = None,
    ) -> None:
        self.store_url, self.archive_path, self.keep_pointers_ms = store_url, archive_path, keep_pointers_ms
        self.feeders = feeders or {}  # RoutePlans.feeders: each processor write hop's input read hops
        self.verdict_archive_path = verdict_archive_path
        self.lost_topic, self.connection, self.known_streams = lost_topic, connection, known_streams
        self.batch_keys = batch_keys or BatchKeys()  # the checkpoint's batches, as its outputs name them
        self.hops = hops or {}  # RoutePlans.described: what each hop number in a verdict row stands for
        self.figures = figures if figures is not None else BatchFigures()
        self.progress = progress  # how far the topic is read, recorded after each batch (None: not recorded)
        self.reporter = reporter  # where a batch whose outputs wait for the store or a cluster says so
        self._store: Store | None = None
        self._verdict_archive: VerdictArchive | None = None
        self._producer: Producer | None = None
        self._pruned_ms = 0
        self.grace_ms = grace_ms  # a sequence gap is settled once the topic is read this long past it
        self._open_emitters: set[str] | None = None  # with sequence gaps not settled yet (None: ask the store)
        self.statements = 0  # SQL statements sent by the writer's store since it started

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store(self.store_url)
            event.listen(self._store.engine.sql, "before_cursor_execute", self._count_statement)
        return self._store

    def _count_statement(self, *_: Any) -> None:
        """Every SQL statement the writer's store sends (an executemany once): a batch's are logged with it."""
        self.statements += 1

    @property
    def verdict_archive(self) -> VerdictArchive:
        if self._verdict_archive is None:
            where = Location.of(self.verdict_archive_path, "verdict archive")
            self._verdict_archive = VerdictArchive(where, self.store)
        return self._verdict_archive

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        spent: dict[str, float] = {}
        clock = started = time.perf_counter()
        cpu = time.thread_time()

        def lap(step: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            spent[step] = now - clock
            clock = now

        if self.progress is not None:  # before the job: its processor may decide on it
            self.progress.run_ahead(batch_id, self.store)
        # one Spark job per batch: the one collected table feeds every output, so nothing is cached
        collect_started = time.perf_counter()
        try:
            collected = batch.select(*PACKED_FIELDS.names).toArrow()
        except Py4JJavaError as exc:  # told short: Spark's check of a stop cannot read the whole Java stack
            text = str(exc)
            if interrupted(text):
                log.info("batch %d interrupted (the query is stopping)", batch_id)
            else:
                log.error("batch %d: the JVM failed: %s", batch_id, text)
            raise JvmCallFailed(compact_jvm_error(text)) from None
        collect_s = time.perf_counter() - collect_started
        lap("judge")
        judged = collected.filter(pc.equal(collected.column("kind"), JUDGED))
        unanswered = unanswered_asks(judged.column("unanswered").to_pylist())
        if unanswered:  # the executors' lookups log each failure where they run: this says it where one looks
            log.warning("batch %d: %d lookups got no answer (%s); what they decide waits, asked again after a back-off",
                        batch_id, sum(unanswered.values()),
                        ", ".join(f"{name if name.startswith('(') else f'cluster {name}'}: {count}"
                                  for name, count in unanswered.items()))  # fmt: skip
        # every output is keyed by the batch: while the store or the lost topic does not take them, written again
        write_with_retries(lambda: self._write(collected, batch_id, spent, lap), f"batch {batch_id}", self.reporter)
        serial = SerialTime.measured(started, collect_s, time.perf_counter(), time.thread_time() - cpu)
        self.figures.batch_done(batch_id, serial=serial)
        if self.progress is not None:
            self.progress.ended(batch_id)

    def _write(self, collected: pa.Table, batch_id: int, spent: dict[str, float], lap: Any) -> None:
        statements = self.statements
        kinds = collected.column("kind")
        passed = unpack(collected.filter(pc.equal(kinds, RECORDS)).column("blob"), RECORD_FIELDS)
        judged = collected.filter(pc.equal(kinds, JUDGED))
        traces = int(pc.sum(pc.equal(passed.column("kind"), TRACE)).as_py() or 0)
        self.figures.batch_done(batch_id, lines=passed.num_rows)
        key = self.batch_keys.key(batch_id)
        self._archive_traces(passed, key)
        lap("archive")
        for partition, newest in records.newest_read(passed).items():
            self.figures.read(partition, newest)
        pointed = records.pointers(passed)
        found = self._channel(passed, pointed, batch_id)
        lap("channel")
        for row in judged.select(["bucket", "in_flight", "state_bytes"]).to_pylist():
            self.figures.report(int(row["bucket"]), int(row["in_flight"]), int(row["state_bytes"]))
        decided = unpack(judged.column("blob"), VERDICT_FIELDS)
        held = held_back(decided, pointed, self.hops)
        if held.any():
            log.info("batch %d: %d LOST held back: a record of this batch points at theirs (decided again in the next "
                     "batch, on its stored pointers)", batch_id, int(held.sum()))  # fmt: skip
            decided = decided.filter(pa.array(~held))
        verdicts = expand_verdicts(decided, self.hops)
        archived, stored, lost = self._verdicts(verdicts, key)
        lap("verdicts")
        if self.progress is not None:  # after the pointers are stored: the next batch may decide on them
            read_to = self.progress.advance(
                batch_id, self.figures.newest_read_ms, self.store, first_read_offsets(passed)
            )
            if read_to is not None:
                self.figures.read_to_ms = read_to
        numbered = self._sequences(passed, batch_id)
        lap("sequences")
        log.info(
            "batch %d: %d traces, %d verdicts (%d LOST), %d archived, %d stored; %d pointers, %d sequence "
            "numbers; %d messages in flight; %d SQL statements; %s",
            batch_id,
            traces,
            verdicts.num_rows,
            lost,
            archived,
            stored,
            found,
            numbered,
            self.figures.messages,
            self.statements - statements,
            ", ".join(f"{step} {seconds * 1000:.0f} ms" for step, seconds in spent.items()),
        )

    def _archive_traces(self, passed: pa.Table, key: int) -> None:
        """The batch's traces to the raw-trace archive: Parquet by hour and batch (a replay replaces its own)."""
        traces = passed.filter(pc.equal(passed.column("kind"), TRACE))
        back = traces.column("prev_offsets")
        pointers = pc.if_else(
            pc.is_valid(back),
            pc.split_pattern(pc.fill_null(back, ""), ","),
            pa.nulls(traces.num_rows, pa.list_(pa.string())),
        )
        table = traces.set_column(traces.schema.get_field_index("prev_offsets"), "prev_offsets", pointers)
        archive.write_batch(Location.of(self.archive_path, "archive"), key, table.select(archive.SCHEMA.names))

    def _channel(self, passed: pa.Table, found: list[tuple[str, str, str, int, int]], batch_id: int) -> int:
        """Back-pointers (``found``: :func:`khipu.detector.records.pointers` of the batch) and malformed records:
        the trace channel's own health (sequence numbers: after the batch has moved how far the topic is read,
        :meth:`_sequences`)."""
        now = _now_ms()
        self.store.channel.record_pointers(found, now)
        if now - self._pruned_ms >= PRUNE_EVERY_MS:
            self.store.channel.prune_pointers(now - self.keep_pointers_ms)
            # decisions older than this are not looked for again: a trace that late is judged as a new message's
            self.verdict_archive.index.prune(now - self.keep_pointers_ms)
            self._pruned_ms = now
        bad = [
            {**row, "quarantine_reason": quarantine_reason(row["raw_value"], self.known_streams)}
            for row in records.malformed(passed)
        ]
        if bad:
            added = self.store.channel.add_quarantine(bad, _now_ms())
            log.warning("batch %d: %d malformed trace records quarantined (%d new)", batch_id, len(bad), added)
        return len(found)

    def _sequences(self, passed: pa.Table, batch_id: int) -> int:
        """Emitter sequence numbers: a gap is stored and counted as lost traces once it is settled, the trace
        topic read ``grace_ms`` past the number after it (:mod:`khipu.detector.gaps`); emitters with gaps still
        open are looked at again after the next batch. Returns how many numbers the batch held."""
        numbered = records.sequence_numbers(passed)
        if self._open_emitters is None:  # after a start: whatever a previous run left open
            self._open_emitters = set(self.store.channel.emitters_with_runs())
        read_to = self.figures.read_to_ms
        recorded = record_emitter_sequences(
            self.store.channel,
            numbered,
            _now_ms(),
            settled_ms=None if read_to is None else read_to - self.grace_ms,
            revisit=sorted(self._open_emitters),
        )
        self._open_emitters = set(recorded.still_open)
        if recorded.new_gaps:
            log.warning("batch %d: %d new gaps in emitter sequences (lost traces)", batch_id, recorded.new_gaps)
        return sum(len(batch.seen) for batch in numbered.values())

    def _verdicts(self, verdicts: pa.Table, key: int) -> tuple[int, int, int]:
        """The batch's verdicts to where they go: a fresh message's plain DELIVERED verdicts to the verdict
        archive (with their minutes' counts as the batch's metric part), every other verdict settled against
        what is stored (late evidence never makes one worse) into the SQL store; LOST ones to the lost topic.
        Idempotent: a replayed batch replaces its archive files, index rows and metric part, and settles
        against the rows its first run stored. Returns (archived, stored in SQL, LOST published)."""
        archive, index = self.verdict_archive, self.verdict_archive.index
        index.forget_batch(key)  # a replay's own rows are not earlier decisions
        ids = pc.unique(verdicts.column("message_id")).to_pylist()
        earlier = index.find(ids) if ids else {}
        message_ids = verdicts.column("message_id").to_pylist()  # a row's message, as Python text: made once
        first_seen = dict(zip(message_ids, verdicts.column("first_seen_ms").to_pylist(), strict=True))
        again = {m for m, found in earlier.items() if any(d.first_seen_ms != first_seen.get(m) for d in found)}
        # a hop its state reports again, now a DUPLICATE (decide.to_report): its DELIVERED may be in the archive
        copies = verdicts.filter(pc.equal(verdicts.column("verdict"), "DUPLICATE")).column("message_id")
        again |= set(copies.to_pylist()) & set(earlier)
        stale = self._older_than_the_index(verdicts, set(earlier))
        look_in = {m: {h for d in earlier[m] for h in (d.hour, _next_hour(d.hour))} for m in again}
        look_in.update(stale)
        again |= set(stale)
        fresh_clean = pc.and_(
            pc.equal(verdicts.column("judged_by"), "clean"),
            pc.invert(pc.is_in(verdicts.column("message_id"), pa.array(sorted(again), pa.string()))),
        )
        direct = _archive_rows(verdicts.filter(fresh_clean))
        judged = [verdict_of(row) for row in verdicts.filter(pc.invert(fresh_clean)).to_pylist()]
        recorded = Recorded([], {})
        if judged:
            before = {
                (str(row["message_id"]), str(row["hop"])): verdict_of(row)
                for row in archive.read_messages(again, hours={h for m in again for h in look_in[m]})
            } if again else {}  # fmt: skip
            recorded = VerdictBook(self.store.verdicts).record(
                judged, _now_ms(), archived=before, apart=_plain_new, feeders=self.feeders
            )
        apart = verdict_table([verdict_row(v) for v in recorded.apart])
        archived = pa.concat_tables([direct, apart]) if apart.num_rows else direct
        archive.write_batch(key, archived)
        counts = counts_by_minute_columns(
            archived.column("stream"), archived.column("hop"), archived.column("verdict"),
            archived.column("decided_ms"), archived.column("latency_ms"),
        )  # fmt: skip
        self.store.verdicts.replace_part(f"detector:{key}", counts, metrics_of)
        # the hour each message was decided in (its last row's): named once per hour, not once per verdict
        decided_hour = pc.divide(verdicts.column("decided_ms"), HOUR_MS)  # whole hours since 1970 (it is now: > 0)
        names = {number: hour_of(number * HOUR_MS) for number in pc.unique(decided_hour).to_pylist()}
        hours = dict(zip(message_ids, decided_hour.to_pylist(), strict=True))
        index.record(key, [(m, first_seen.get(m), names[hours[m]]) for m in ids])
        # a LOST this state said and the store keeps goes out, again on a replayed batch (at least once)
        lost = [
            verdict_row(stored)
            for verdict in judged
            if verdict.kind is VerdictKind.LOST
            and (stored := recorded.current.get((verdict.message_id, verdict.hop))) is not None
            and stored.kind is VerdictKind.LOST
            and stored.first_seen_ms == verdict.first_seen_ms
        ]
        if lost and self.lost_topic:
            self._publish_lost(self.lost_topic, lost)
        return archived.num_rows, len(recorded.changes), len(lost)

    def _older_than_the_index(self, verdicts: pa.Table, indexed: set[str]) -> dict[str, set[str]]:
        """Messages the decided index does not know whose traces are older than it keeps (a trace arriving hours
        late starts a new state): by the archive hours their first decision may lie in (from their oldest trace
        on, for as long as the index keeps decisions). Few: only traces that late."""
        oldest = _now_ms() - self.keep_pointers_ms
        observed = verdicts.column("observed_ms")
        late = verdicts.filter(pc.fill_null(pc.less(observed, oldest), False))
        found: dict[str, set[str]] = {}
        ids, times = late.column("message_id").to_pylist(), late.column("observed_ms").to_pylist()
        for message_id, at in zip(ids, times, strict=True):
            if message_id not in indexed:
                hours = found.setdefault(message_id, set())
                hours.update(hour_of(int(at) + step) for step in range(0, self.keep_pointers_ms + HOUR_MS, HOUR_MS))
        if found:
            log.info("%d messages with traces older than the decided index keeps: their archived verdicts read back",
                     len(found))  # fmt: skip
        return found

    def _publish_lost(self, topic: str, lost: list[dict[str, Any]]) -> None:
        if self._producer is None:
            self._producer = Producer({**self.connection.client_config(), "enable.idempotence": True, "acks": "all"})
        for row in lost:
            self._producer.produce(topic, key=row["message_id"].encode(), value=json.dumps(row, default=str).encode())
        remaining = self._producer.flush(30)
        if remaining:  # written again with the batch (the topic is at-least-once)
            raise KafkaUnavailable(f"{remaining} LOST verdicts not acknowledged by topic {topic!r} within 30 s")


def held_back(
    verdicts: pa.Table, pointed: list[tuple[str, str, str, int, int]], hops: Mapping[str, list[Any]]
) -> np.ndarray:
    """Which of the processor's verdict rows (:data:`~khipu.detector.bucket.VERDICT_FIELDS`, hops by number) are LOST
    verdicts decided on the running batch's clock (``judged_by`` :data:`khipu.detector.bucket.AHEAD`) whose record a
    record of the same batch points at (``pointed``: (location, cluster, topic, partition, offset), as
    :func:`khipu.detector.records.pointers` gives them; a hop's pointing location and cluster from
    :meth:`khipu.detector.routes.RoutePlans.described`). Their processor decides them again in the next batch,
    once those pointers are stored (:meth:`khipu.detector.bucket.BucketJudge._decide`)."""
    rows = len(verdicts)
    held = np.zeros(rows, dtype=bool)
    if not rows or not pointed:
        return held
    ahead = pc.and_(pc.equal(verdicts.column("judged_by"), AHEAD), pc.equal(verdicts.column("verdict"), "LOST"))
    candidates = np.nonzero(pc.fill_null(ahead, False).to_numpy(zero_copy_only=False))[0]
    if not len(candidates):
        return held
    positions = set(pointed)
    picked = verdicts.select(["hop", "partition", "offset"]).take(pa.array(candidates)).to_pylist()
    for row_number, row in zip(candidates, picked, strict=True):
        hop = int(row["hop"])
        location, cluster, topic = hops["pointer_location"][hop], hops["cluster"][hop], hops["topic"][hop]
        if location is not None and row["partition"] is not None and row["offset"] is not None:
            held[row_number] = (location, cluster, topic, int(row["partition"]), int(row["offset"])) in positions
    return held


def expand_verdicts(verdicts: pa.Table, hops: Mapping[str, list[Any]]) -> pa.Table:
    """The processor's verdict rows with their hops spelt out (:meth:`khipu.detector.routes.RoutePlans.described`):
    stream, hop (its id), hop_kind, topic, group, location, and a plain DELIVERED's detail."""
    number = verdicts.column("hop").cast(pa.int64())
    described = {name: pa.array(values, pa.string()) for name, values in hops.items()}
    columns = {name: verdicts.column(name) for name in verdicts.column_names if name != "hop"}
    for name in ("stream", "hop", "hop_kind", "topic", "group", "location"):
        columns[name] = described[name].take(number)
    detail = verdicts.column("detail").cast(pa.string())
    columns["detail"] = pc.coalesce(detail, described["delivered_detail"].take(number))
    return pa.table(columns)


def _plain_new(change: Change) -> bool:
    """A change the verdict archive keeps: a first-time DELIVERED of the detector, without late evidence."""
    verdict = change.verdict
    return (
        change.previous is None
        and verdict.kind is VerdictKind.DELIVERED
        and not verdict.late_evidence
        and verdict.decided_by == "detector"
    )


def _archive_rows(verdicts: pa.Table) -> pa.Table:
    """The clean judge's DELIVERED verdicts as the verdict archive keeps them (its columns, no Python per row)."""
    n = verdicts.num_rows
    columns = {name: verdicts.column(name) for name in verdicts.column_names}
    columns["group_id"] = columns.pop("group")
    columns["decided_by"] = pa.array(["detector"] * n, pa.string())
    columns["evidence_kind"] = pa.nulls(n, pa.string())
    columns["late_evidence"] = pa.array([False] * n, pa.bool_())
    return conform(pa.table({name: columns[name] for name in ARCHIVE_COLUMNS}))


def _next_hour(hour: str) -> str:
    return hour_of(int(datetime.strptime(hour, "%Y-%m-%d-%H").replace(tzinfo=UTC).timestamp() * 1000) + HOUR_MS)


def _offsets(raw: Any) -> Any:
    try:
        return json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return raw


def batch_phases(duration_ms: Mapping[str, int]) -> str:
    """Where a batch's time went, from Spark's ``durationMs`` (its clock from the trigger to the commit):
    "4210 ms in all: addBatch 3900, queryPlanning 210, ...", the phases longest first (``addBatch`` is the writer,
    with the Spark job it collects and the state stores' commits; ``walCommit`` and ``commitOffsets`` the query's
    own logs); what no phase covers, Spark's bookkeeping between them, as "other"."""
    phases = {name: int(ms) for name, ms in duration_ms.items() if name != "triggerExecution"}
    total = int(duration_ms.get("triggerExecution", sum(phases.values())))
    phases["other"] = max(0, total - sum(phases.values()))
    named = ", ".join(f"{name} {ms}" for name, ms in sorted(phases.items(), key=lambda item: -item[1]))
    return f"{total} ms in all: {named}"


class HeartbeatListener(StreamingQueryListener):  # type: ignore[misc]
    """Every query's progress into the store: last batch time, rates (of traces: the lines of the batch records
    read, as the writer counted them), duration, messages in flight and their state's bytes (``state_rows`` /
    ``state_bytes``, from the processor's own count), and whether the batch
    read everything its source held (what lets verdicts wait for a detector that is behind)."""

    def __init__(self, store_url: str, figures: BatchFigures | None = None) -> None:
        self.store = Store(store_url)
        self.figures = figures  # the writer's figures: messages in flight, state bytes, how far the topic is read
        self.names: dict[str, str] = {}  # query id -> name (idle events carry only the id)

    def onQueryStarted(self, event: Any) -> None:
        self.names[str(event.id)] = event.name or "detector"
        if self.figures is not None:
            self.figures.last_progress_ms = _now_ms()
        log.info("query %s started (run %s)", event.name, event.runId)

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        operators = list(progress.stateOperators or [])
        sources = list(progress.sources or [])
        caught_up = bool(sources) and all(
            s.latestOffset is not None and _offsets(s.endOffset) == _offsets(s.latestOffset) for s in sources
        )
        records = int(progress.numInputRows)
        taken = self.figures.take(int(progress.batchId)) if self.figures is not None else (None, None)
        lines = records if taken[0] is None else taken[0]  # a batch the writer did not see (it failed): its records
        per_record = lines / records if records else 1.0  # Spark's rates are of records: the same clocks, in traces
        serial = taken[1]
        self._record(
            {
                "query_name": progress.name or "detector",
                "run_id": str(progress.runId),
                "batch_id": int(progress.batchId),
                "at_ms": _ms(progress.timestamp),
                "input_rows": lines,
                "input_rows_per_s": float(progress.inputRowsPerSecond or 0.0) * per_record,
                "processed_rows_per_s": float(progress.processedRowsPerSecond or 0.0) * per_record,
                "batch_duration_ms": int(progress.batchDuration or 0),
                "state_rows": self.figures.messages
                if self.figures is not None
                else sum(int(op.numRowsTotal) for op in operators),
                "state_bytes": self.figures.state_bytes
                if self.figures is not None
                else sum(int(op.memoryUsedBytes) for op in operators),
                "read_to_ms": self.figures.read_to_ms if self.figures is not None else None,
                "caught_up": caught_up,
                **(serial.as_columns() if serial is not None else {}),
            }
        )
        log.info(  # after the heartbeat: what only explains a batch's time never holds it up
            "batch %d: %s; in its stateful operator: updates %d ms, commit %d ms (task time, summed over partitions)",
            int(progress.batchId),
            batch_phases(dict(progress.durationMs or {})),
            sum(int(op.allUpdatesTimeMs or 0) for op in operators),
            sum(int(op.commitTimeMs or 0) for op in operators),
        )

    def onQueryIdle(self, event: Any) -> None:
        """An idle query has read everything there is: a caught-up heartbeat with no rows."""
        self._record(
            {
                "query_name": self.names.get(str(event.id), "detector"),
                "run_id": str(event.runId),
                "batch_id": -1,
                "at_ms": _ms(event.timestamp),
                "input_rows": 0,
                "input_rows_per_s": 0.0,
                "processed_rows_per_s": 0.0,
                "batch_duration_ms": 0,
                "state_rows": None,
                "state_bytes": None,
                "caught_up": True,
                "read_to_ms": None,
            }
        )

    def onQueryTerminated(self, event: Any) -> None:
        log.info("query %s terminated%s", event.id, f": {event.exception}" if event.exception else "")

    def _record(self, beat: dict[str, Any]) -> None:
        if self.figures is not None:
            self.figures.last_progress_ms = _now_ms()
        try:
            self.store.heartbeat.record(beat)
        except Exception as exc:  # a heartbeat that cannot be stored must not stop the detector
            log.warning("heartbeat not stored: %s", exc)


def _ms(timestamp: str) -> int:
    return int(datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp() * 1000)
