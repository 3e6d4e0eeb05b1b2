"""Detector figures from one run on this machine (not tests), against issue 11's targets:

1. limit: the same source, decode and shuffle with no state (every record decoded and packed by bucket as the
   detector does, shuffled by bucket, and its records counted per micro-batch), traces/s over a backlog;
2. backlog: the detector working off the same backlog (to decided verdicts), traces/s, with a slow consumer
   group holding 10 % of the messages in flight;
3. live: traces produced at a steady rate (25,000/s by default) for minutes, the groups committing a second
   behind, the slow group two minutes behind on 10 % of the messages: does the detector keep up, with how
   many messages in flight and how much state, and the cores the producer, the broker and the detector each used
   (three disjoint sets of processes: together at most the whole machine's);
4. LOST latency: from the responsible group's commit passing a lost message (demo-sink-store's, which never
   received it) to its LOST verdict in the store, p50 / p95, with the production default settings (grace,
   trigger, recheck, batch bound); a loss not seen as LOST within 180 s of that commit counts as infinitely
   late, whether seen later or never (so the p95 is "not reached" once more than 5 % are; ``figures.lost_latencies``,
   the soak's rule too), and the line says how many were seen later and how many never;
5. state: bytes per message in flight at two traffic levels (10x apart, the same messages in flight);
6. cluster: the same job on a Spark standalone cluster (a master and one, then two workers on 127.0.0.1).

    .venv/bin/python bench/detector.py [--only limit|backlog|live|latency|state|cluster ...] [--progress] [--keep]

Synthetic traces of demo-shaped messages (5 hops, ``config/registry.yaml``'s demo.orders) are written
straight to trace topics of the bench's own broker, and the groups' committed offsets are set by the
bench: the figures are the detector's. The broker runs on the same two CPUs. Targets (each printed beside its
figure with "met" or "NOT met"; a figure without one says "(no target)"): >= 25,000 traces/s from a backlog to
every decidable verdict stored; live, >= 25,000 traces/s offered over the measured window, and kept up with at the
rate offered (what is produced but not yet read grows by at most one batch over that window); LOST p95 <= 15 s;
<= 1 KB of state per message in flight, flat in traffic (the high level's within +10 % of the low one's).
The backlog and live parts also print their batches' serial part (the wall time per trace in which no task of the
query runs: Spark's batch duration less its job) and the ceiling it caps on 40 cores (``khipu.detector.serial``):
targets <= 0.6 us a trace and >= 500,000 traces/s, as the detector runs (its writer not overlapping the next batch).
"""

from __future__ import annotations

import argparse
import logging
import math
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
from confluent_kafka import Consumer, Producer, TopicPartition

from figures import LOST_DEADLINE_S, NO_TARGET, against, lost_latencies, seconds, unjudged
from khipu.detector.job import (
    DEFAULT_BUCKETS,
    DEFAULT_MAX_OFFSETS_PER_TRIGGER,
    DETECTOR_QUERY,
    DetectorJob,
    start_detector,
)
from khipu.detector.launch import connector_jars, throughput_settings
from khipu.detector.model import DetectorConfig
from khipu.detector.packed import PACKED_SCHEMA, RECORD_FIELDS, unpack
from khipu.detector.parse import RecordDecoder, kafka_columns
from khipu.detector.routes import RoutePlans
from khipu.detector.serial import serial_part
from khipu.kafka import KafkaAdmin, KafkaConnection
from khipu.localstack.broker import BrokerSpec, start_broker
from khipu.localstack.object_store import ObjectStoreProcess, ObjectStoreSpec, start_object_store
from khipu.localstack.processes import stop_process_group
from khipu.localstack.spark_cluster import start_spark_cluster
from khipu.registry import load_registry
from khipu.storage.location import Location
from khipu.storage.spark import hadoop_settings
from khipu.store import Store
from khipu.trace import Trace, TraceType, encode_trace
from khipu.trace.codec import BATCH_MAX_BYTES, BATCH_MAX_TRACES, encode_batch
from postgres import postgres_database

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "config" / "registry.yaml"
IN, OUT = "demo.orders", "demo.orders-enriched"
ENRICHER, STORE_SINK, AUDIT_SINK = "demo-enricher", "demo-sink-store", "demo-sink-audit"
GROUPS = {ENRICHER: IN, STORE_SINK: OUT, AUDIT_SINK: OUT}
PARTITIONS = 10  # of the data topics: the slow group lags on partition 0, 10 % of the messages
TRACE_PARTITIONS = 4
HOPS = 5
PRODUCED: dict[str, int] = {}  # backlog topics written in this run, and their traces
PARTS = ("limit", "backlog", "live", "latency", "state", "cluster")
TARGET_TRACES_S = 25_000  # from a backlog to every decidable verdict stored; live, offered (and kept up with)
LOST_P95_TARGET_S = 15.0
STATE_TARGET_BYTES = 1024  # per message in flight
ONE_BATCH = "not measured: the first batch, the warm-up, read it all"
CEILING_CORES = 40  # 20 executors of 2 cores
CEILING_TARGET_TRACES_S = 500_000  # on CEILING_CORES: 20 times Inca's average
SERIAL_TARGET_US = 0.6  # serial seconds per trace the ceiling target allows when the driver's work is not overlapped
STATE_FLAT_PERCENT = 10.0  # "flat in traffic": the high level's bytes per message at most this much above the low's


def held(message: int) -> bool:
    """The slow group reads this message late (data partition 0)."""
    return message % PARTITIONS == 0


def traces_of(
    message: int, run: str, now_ms: int, *, audit: bool = True, store: bool = True, nth: int | None = None
) -> list[Trace]:
    """The five traces of one demo message (without demo-sink-audit's / demo-sink-store's RECEIVED if asked).
    Each emitter numbers its traces in the order it emits them: the slow group's late reads come from an
    emitter of their own (its other reads skip the held messages), so no sequence number goes missing.
    ``nth``: the message is its run's nth and every one of the run's messages has all its traces (the
    emitters number by it), for runs whose message numbers are not 0, 1, 2, ..."""
    mid, partition, offset = f"{run}-{message:09d}", message % PARTITIONS, message // PARTITIONS
    back = tuple(o for o in (offset - 1, offset - 2, offset - 3) if o >= 0)  # as an emitter points back
    audit_emitter = f"{AUDIT_SINK}-late-{run}" if held(message) else f"{AUDIT_SINK}-{run}"
    audit_seq = message // PARTITIONS if held(message) else message - (message + PARTITIONS - 1) // PARTITIONS
    seq = message if nth is None else nth
    if nth is not None:
        audit_seq = nth

    def trace(location: str, kind: TraceType, topic: str, group: str | None, n: int, emitter: str, seq: int) -> Trace:
        return Trace(mid, "demo.orders", location, "local", kind, now_ms + n, topic, partition, offset, group, emitter,
                     seq, 100.0, prev_offsets=back if kind is TraceType.RECEIVED else ())  # fmt: skip

    hops = [
        trace("demo-producer", TraceType.SENT, IN, None, 0, f"demo-producer-{run}", seq),
        trace(ENRICHER, TraceType.RECEIVED, IN, ENRICHER, 1, f"{ENRICHER}-{run}", 2 * seq),
        trace(ENRICHER, TraceType.SENT, OUT, None, 2, f"{ENRICHER}-{run}", 2 * seq + 1),
        trace(STORE_SINK, TraceType.RECEIVED, OUT, STORE_SINK, 3, f"{STORE_SINK}-{run}", seq),
        trace(AUDIT_SINK, TraceType.RECEIVED, OUT, AUDIT_SINK, 4, audit_emitter, audit_seq),
    ]
    return [t for t in hops if (audit or t.location != AUDIT_SINK) and (store or t.location != STORE_SINK)]


def new_producer(bootstrap: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "queue.buffering.max.messages": 1_000_000,
                     "batch.num.messages": 10_000, "compression.type": "lz4"})  # fmt: skip


def send(producer: Producer, topic: str, traces: Iterable[Trace], per_record: int = 1) -> int:
    """Write the traces, one a record keyed by message id, or with ``per_record`` > 1 as the emitters do: each
    emitter's traces in order, up to that many (and ``BATCH_MAX_BYTES``) a batch record keyed by the emitter."""
    records: Iterable[tuple[bytes, bytes, int]]
    if per_record <= 1:
        records = ((encode_trace(t), t.message_id.encode(), 1) for t in traces)
    else:
        records = emitter_batches(traces, min(per_record, BATCH_MAX_TRACES))
    count = 0
    for value, key, lines in records:
        while True:
            try:
                producer.produce(topic, value, key)
                break
            except BufferError:
                producer.poll(0.05)
        count += lines
    producer.poll(0)
    return count


def emitter_batches(traces: Iterable[Trace], per_record: int) -> Iterator[tuple[bytes, bytes, int]]:
    """(batch record, its key, traces in it): each emitter's traces in their order, cut at ``per_record`` traces or
    ``BATCH_MAX_BYTES``, as an emitter packs what gathered in its linger."""
    by_emitter: dict[str, list[bytes]] = {}
    for trace in traces:
        by_emitter.setdefault(trace.emitter_id, []).append(encode_trace(trace))
    for emitter, encoded in by_emitter.items():
        batch: list[bytes] = []
        size = 0
        for line in encoded:
            if batch and (len(batch) >= per_record or size + len(line) > BATCH_MAX_BYTES):
                yield encode_batch(batch), emitter.encode(), len(batch)
                batch, size = [], 0
            batch.append(line)
            size += len(line) + 1
        if batch:
            yield encode_batch(batch), emitter.encode(), len(batch)


def produce(bootstrap: str, topic: str, traces: Iterable[Trace]) -> int:
    producer = new_producer(bootstrap)
    count = send(producer, topic, traces)
    producer.flush(600)
    return count


def commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    consumer.close()


def past(messages: int) -> dict[int, int]:
    """Committed offsets past the first ``messages`` messages on every data partition."""
    return {p: (messages + PARTITIONS - 1) // PARTITIONS + 1 for p in range(PARTITIONS)}


def first_offsets(message: int) -> dict[int, int]:
    """Per data partition, the offset of the first message from ``message`` on: committed there, a group has
    read everything before it and nothing from it on."""
    return {p: (message + (p - message) % PARTITIONS) // PARTITIONS for p in range(PARTITIONS)}


@dataclass(frozen=True)
class Storage:
    """Where a run keeps its store and data: local files and SQLite (the embedded default), or a cluster's
    PostgreSQL and object store (a real S3 API, s3proxy, started by the bench)."""

    label: str
    data: Location | None = None  # None: folders in the bench's work folder
    databases: ExitStack | None = None  # PostgreSQL databases made for its runs, dropped when closed; None: SQLite

    def store_url(self, work: Path, name: str) -> str:
        if self.databases is None:
            return f"sqlite:///{work / f'{name}.db'}"
        return self.databases.enter_context(postgres_database(f"khipu_bench_{name.replace('-', '_')}"))


LOCAL_FILES = Storage("local files, SQLite store")


def object_storage(work: Path) -> tuple[ObjectStoreProcess, Storage]:
    """s3proxy started for the bench, its variables set in this process (Spark's local executors and pyarrow
    read them), and the storage that puts the data there and the store on PostgreSQL."""
    store = start_object_store(ObjectStoreSpec.scratch(work / "s3"), work / "s3proxy.log")
    os.environ.update(store.environment())
    data = Location.of(f"s3a://{store.bucket}/bench")
    return store, Storage("object store (s3proxy), PostgreSQL store", data, ExitStack())


def s3_environment() -> dict[str, str]:
    """What reaches the object store (endpoint, credentials, region, the SDKs' checksum choice) from this process's
    environment: handed to the workers, whose executors inherit it (never as Spark settings)."""
    return {k: v for k, v in os.environ.items() if k.startswith("AWS_") or k == "KHIPU_S3_ENDPOINT"}


def job_for(
    bootstrap: str, work: Path, name: str, topic: str, storage: Storage = LOCAL_FILES, **options: Any
) -> DetectorJob:
    store_url = storage.store_url(work, name)
    store = Store(store_url)
    store.migrate()
    store.close()
    data = storage.data or Location.of(work)
    return DetectorJob(
        registry_path=REGISTRY,
        trace_connection=KafkaConnection(bootstrap),
        store_url=store_url,
        checkpoint_dir=data / f"ckpt-{name}",
        archive_dir=data / f"archive-{name}",
        verdicts_dir=data / f"verdicts-{name}",
        trace_topic=topic,
        lost_topic=None,
        **options,
    )


def decided(store: Store, stream: str = "demo.orders") -> int:
    """Verdicts decided so far, from the metrics the job aggregates (every verdict counts in one minute)."""
    kinds = ("delivered", "lost", "duplicate", "trace_lost", "pending", "confirmed_lost", "retracted")
    return sum(sum(int(row[k] or 0) for k in kinds) for row in store.verdicts.read_metrics(stream))


def read_rows(store: Store) -> int:
    return sum(b["input_rows"] for b in store.heartbeat.series(DETECTOR_QUERY, 0) if b["batch_id"] >= 0)


def wait_for(what: str, condition: Callable[[], bool], timeout_s: float, every_s: float = 1.0) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(every_s)
    return time.monotonic() - started


def sustained(beats: list[dict[str, Any]], total: int) -> tuple[float, int, float]:
    """(traces/s from the second batch until the backlog was read, batches, median rows per batch) from the
    heartbeat: the first batch (plan compilation, Python workers forking) is warm-up. NaN figures when the first
    batch read the whole backlog."""
    batches = sorted((b for b in beats if b["batch_id"] >= 0 and b["input_rows"] > 0), key=lambda b: b["batch_id"])
    read, last = 0, len(batches) - 1
    for n, beat in enumerate(batches):
        read += beat["input_rows"]
        if read >= total:
            last = n
            break
    steady = batches[1 : last + 1]
    if not steady:
        return math.nan, len(batches), math.nan
    rows = sum(b["input_rows"] for b in steady)
    seconds = (steady[-1]["at_ms"] + steady[-1]["batch_duration_ms"] - steady[0]["at_ms"]) / 1000
    return rows / seconds, len(steady) + 1, statistics.median(b["input_rows"] for b in steady)


def judged(target: str, traces_s: float, met: bool) -> str:
    """:func:`figures.against`, or "not judged" when the rate was not measured."""
    return unjudged(target, "not measured") if math.isnan(traces_s) else against(target, met)


def settled_count(store: Store, quiet_s: float) -> tuple[int, int]:
    """(verdicts decided, when the count last grew, epoch ms) once it has held still for ``quiet_s``."""
    count, grew_ms, still_since = decided(store), time.time_ns() // 1_000_000, time.monotonic()
    while time.monotonic() - still_since < quiet_s:
        time.sleep(0.25)
        now = decided(store)
        if now != count:
            count, grew_ms, still_since = now, time.time_ns() // 1_000_000, time.monotonic()
    return count, grew_ms


def to_verdicts(beats: list[dict[str, Any]], total: int, stored_ms: int) -> float:
    """Traces/s from the second batch's start (the first is warm-up) to ``stored_ms``, when the last verdict was
    stored: the traces those batches read over the time until every verdict they allow is decided. NaN when the
    first batch read the whole backlog."""
    batches = sorted((b for b in beats if b["batch_id"] >= 0 and b["input_rows"] > 0), key=lambda b: b["batch_id"])
    if len(batches) < 2:
        return math.nan
    rows = min(total, sum(b["input_rows"] for b in batches)) - batches[0]["input_rows"]
    seconds = (stored_ms - batches[1]["at_ms"]) / 1000
    return rows / seconds if seconds > 0 else math.nan


def rate_of(traces_s: float, median_rows: float = math.nan) -> str:
    """A backlog's rate as printed (with its batches' median rows, if given): ``31,600 traces/s`` or, when its
    first batch (the warm-up) read it all, that it was not measured."""
    if math.isnan(traces_s):
        return ONE_BATCH
    batches = "" if math.isnan(median_rows) else f" (batches of median {median_rows:,.0f} rows)"
    return f"{traces_s:,.0f} traces/s{batches}"


def backlog_topic(bootstrap: str, args: argparse.Namespace) -> tuple[str, int]:
    """The backlog both the limit and the detector read: every message but the slow group's late reads."""
    topic, now = "bench.backlog", time.time_ns() // 1_000_000
    if topic in PRODUCED:
        return topic, PRODUCED[topic]
    KafkaAdmin(KafkaConnection(bootstrap)).ensure_topics({topic: TRACE_PARTITIONS})
    started = time.monotonic()
    total = produce(
        bootstrap, topic, (t for m in range(args.messages) for t in traces_of(m, "bk", now, audit=not held(m)))
    )
    print(f"  backlog: {total:,} traces produced in {time.monotonic() - started:.0f} s", flush=True)
    PRODUCED[topic] = total
    return topic, total


def records_in(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` after the shuffle: the records in each task's packed rows, counted."""
    for batch in batches:
        records = sum(unpack([blob], RECORD_FIELDS).num_rows for blob in batch.column("blob").to_pylist())
        yield pa.RecordBatch.from_pydict({"records": pa.array([records], pa.int64())})


def stateless_limit(spark: Any, bootstrap: str, work: Path, args: argparse.Namespace) -> float:
    """The same source, decode and shuffle with no state: every record decoded and packed by bucket, as the
    detector does, shuffled by bucket, and counted per micro-batch where the shuffle delivers it."""
    topic, total = backlog_topic(bootstrap, args)
    plans = RoutePlans.of(load_registry(REGISTRY))
    decoder = RecordDecoder(("demo.orders",), plans.hop_keys(), args.buckets)
    seen: list[tuple[float, int]] = []

    def count(batch: Any, batch_id: int) -> None:
        rows = batch.mapInArrow(records_in, "records long").agg({"records": "sum"}).collect()[0][0] or 0
        seen.append((time.monotonic(), int(rows)))

    source = (
        spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
        .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(args.max_per_batch)).load()
    )  # fmt: skip
    query = (
        kafka_columns(source)
        .mapInArrow(decoder, PACKED_SCHEMA)
        .repartition(4, "bucket")
        .writeStream.foreachBatch(count)
        .option("checkpointLocation", tempfile.mkdtemp(prefix="limit-", dir=work))
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        wait_for("the stateless query", lambda: sum(n for _, n in seen) >= total, 1800, 0.5)
    finally:
        query.stop()
    steady = seen[1:]  # the first batch is warm-up
    seconds = steady[-1][0] - seen[0][0] if steady else 0
    rate = sum(n for _, n in steady) / seconds if seconds > 0 else math.nan
    print(f"limit: {rate_of(rate)} (decode, pack + shuffle by bucket, no state; {total:,} traces, "
          f"{len(seen)} batches of at most {args.max_per_batch:,}) -> {NO_TARGET}: the ceiling the detector's "
          "figures stand against", flush=True)  # fmt: skip
    return rate


def backlog(spark: Any, bootstrap: str, work: Path, args: argparse.Namespace) -> float:
    """The detector works off the backlog; demo-sink-audit reads data partition 0 (10 %) ``hold_s`` late."""
    topic, total = backlog_topic(bootstrap, args)
    for group, group_topic in GROUPS.items():
        commit(bootstrap, group, group_topic, {**past(args.messages), **({0: 0} if group == AUDIT_SINK else {})})
    job = job_for(bootstrap, work, "backlog", topic, max_offsets_per_trigger=args.max_per_batch, buckets=args.buckets)
    store = Store(job.store_url)
    queries = start_detector(spark, job)
    started = time.monotonic()
    try:
        read_all = wait_for("the backlog", lambda: read_rows(store) >= total, 1800)
        # the clock stops when the last verdict decidable before the slow group's late reads is stored (SQL store
        # and verdict archive both count in the metric parts the writer stores with them): the count, looked at
        # every 0.25 s, when it last grew before holding still for 15 s
        decidable, stored_ms = settled_count(store, 15.0)
        beats = store.heartbeat.series(DETECTOR_QUERY, 0)
        rate, batches, per_batch = sustained(beats, total)
        decided_rate = to_verdicts(beats, total, stored_ms)
        beat = store.heartbeat.latest(DETECTOR_QUERY) or {}
        time.sleep(max(0.0, started + args.hold_s - time.monotonic()))
        now = time.time_ns() // 1_000_000
        reads = (t for m in range(0, args.messages, PARTITIONS) for t in traces_of(m, "bk", now))
        late = produce(bootstrap, topic, (t for t in reads if t.location == AUDIT_SINK))
        commit(bootstrap, AUDIT_SINK, OUT, past(args.messages))
        wait_for("every verdict", lambda: decided(store) >= HOPS * args.messages, 900, 2)
        if args.progress:
            print_progress(store.heartbeat.series(DETECTOR_QUERY, 0))
    finally:
        for query in queries:
            query.stop()
        store.close()
    print(
        f"backlog, broker -> every decidable verdict stored (SQL store and verdict archive; from the second "
        f"batch's start to the last of the {decidable:,} verdicts not waiting for the slow group): "
        f"{rate_of(decided_rate)} -> "
        f"{judged(f'>= {TARGET_TRACES_S:,} traces/s', decided_rate, decided_rate >= TARGET_TRACES_S)}",
        flush=True,
    )
    print(
        f"backlog, read only (second batch's start to the end of the batch that read the last trace, its verdicts "
        f"not yet all decided): {rate_of(rate, per_batch)}, {total:,} traces read in {read_all:.0f} s in {batches} "
        f"batches; {beat.get('state_rows', 0):,} messages in flight "
        f"({beat.get('state_bytes', 0):,} state bytes) once the decidable verdicts were stored; the slow group's "
        f"{late:,} late reads at {args.hold_s:.0f} s, then all {HOPS * args.messages:,} verdicts decided -> "
        f"{NO_TARGET}",
        flush=True,
    )
    for line in serial_lines("backlog", beats, spark.sparkContext.defaultParallelism):
        print(line, flush=True)
    return rate


def live_traffic(
    bootstrap: str,
    topic: str,
    rate: int,
    seconds: float,
    hold_s: float,
    report: Any,
    commits: bool = True,
    per_record: int = 1,
) -> None:
    """(A process of its own.) Traces at ``rate`` per second for ``seconds``; every second the groups commit past
    what was produced a second before, demo-sink-audit reads and commits data partition 0 ``hold_s`` late. Without
    ``commits`` the groups' commits are left to the caller (the latency part has them past every message already)."""
    producer, run = new_producer(bootstrap), "lv"
    committers = {g: Consumer({"bootstrap.servers": bootstrap, "group.id": g, "enable.auto.commit": False})
                  for g in GROUPS} if commits else {}  # fmt: skip
    per_second = rate // HOPS
    held_queue: deque[tuple[float, int]] = deque()
    produced, message, started = 0, 0, time.monotonic()
    history: deque[tuple[float, int]] = deque()  # (when, messages produced by then)
    late_upto = 0  # held messages below this one have had their late read
    tick = 0.0
    while True:
        now = time.monotonic()
        elapsed = now - started
        if elapsed < seconds:
            due = int(elapsed * per_second)
            clock = time.time_ns() // 1_000_000
            batch = range(message, due)
            traces = (t for m in batch for t in traces_of(m, run, clock, audit=not held(m)))
            produced += send(producer, topic, traces, per_record)
            held_queue.extend((now + hold_s, m) for m in batch if held(m))
            message = due
        clock = time.time_ns() // 1_000_000
        late = []
        while held_queue and held_queue[0][0] <= now:
            late.append(held_queue.popleft()[1])
        produced += send(
            producer, topic, (t for m in late for t in traces_of(m, run, clock) if t.location == AUDIT_SINK), per_record
        )
        if late:
            late_upto = late[-1] + 1
        history.append((now, message))
        if now - tick >= 1:  # commit past what was produced a second ago
            tick = now
            while len(history) > 1 and history[1][0] <= now - 1:
                history.popleft()
            settled = history[0][1]
            for group, consumer in committers.items():
                offsets = past(settled) if settled else {}
                if group == AUDIT_SINK and offsets:
                    offsets[0] = (late_upto + PARTITIONS - 1) // PARTITIONS  # the slow group, behind on partition 0
                if offsets:
                    consumer.commit(offsets=[TopicPartition(GROUPS[group], p, o) for p, o in offsets.items()],
                                    asynchronous=False)  # fmt: skip
        report.value = produced
        if elapsed >= seconds and not held_queue:
            break
        time.sleep(0.02)
    producer.flush(120)
    report.value = produced
    for group, consumer in committers.items():  # everything read and committed past at the end
        consumer.commit(offsets=[TopicPartition(GROUPS[group], p, o) for p, o in past(message).items()],
                        asynchronous=False)  # fmt: skip
        consumer.close()
    report.value = produced


def process_tree(pid: int) -> set[int]:
    """``pid`` and every process below it (none if it is gone)."""
    try:
        return {pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))}
    except psutil.Error:
        return set()


def cpu_seconds(pids: Iterable[int]) -> dict[int, float]:
    """User + system CPU seconds each of these processes has used so far (those still running)."""
    used = {}
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        used[pid] = times.user + times.system
    return used


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuShare:
    """Who used the CPUs between two readings: the producer process, the broker, and the detector (this process
    with its Spark driver JVM and Python workers: every process below it but the producer's and the broker's, each
    with the processes below them). The three sets share no process, so together they use at most the machine."""

    at: float
    producer: dict[int, float]
    broker: dict[int, float]
    detector: dict[int, float]
    machine_s: float

    @classmethod
    def read(cls, producer: int, broker: int) -> CpuShare:
        producers, brokers = process_tree(producer), process_tree(broker)
        detector = process_tree(os.getpid()) - producers - brokers
        return cls(time.monotonic(), cpu_seconds(producers), cpu_seconds(brokers), cpu_seconds(detector),
                   machine_busy_s())  # fmt: skip

    def since(self, start: CpuShare) -> str:
        """Cores each used from ``start`` to this reading (a process that started in between counts from 0, one that
        ended in between is left out)."""
        wall = self.at - start.at

        def cores(now: dict[int, float], then: dict[int, float]) -> float:
            return sum(used - then.get(pid, 0.0) for pid, used in now.items()) / wall

        parts = [cores(self.producer, start.producer), cores(self.broker, start.broker),
                 cores(self.detector, start.detector)]  # fmt: skip
        machine = (self.machine_s - start.machine_s) / wall
        return (f"producer {parts[0]:.2f}, broker {parts[1]:.2f}, detector {parts[2]:.2f} (the bench's driver "
                f"process, its Spark driver JVM and Python workers); the three {sum(parts):.2f}, the whole machine "
                f"{machine:.2f} of {os.cpu_count()} (other processes: {machine - sum(parts):.2f})")  # fmt: skip


def live(
    spark: Any, bootstrap: str, work: Path, args: argparse.Namespace, broker_pid: int, storage: Storage = LOCAL_FILES
) -> None:
    name = "live" if storage is LOCAL_FILES else "live-object-store"
    topic = f"bench.{name}"
    KafkaAdmin(KafkaConnection(bootstrap)).ensure_topics({topic: TRACE_PARTITIONS})
    job = job_for(bootstrap, work, name, topic, storage, buckets=args.buckets)  # production defaults otherwise
    print(f"live [{storage.label}]:", flush=True)
    store = Store(job.store_url)
    queries = start_detector(spark, job)
    try:
        wait_for("the detector's first batch", lambda: store.heartbeat.latest(DETECTOR_QUERY) is not None, 300)
        context = multiprocessing.get_context("spawn")
        produced = context.Value("q", 0)
        traffic = context.Process(
            target=live_traffic,
            args=(bootstrap, topic, args.live_rate, args.live_s, args.hold_s, produced, True, args.traces_per_record),
        )
        started = time.time()
        traffic.start()
        window_from = started + args.warmup_s
        samples: list[tuple[float, int, int, int]] = []  # (time, produced, read, in flight)
        cpu: list[CpuShare] = []  # read with the window's first and last samples
        assert traffic.pid is not None
        while traffic.is_alive():
            traffic.join(5)  # a sample every 5 s, and the traffic's end seen when it comes
            beat = store.heartbeat.latest(DETECTOR_QUERY) or {}
            samples.append((time.time(), int(produced.value), read_rows(store), int(beat.get("state_rows") or 0)))
            if window_from <= samples[-1][0] <= started + args.live_s:
                reading = CpuShare.read(traffic.pid, broker_pid)
                cpu = [cpu[0], reading] if cpu else [reading]
            if args.progress:
                print(f"  {samples[-1][0] - started:5.0f} s: produced {samples[-1][1]:,}, read {samples[-1][2]:,}, "
                      f"{samples[-1][3]:,} in flight", flush=True)  # fmt: skip
        ended = time.time()
        total = int(produced.value)
        caught_up = wait_for("the detector to read everything", lambda: read_rows(store) >= total, 900)
        settled = wait_for("every verdict", lambda: decided(store) >= HOPS * total // HOPS, 900, 2)
        beats = [b for b in store.heartbeat.series(DETECTOR_QUERY, 0) if b["batch_id"] >= 0]
    finally:
        for query in queries:
            query.stop()
        store.close()
    window = [s for s in samples if s[0] >= window_from and s[0] <= started + args.live_s]
    if len(window) < 2:
        print("live: the run was too short to measure", flush=True)
        return
    offered = (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0])
    read = (window[-1][2] - window[0][2]) / (window[-1][0] - window[0][0])
    behind = [s[1] - s[2] for s in window]
    flights = [s[3] for s in window]
    durations = [b["batch_duration_ms"] for b in beats if b["input_rows"]]
    state_bytes = max((b["state_bytes"] or 0) for b in beats) if beats else 0
    elapsed = window[-1][0] - window[0][0]
    largest = max((b["input_rows"] for b in beats if window[0][0] * 1000 <= b["at_ms"] <= window[-1][0] * 1000),
                  default=0)  # fmt: skip
    print(
        f"live: offered {math.floor(offered):,} traces/s, the detector read {read:,.0f} traces/s over {elapsed:.0f} s "
        f"(after {args.warmup_s:.0f} s warm-up); produced but not yet read: median "
        f"{statistics.median(behind):,.0f}, max {max(behind):,} traces; messages in flight: median "
        f"{statistics.median(flights):,.0f}, max {max(flights):,} (the slow group holds {args.hold_s:.0f} s of 10 %), "
        f"state at most {state_bytes:,} bytes; batches: median {statistics.median(durations) / 1000:.1f} s; caught up "
        f"{caught_up:.0f} s after the traffic ended ({total:,} traces in {ended - started:.0f} s), every verdict "
        f"decided {settled:.0f} s after that -> {NO_TARGET}",
        flush=True,
    )
    for line in live_targets(offered, args.live_rate, behind, largest):
        print(line, flush=True)
    in_window = [b for b in beats if window[0][0] * 1000 <= b["at_ms"] <= window[-1][0] * 1000]
    live_label, cores = f"live [{storage.label}]", spark.sparkContext.defaultParallelism
    for line in serial_lines(live_label, in_window, cores, skip_first=False):  # the window's: long past the warm-up
        print(line, flush=True)
    if len(cpu) == 2:
        print(f"live: cores used over the same {cpu[1].at - cpu[0].at:.0f} s: {cpu[1].since(cpu[0])} -> {NO_TARGET}",
              flush=True)  # fmt: skip
    # while behind, every batch reads the limit: their pace is the read rate, without where the window's ends fall
    full = [b for b in sorted(beats, key=lambda b: b["batch_id"]) if b["input_rows"] >= args.max_per_batch - 10][1:]
    if full and args.traces_per_record == 1:  # else a batch's traces say nothing of whether the limit cut it
        pace = statistics.mean(b["batch_duration_ms"] for b in full) / 1000
        rate = sum(b["input_rows"] for b in full) / sum(b["batch_duration_ms"] / 1000 for b in full)
        print(f"live: {len(full)} batches read the limit of {args.max_per_batch:,} records (the first left out), in "
              f"{pace:.2f} s each on average (Spark's batch duration): {rate:,.0f} traces/s while behind -> "
              f"{NO_TARGET}", flush=True)  # fmt: skip


def serial_lines(label: str, beats: list[dict[str, Any]], job_cores: int, skip_first: bool = True) -> list[str]:
    """The batches' serial part and the ceiling it caps (:mod:`khipu.detector.serial`), from their heartbeats
    (``skip_first``: leave out the first batch, the query's warm-up)."""
    part = serial_part(beats, skip_first=skip_first)
    if not part.traces:
        return [f"{label}: serial part not measured (no batch with the writer's figures)"]
    serial, writer = part.per_trace_us(part.serial_s), part.per_trace_us(part.driver_s)
    rate = part.per_core_rate(job_cores)
    alone = part.ceiling(CEILING_CORES, job_cores, overlapped=False)
    overlapped = part.ceiling(CEILING_CORES, job_cores, overlapped=True)
    left_out = " (the first left out)" if skip_first else ""
    return [
        f"{label}: serial part {serial:.2f} us a trace: the wall time in which no task of the query ran, Spark's batch "
        f"duration less the batch's collect (its Spark job, and the fetch and decoding of its results on the driver, "
        f"which the collect's clock covers too: the serial part is understated by that), over {part.batches} batches "
        f"of {part.traces:,} lines read (traces and emitter marks){left_out}; of it the writer after the collect "
        f"{writer:.2f} us, Spark's own bookkeeping {serial - writer:.2f} us; the writer thread's CPU "
        f"{part.per_trace_us(part.driver_cpu_s):.2f} us a trace (the decoding included; the JVM's driver threads not) "
        f"-> {against(f'<= {SERIAL_TARGET_US} us (not overlapped, as the detector runs)', serial <= SERIAL_TARGET_US)}",
        f"{label}: per-core rate {rate:,.0f} traces/s (traces per second of the collects' wall time, per core of the "
        f"job's {job_cores}; the results' decoding on the driver counted as the cores' work) -> {NO_TARGET}",
        f"{label}: projected ceiling on {CEILING_CORES} cores: {alone:,.0f} traces/s with the driver's work not "
        f"overlapped, 1 / (1 / ({CEILING_CORES} x {rate:,.0f}) + {serial:.2f} us), as the detector runs; "
        f"{overlapped:,.0f} if it overlapped the next batch, min({CEILING_CORES} x {rate:,.0f}, 1 / {serial:.2f} us); "
        f"optimistic by the decoding the rate scales with the cores -> "
        f"{against(f'>= {CEILING_TARGET_TRACES_S:,} traces/s', alone >= CEILING_TARGET_TRACES_S)}",
    ]


def live_targets(offered: float, asked: int, behind: list[int], largest: int) -> list[str]:
    """The live part's two targets over the measured window: the rate offered reached the detector's target, and
    the detector kept up with what was offered, at that rate: what is produced but not yet read (``behind``, sampled
    over the window) grows by no more than one batch (the reads are counted a batch at a time, so one batch, the
    window's ``largest``, is what the count moves by without falling behind)."""
    grew, rate = behind[-1] - behind[0], f"{math.floor(offered):,}"  # rounded down: 24,999.6 is not 25,000
    keeps_up = f"keeps up at {rate} traces/s offered: grows by at most one batch"
    return [
        f"live: offered {rate} traces/s over the window (--live-rate {asked:,}) -> "
        f"{against(f'>= {TARGET_TRACES_S:,} traces/s offered', offered >= TARGET_TRACES_S)}",
        f"live: at {rate} traces/s offered, produced but not yet read went from {behind[0]:,} to "
        f"{behind[-1]:,} traces over the window ({grew:+,}; its largest batch read {largest:,}) -> "
        f"{against(keeps_up, grew <= largest)}",
    ]


def print_progress(beats: list[dict[str, Any]]) -> None:
    for beat in beats:
        if beat["batch_id"] >= 0:
            print(f"  batch {beat['batch_id']}: {beat['input_rows']:,} rows in {beat['batch_duration_ms']:,} ms; "
                  f"{beat['state_rows']:,} in flight, {beat['state_bytes']:,} state bytes")  # fmt: skip


def lost_latency(spark: Any, bootstrap: str, work: Path, args: argparse.Namespace) -> None:
    """The live detector with the production defaults, under background traffic; each lost message's group
    commits past it at a known time."""
    topic, base = "bench.lost", 10_000_000  # offsets far from the other parts'
    KafkaAdmin(KafkaConnection(bootstrap)).ensure_topics({topic: TRACE_PARTITIONS})
    job = job_for(bootstrap, work, "latency", topic)  # every setting the production default
    store = Store(job.store_url)
    queries = start_detector(spark, job)
    for group, group_topic in GROUPS.items():  # the background traffic sits below every group's commit
        commit(bootstrap, group, group_topic, {0: base, **dict.fromkeys(range(1, PARTITIONS), 10**9)})
    committed_at: dict[str, float] = {}  # lost message -> when demo-sink-store's commit past it returned
    seen: dict[str, float] = {}  # message -> when its LOST verdict was first seen in the store

    def look() -> None:
        for verdict in store.verdicts.page(verdicts=["LOST"], limit=10_000):
            if verdict["message_id"] not in seen:
                seen[verdict["message_id"]] = time.time()

    producer, background = new_producer(bootstrap), 0  # every emitter numbers from 0, without holes
    sent, started = 0, time.monotonic()
    live_rate = args.latency_live_rate
    context = multiprocessing.get_context("spawn")
    produced = context.Value("q", 0)
    traffic_process = None
    try:
        wait_for("the detector's first batch", lambda: store.heartbeat.latest(DETECTOR_QUERY) is not None, 300)
        if live_rate:  # a process of its own offers the background (below every group's commit: it is DELIVERED)
            seconds = args.warmup_s + 0.5 * args.lost + 200  # outlasts the losses and their wait; stopped after
            traffic_process = context.Process(
                target=live_traffic,
                args=(bootstrap, topic, live_rate, seconds, 0.0, produced, False, args.traces_per_record),
            )
            traffic_process.start()
            time.sleep(args.warmup_s)
        started, produced_before = time.monotonic(), int(produced.value)
        for n in range(args.lost):
            message = (base + n) * PARTITIONS  # partition 0, offset base + n
            clock = time.time_ns() // 1_000_000
            background_messages = 0 if live_rate else args.background
            traffic = [
                t for m in range(background, background + background_messages) for t in traces_of(m, "bg", clock)
            ]
            background += background_messages
            send(producer, topic, [*traffic, *traces_of(message, "lost", clock, store=False, nth=n)])
            sent += len(traffic)
            producer.flush(30)
            time.sleep(0.3)
            for group, group_topic in GROUPS.items():
                commit(bootstrap, group, group_topic, {0: base + n + 1})
                if group == STORE_SINK:  # the group responsible for the lost hop: its commit makes the loss decidable
                    committed_at[f"lost-{message:09d}"] = time.time()
            look()
            time.sleep(0.2)
        deadline = max(committed_at.values(), default=time.time()) + LOST_DEADLINE_S
        while not committed_at.keys() <= seen.keys() and time.time() < deadline:
            look()
            time.sleep(0.2)
        # the background offered while the losses were judged: from the first loss to the last LOST seen
        sent += int(produced.value) - produced_before
        rate = sent / max(1e-9, time.monotonic() - started)
        if live_rate:
            beat = store.heartbeat.latest(DETECTOR_QUERY) or {}
            print(f"latency: the live background offered {rate:,.0f} traces/s; the detector's last batch read "
                  f"{beat.get('input_rows') or 0:,} traces in {(beat.get('batch_duration_ms') or 0) / 1000:.1f} s",
                  flush=True)  # fmt: skip
    finally:
        if traffic_process is not None:
            traffic_process.terminate()
            traffic_process.join(30)
        for query in queries:
            query.stop()
        store.close()
    defaults = DetectorConfig()
    settings = (f"grace {defaults.grace_ms / 1000:g} s, trigger {job.trigger_seconds:g} s, recheck "
                f"{defaults.recheck_ms / 1000:g} s; {rate:,.0f} background traces/s, averaged from the first loss to "
                "the last LOST seen or the deadline")  # fmt: skip
    print(lost_latency_figure(committed_at, seen, settings, time.time()), flush=True)


def lost_latency_figure(committed_at: dict[str, float], seen: dict[str, float], settings: str, now: float) -> str:
    """The LOST latency line by the benches' one rule (:func:`figures.lost_latencies`): a loss not seen LOST within
    ``LOST_DEADLINE_S`` of its commit is infinitely late, seen later or never; a LOST seen of a message the bench did
    not lose is reported beside it."""
    figure = lost_latencies(committed_at, seen, now)
    p95 = figure.at(0.95)
    return (
        f"LOST latency (demo-sink-store's commit passing a lost message -> its LOST verdict stored), "
        f"{figure.counted()}: p50 {seconds(figure.at(0.5))}, p95 {seconds(p95)}, max {seconds(figure.worst())}; "
        f"LOST said of {len(seen.keys() - committed_at.keys())} message(s) the bench did not lose (production "
        f"defaults: {settings}) -> {against(f'p95 <= {LOST_P95_TARGET_S:g} s', p95 <= LOST_P95_TARGET_S)}"
    )


def state_per_message(spark: Any, bootstrap: str, work: Path, args: argparse.Namespace) -> None:
    """The same messages in flight (demo-sink-audit has not read them) while 10x more traffic flows past."""
    now = time.time_ns() // 1_000_000
    count = args.in_flight
    per_message: dict[str, float] = {}
    for level, flowing in (("low", count * 2), ("high", count * 20)):
        topic, run = f"bench.state.{level}", f"st{level}"
        KafkaAdmin(KafkaConnection(bootstrap)).ensure_topics({topic: TRACE_PARTITIONS})
        messages = count + flowing
        # the flowing messages first, every group past them; then the held ones, which demo-sink-audit has not read
        total = produce(
            bootstrap, topic, (t for m in range(messages) for t in traces_of(m, run, now, audit=m < flowing))
        )
        for group, group_topic in GROUPS.items():
            commit(bootstrap, group, group_topic, first_offsets(flowing) if group == AUDIT_SINK else past(messages))
        job = job_for(bootstrap, work, f"state-{level}", topic, buckets=args.buckets)
        store = Store(job.store_url)
        queries = start_detector(spark, job)
        try:
            wait_for(f"{level}: the traffic read", lambda s=store, t=total: read_rows(s) >= t, 900)  # type: ignore[misc]
            time.sleep(15)  # a grace and a few batches: what can be decided is
            beat = store.heartbeat.latest(DETECTOR_QUERY) or {}
            progress = next((q.lastProgress for q in queries if q.name == DETECTOR_QUERY), None) or {}
            rocksdb = sum(int(op.get("memoryUsedBytes") or 0) for op in progress.get("stateOperators", []))
        finally:
            for query in queries:
                query.stop()
            store.close()
        in_flight = int(beat.get("state_rows") or 0)
        per_message[level] = (beat.get("state_bytes") or 0) / in_flight if in_flight else math.inf
        print(f"state, {level} traffic ({total:,} traces): {in_flight:,} messages in flight; the processor's "
              f"compressed state blobs {beat.get('state_bytes', 0):,} bytes, {per_message[level]:,.0f} per message in "
              f"flight -> {against(f'<= {STATE_TARGET_BYTES:,} bytes', per_message[level] <= STATE_TARGET_BYTES)}; "
              f"the state store's memoryUsedBytes (RocksDB, the measure of the 'before' figure) {rocksdb:,} bytes, "
              f"{rocksdb / max(1, in_flight):,.0f} per message in flight -> {NO_TARGET}", flush=True)  # fmt: skip
    grown = (per_message["high"] / per_message["low"] - 1) * 100 if per_message["low"] else math.inf
    print(f"state, 10x the traffic past the same messages in flight: {per_message['low']:,.0f} -> "
          f"{per_message['high']:,.0f} bytes per message ({grown:+.0f} %) -> "
          f"{against(f'flat: within +{STATE_FLAT_PERCENT:g} %', grown <= STATE_FLAT_PERCENT)}", flush=True)  # fmt: skip


def cluster_throughput(bootstrap: str, work: Path, args: argparse.Namespace, storage: Storage) -> None:
    """The same job submitted to a standalone cluster of one, then two workers (one core each), as a cluster runs
    it: the workers as another Unix user (``nobody``: the driver's folders are closed to them), the store on
    PostgreSQL, the archives and checkpoint in the object store."""
    messages = args.cluster_messages
    for workers in (1, 2):
        topic, now = f"bench.cluster.{workers}", time.time_ns() // 1_000_000
        KafkaAdmin(KafkaConnection(bootstrap)).ensure_topics({topic: TRACE_PARTITIONS})
        total = produce(bootstrap, topic, (t for m in range(messages) for t in traces_of(m, f"cl{workers}", now)))
        for group, group_topic in GROUPS.items():
            commit(bootstrap, group, group_topic, past(messages))
        folder = Path(tempfile.mkdtemp(prefix=f"khipu-bench-cluster-{workers}-"))  # outside the 0700 work folder
        folder.chmod(0o755)
        cluster = start_spark_cluster(folder, workers=workers, run_as="nobody", worker_environment=s3_environment())
        job = job_for(bootstrap, work, f"cluster-{workers}", topic, storage)
        store = Store(job.store_url)
        command = [sys.executable, str(ROOT / "spark" / "detector.py"), "--registry", str(REGISTRY),
                   "--bootstrap-servers", bootstrap, "--trace-topic", topic, "--lost-topic", "",
                   "--checkpoint", str(job.checkpoint_dir), "--archive", str(job.archive_dir),
                   "--verdict-archive", str(job.verdicts_dir), "--master", cluster.url,
                   "--max-offsets-per-trigger", str(args.max_per_batch), "--buckets", str(args.buckets)]  # fmt: skip
        env = {**os.environ, "KHIPU_STORE_URL": job.store_url, "PYSPARK_PYTHON": cluster.python}
        with (work / f"cluster-{workers}.log").open("wb") as log:
            driver = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                wait_for(f"{workers} worker(s): the backlog", lambda s=store, t=total: read_rows(s) >= t, 1800)  # type: ignore[misc]
                rate, batches, per_batch = sustained(store.heartbeat.series(DETECTOR_QUERY, 0), total)
                wait_for(f"{workers} worker(s): every verdict", lambda s=store: decided(s) >= HOPS * messages, 600, 2)  # type: ignore[misc]
            finally:
                stop_process_group(driver.pid)
                cluster.stop()
                store.close()
                shutil.rmtree(folder, ignore_errors=True)
        print(f"cluster [{storage.label}, workers as another user], {workers} worker(s) x 1 core, read only "
              f"(second batch's start to the end of the batch that read the last trace, its verdicts not yet all "
              f"decided): {rate_of(rate, per_batch)}, {total:,} traces "
              f"backlog in {batches} batches; every verdict decided afterwards -> "
              f"{NO_TARGET}", flush=True)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=PARTS, help="run these parts only (default: all)")
    parser.add_argument("--messages", type=int, default=300_000, help="limit, backlog: messages (x5 traces)")
    parser.add_argument("--hold-s", type=float, default=120.0, help="how late the slow group reads 10 %% of them")
    parser.add_argument("--live-rate", type=int, default=25_000, help="live: traces per second offered")
    parser.add_argument("--live-s", type=float, default=240.0, help="live: how long the traffic runs")
    parser.add_argument("--warmup-s", type=float, default=30.0, help="live: left out of the figures")
    parser.add_argument(
        "--max-per-batch", type=int, default=DEFAULT_MAX_OFFSETS_PER_TRIGGER, help="maxOffsetsPerTrigger"
    )
    parser.add_argument(
        "--traces-per-record",
        type=int,
        default=1,
        help="live, latency: the live traffic's records hold up to this many traces of one emitter, as the emitters "
        "batch them (default 1: a record per trace)",
    )
    parser.add_argument("--buckets", type=int, default=DEFAULT_BUCKETS)
    parser.add_argument(
        "--spark-conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting of the bench's driver"
    )
    parser.add_argument("--lost", type=int, default=40)
    parser.add_argument("--background", type=int, default=200, help="latency: background messages per loss (x5 traces)")
    parser.add_argument(
        "--latency-live-rate",
        type=int,
        default=0,
        help="latency: background traces/s from a live producer process of its own instead of --background "
        "(e.g. 25000; it runs --warmup-s before the first loss)",
    )
    parser.add_argument("--in-flight", type=int, default=10_000, help="state: messages held in flight")
    parser.add_argument("--cluster-messages", type=int, default=200_000)
    parser.add_argument(
        "--storage",
        choices=("local", "object-store", "both"),
        default="local",
        help="live: the archives and checkpoint in local folders with an SQLite store, in an object store (s3proxy) "
        "with a PostgreSQL store, or both one after the other in the same run (the cluster part always uses the "
        "object store and PostgreSQL)",
    )
    parser.add_argument(
        "--progress", action="store_true", help="every batch's rows, time and state; the writer's steps"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, topics, stores) afterwards")
    args = parser.parse_args()
    parts = set(args.only or PARTS)
    if args.progress:  # the writer's line per batch: where its time went
        logging.basicConfig(level=logging.WARNING, format="  %(asctime)s %(message)s")
        logging.getLogger("khipu.detector.outputs").setLevel(logging.INFO)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = Path(tempfile.mkdtemp(prefix="khipu-bench-"))
    object_store, remote = (
        object_storage(work) if args.storage != "local" or "cluster" in parts else (None, None)
    )  # before Spark starts: its JVM takes the environment as it is then
    broker = start_broker(BrokerSpec.scratch(work / "kafka", settings={"log.retention.check.interval.ms": "300000"}),
                          work / "broker.log")  # fmt: skip
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[*]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.memory", "4g")
        .config("spark.jars", ",".join(str(jar) for jar in connector_jars()))
    )
    for key, value in hadoop_settings(os.environ).items():  # S3A to the object store, when one was started
        builder = builder.config(key, value)
    if any("=" not in setting for setting in args.spark_conf):
        parser.error(f"--spark-conf takes KEY=VALUE: {[s for s in args.spark_conf if '=' not in s]}")
    experiment = dict(setting.partition("=")[::2] for setting in args.spark_conf)  # the experiment's own settings
    for key, value in {**throughput_settings("local[*]"), **experiment}.items():  # the detector's, unless replaced
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        broker.admin().ensure_topics({IN: PARTITIONS, OUT: PARTITIONS})
        print(f"detector bench: {os.cpu_count()} CPUs (the broker on them too), {args.buckets} buckets, batches of at "
              f"most {args.max_per_batch:,} records, work in {work}", flush=True)  # fmt: skip
        if "limit" in parts:
            stateless_limit(spark, broker.bootstrap_servers, work, args)
        if "backlog" in parts:
            backlog(spark, broker.bootstrap_servers, work, args)
        if "live" in parts:
            if args.storage in ("local", "both"):
                live(spark, broker.bootstrap_servers, work, args, broker.pid)
            if args.storage in ("object-store", "both"):
                assert remote is not None
                live(spark, broker.bootstrap_servers, work, args, broker.pid, remote)
        if "latency" in parts:
            lost_latency(spark, broker.bootstrap_servers, work, args)
        if "state" in parts:
            state_per_message(spark, broker.bootstrap_servers, work, args)
        if "cluster" in parts:
            spark.stop()
            assert remote is not None
            cluster_throughput(broker.bootstrap_servers, work, args, remote)
        return 0
    finally:
        spark.stop()
        stop_process_group(broker.pid)
        if object_store is not None:
            object_store.stop()
        if remote is not None and remote.databases is not None:
            remote.databases.close()  # the runs' PostgreSQL databases
        if args.keep:
            print(f"work kept in {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
