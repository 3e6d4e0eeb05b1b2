"""Detector figures from one run on this machine (not tests), against issue 11's targets:

1. throughput: sustained traces/s from a backlog on the broker to decided verdicts, beside the limit
   measured in the same run — the same source and shuffle with no state (``groupBy(message_id).count()``
   per micro-batch) — with a slow consumer group holding 10 % of the messages in flight for two minutes;
2. LOST latency: from the responsible group's commit passing a lost message to its LOST verdict in the
   store, p50 / p95, with the production default settings (grace, trigger, recheck, batch bound);
3. state: bytes per message in flight at two traffic levels (10x apart, the same messages in flight);
4. scale-out: throughput on a Spark standalone cluster (a master and one, then two workers on 127.0.0.1).

    .venv/bin/python bench/detector.py [--messages 600000] [--only throughput|latency|state|cluster] [--progress]

Synthetic traces of demo-shaped messages (5 hops, ``config/registry.yaml``'s demo.orders) are written
straight to trace topics of the bench's own broker, and the groups' committed offsets are set by the
bench: the figures are the detector's. Targets: >= 25,000 traces/s sustained; LOST p95 <= 15 s;
<= 1 KB of state per message in flight, flat in traffic.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from khipu.detector.job import DEFAULT_BUCKETS, DETECTOR_QUERY, DetectorJob, connector_jars, start_detector
from khipu.detector.model import DetectorConfig
from khipu.kafka import KafkaAdmin, KafkaConnection
from khipu.localstack.broker import BrokerSpec, start_broker
from khipu.localstack.processes import stop_process_group
from khipu.localstack.spark_cluster import start_spark_cluster
from khipu.store import Store
from khipu.trace import Trace, TraceType, encode_trace

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "config" / "registry.yaml"
IN, OUT = "demo.orders", "demo.orders-enriched"
ENRICHER, STORE_SINK, AUDIT_SINK = "demo-enricher", "demo-sink-store", "demo-sink-audit"
GROUPS = {ENRICHER: IN, STORE_SINK: OUT, AUDIT_SINK: OUT}
PARTITIONS = 10  # of the data topics: the slow group lags on one of them, 10 % of the messages
TRACE_PARTITIONS = 4
HOPS = 5


def traces_of(message: int, run: str, now_ms: int, *, audit: bool = True, store: bool = True) -> list[Trace]:
    """The five traces of one demo message (without demo-sink-audit's / demo-sink-store's RECEIVED if asked)."""
    mid, partition, offset = f"{run}-{message:09d}", message % PARTITIONS, message // PARTITIONS
    back = tuple(o for o in (offset - 1, offset - 2, offset - 3) if o >= 0)  # as an emitter points back

    def trace(location: str, kind: TraceType, topic: str, group: str | None, n: int) -> Trace:
        return Trace(mid, "demo.orders", location, "local", kind, now_ms + n, topic, partition, offset, group,
                     f"{location}-{run}", 2 * message + (n == 2) if location == ENRICHER else message, 100.0,
                     prev_offsets=back if kind is TraceType.RECEIVED else ())  # fmt: skip

    hops = [
        trace("demo-producer", TraceType.SENT, IN, None, 0),
        trace(ENRICHER, TraceType.RECEIVED, IN, ENRICHER, 1),
        trace(ENRICHER, TraceType.SENT, OUT, None, 2),
        trace(STORE_SINK, TraceType.RECEIVED, OUT, STORE_SINK, 3),
        trace(AUDIT_SINK, TraceType.RECEIVED, OUT, AUDIT_SINK, 4),
    ]
    return [t for t in hops if (audit or t.location != AUDIT_SINK) and (store or t.location != STORE_SINK)]


def produce(bootstrap: str, topic: str, traces: Iterable[Trace]) -> int:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "queue.buffering.max.messages": 1_000_000,
                         "batch.num.messages": 10_000, "compression.type": "lz4"})  # fmt: skip
    count = 0
    for trace in traces:
        while True:
            try:
                producer.produce(topic, encode_trace(trace), trace.message_id.encode())
                break
            except BufferError:
                producer.poll(0.1)
        count += 1
    producer.flush(600)
    return count


def commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    consumer.close()


def past(messages: int) -> dict[int, int]:
    """Committed offsets past the first ``messages`` messages on every data partition."""
    return {p: (messages + PARTITIONS - 1) // PARTITIONS + 1 for p in range(PARTITIONS)}


def job_for(bootstrap: str, work: Path, name: str, topic: str, **options: Any) -> DetectorJob:
    store_url = f"sqlite:///{work / f'{name}.db'}"
    store = Store(store_url)
    store.migrate()
    store.close()
    return DetectorJob(
        registry_path=REGISTRY,
        trace_connection=KafkaConnection(bootstrap),
        store_url=store_url,
        checkpoint_dir=work / f"ckpt-{name}",
        archive_dir=work / f"archive-{name}",
        verdicts_dir=work / f"verdicts-{name}",
        trace_topic=topic,
        lost_topic=None,
        **options,
    )


def decided(store: Store, stream: str = "demo.orders") -> int:
    """Verdicts decided so far, from the metrics the job aggregates (every verdict counts in one minute)."""
    kinds = ("delivered", "lost", "duplicate", "trace_lost", "pending", "confirmed_lost", "retracted")
    return sum(sum(int(row[k] or 0) for k in kinds) for row in store.verdicts.read_metrics(stream))


def wait_for(what: str, condition: Callable[[], bool], timeout_s: float, every_s: float = 1.0) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(every_s)
    return time.monotonic() - started


def sustained(beats: list[dict[str, Any]], total: int) -> tuple[float, int, float]:
    """(traces/s from the second batch until the backlog was read, batches, median rows per batch) from the
    heartbeat: the first batch (query start, plan compilation, Python workers forking) is warm-up."""
    batches = sorted((b for b in beats if b["batch_id"] >= 0 and b["input_rows"] > 0), key=lambda b: b["batch_id"])
    read, last = 0, len(batches) - 1
    for n, beat in enumerate(batches):
        read += beat["input_rows"]
        if read >= total:
            last = n
            break
    steady = batches[1 : last + 1]
    if not steady:
        return 0.0, len(batches), 0.0
    rows = sum(b["input_rows"] for b in steady)
    seconds = (steady[-1]["at_ms"] + steady[-1]["batch_duration_ms"] - steady[0]["at_ms"]) / 1000
    return rows / seconds, len(steady) + 1, statistics.median(b["input_rows"] for b in steady)


def stateless_limit(spark: Any, bootstrap: str, topic: str, total: int, max_per_batch: int) -> float:
    """The same source and shuffle with no state: decode, groupBy(message_id).count() per micro-batch."""
    from khipu.detector.parse import parse_traces, valid

    seen: list[tuple[float, int]] = []

    def count(batch: Any, batch_id: int) -> None:
        rows = batch.groupBy("message_id").count().agg({"count": "sum"}).collect()[0][0] or 0
        seen.append((time.monotonic(), int(rows)))

    source = (
        spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
        .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(max_per_batch)).load()
    )  # fmt: skip
    query = (
        valid(parse_traces(source, ["demo.orders"]))
        .writeStream.foreachBatch(count)
        .option("checkpointLocation", tempfile.mkdtemp(prefix="khipu-bench-limit-"))
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        wait_for("the stateless query", lambda: sum(n for _, n in seen) >= total, 1800, 0.5)
    finally:
        query.stop()
    if len(seen) < 3:
        return 0.0
    rows = sum(n for _, n in seen[1:])
    return rows / (seen[-1][0] - seen[0][0])


def throughput(spark: Any, bootstrap: str, work: Path, args: argparse.Namespace) -> None:
    """A backlog of decidable messages; demo-sink-audit reads data partition 0 (10 % of them) two minutes late."""
    topic, now, run = "bench.traces", time.time_ns() // 1_000_000, "tp"
    KafkaAdmin(KafkaConnection(bootstrap)).ensure_topics({topic: TRACE_PARTITIONS})
    slow = [m for m in range(args.messages) if m % PARTITIONS == 0]
    started = time.monotonic()
    total = produce(
        bootstrap, topic, (t for m in range(args.messages) for t in traces_of(m, run, now, audit=m % PARTITIONS != 0))
    )
    print(f"  produced {total:,} traces in {time.monotonic() - started:.0f} s", flush=True)
    for group, group_topic in GROUPS.items():
        offsets = past(args.messages)
        if group == AUDIT_SINK:
            offsets[0] = 0  # the slow group: nothing of partition 0 read or committed yet
        commit(bootstrap, group, group_topic, offsets)
    limit = stateless_limit(spark, bootstrap, topic, total, args.max_per_batch)
    print(f"  stateless limit: {limit:,.0f} traces/s", flush=True)

    job = job_for(bootstrap, work, "throughput", topic, max_offsets_per_trigger=args.max_per_batch,
                  buckets=args.buckets, detector=DetectorConfig(grace_ms=args.grace_ms))  # fmt: skip
    store = Store(job.store_url)
    queries = start_detector(spark, job)
    started = time.monotonic()
    try:
        held = started + args.hold_s
        read_all = wait_for(
            "the backlog",
            lambda: sum(b["input_rows"] for b in store.heartbeat.series(DETECTOR_QUERY, 0)) >= total,
            1800,
        )
        beats = store.heartbeat.series(DETECTOR_QUERY, 0)
        rate, batches, per_batch = sustained(beats, total)
        in_flight = store.heartbeat.latest(DETECTOR_QUERY) or {}
        decided_then = decided(store)
        time.sleep(max(0.0, held - time.monotonic()))
        late = produce(bootstrap, topic, (t for m in slow for t in traces_of(m, run, now) if t.location == AUDIT_SINK))
        commit(bootstrap, AUDIT_SINK, OUT, past(args.messages))
        wait_for("every verdict", lambda: decided(store) >= HOPS * args.messages, 900, 2)
        if args.progress:
            print_progress(store.heartbeat.series(DETECTOR_QUERY, 0))
    finally:
        for query in queries:
            query.stop()
    print(
        f"throughput: {rate:,.0f} traces/s sustained ({total:,} traces backlog read in {read_all:.0f} s, {batches} "
        f"batches, median {per_batch:,.0f} rows; {args.buckets} buckets); stateless limit in the same run: "
        f"{limit:,.0f} traces/s ({rate / limit:.0%} of it). With {in_flight.get('state_rows', 0):,} messages in flight "
        f"({in_flight.get('state_bytes', 0) / max(1, in_flight.get('state_rows') or 1):,.0f} bytes each) when the "
        f"backlog was read, {decided_then:,} verdicts decided then; the slow group's {late:,} traces and commit at "
        f"{args.hold_s:.0f} s: all {HOPS * args.messages:,} verdicts decided.",
        flush=True,
    )
    store.close()


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
    committed_at: dict[str, float] = {}
    seen: dict[str, float] = {}

    def look() -> None:
        for verdict in store.verdicts.page(verdicts=["LOST"], limit=10_000):
            if verdict["message_id"] not in seen:
                seen[verdict["message_id"]] = time.time()

    background = 1_000_000
    try:
        wait_for("the detector's first batch", lambda: store.heartbeat.latest(DETECTOR_QUERY) is not None, 300)
        for n in range(args.lost):
            message = (base + n) * PARTITIONS  # partition 0, offset base + n
            traffic = [
                t
                for m in range(background, background + args.background)
                for t in traces_of(m, "bg", time.time_ns() // 1_000_000)
            ]
            background += args.background
            produce(bootstrap, topic, [*traffic, *traces_of(message, "lost", time.time_ns() // 1_000_000, store=False)])
            time.sleep(0.3)
            for group, group_topic in GROUPS.items():
                commit(bootstrap, group, group_topic, {0: base + n + 1})
            committed_at[f"lost-{message:09d}"] = time.time()
            look()
            time.sleep(0.2)
        deadline = time.time() + 180
        while len(seen) < args.lost and time.time() < deadline:
            look()
            time.sleep(0.2)
    finally:
        for query in queries:
            query.stop()
    latencies = sorted(seen[m] - committed_at[m] for m in seen if m in committed_at)
    defaults = DetectorConfig()
    settings = (f"grace {defaults.grace_ms / 1000:g} s, trigger {job.trigger_seconds:g} s, recheck "
                f"{defaults.recheck_ms / 1000:g} s, {args.background * 5 * 2:,} background traces/s")  # fmt: skip
    if latencies:
        p95 = latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))]
        print(
            f"LOST latency (commit passing the message -> LOST verdict stored), {len(latencies)} of {args.lost} "
            f"losses: p50 {statistics.median(latencies):.1f} s, p95 {p95:.1f} s, max {latencies[-1]:.1f} s "
            f"(production defaults: {settings})",
            flush=True,
        )
    else:
        print(f"LOST latency: no LOST verdict within 180 s ({settings})", flush=True)
    store.close()


def state_per_message(spark: Any, bootstrap: str, work: Path, args: argparse.Namespace) -> None:
    """The same messages in flight (demo-sink-audit has not read them) while 10x more traffic flows past."""
    now = time.time_ns() // 1_000_000
    held = args.in_flight
    for level, flowing in (("low", held * 2), ("high", held * 20)):
        topic, run = f"bench.state.{level}", f"st{level}"
        KafkaAdmin(KafkaConnection(bootstrap)).ensure_topics({topic: TRACE_PARTITIONS})
        messages = held + flowing
        total = produce(bootstrap, topic, (t for m in range(messages) for t in traces_of(m, run, now, audit=m >= held)))
        offsets = past(messages)
        for group, group_topic in GROUPS.items():
            commit(
                bootstrap,
                group,
                group_topic,
                offsets if group != AUDIT_SINK else {**offsets, **dict.fromkeys(range(PARTITIONS), 0)},
            )
        job = job_for(bootstrap, work, f"state-{level}", topic, max_offsets_per_trigger=args.max_per_batch,
                      buckets=args.buckets)  # fmt: skip
        store = Store(job.store_url)
        # nothing of the held messages is past demo-sink-audit's commit: committed 0 means they stay in flight
        queries = start_detector(spark, job)
        try:
            # the held messages' hops up to demo-sink-store are decided at once; the write into the enriched
            # topic and demo-sink-audit's hop wait for demo-sink-audit
            wait_for(f"{level} traffic decided", lambda: decided(store) >= HOPS * flowing + 3 * held, 900, 2)
            wait_for(f"{level}: only the held messages in flight",
                     lambda: (store.heartbeat.latest(DETECTOR_QUERY) or {}).get("state_rows") == held, 300)  # fmt: skip
            beat = store.heartbeat.latest(DETECTOR_QUERY) or {}
        finally:
            for query in queries:
                query.stop()
        print(f"state, {level} traffic ({total:,} traces, {flowing:,} messages decided): {beat['state_rows']:,} "
              f"messages in flight, {beat['state_bytes']:,} state bytes, {beat['state_bytes'] / held:,.0f} bytes "
              f"per message in flight", flush=True)  # fmt: skip
        store.close()


def cluster_throughput(bootstrap: str, work: Path, args: argparse.Namespace) -> None:
    """The same job submitted to a standalone cluster of one, then two workers (one core each)."""
    messages = args.cluster_messages
    for workers in (1, 2):
        topic, now = f"bench.cluster.{workers}", time.time_ns() // 1_000_000
        KafkaAdmin(KafkaConnection(bootstrap)).ensure_topics({topic: TRACE_PARTITIONS})
        total = produce(bootstrap, topic, (t for m in range(messages) for t in traces_of(m, f"cl{workers}", now)))
        for group, group_topic in GROUPS.items():
            commit(bootstrap, group, group_topic, past(messages))
        cluster = start_spark_cluster(work / f"cluster-{workers}", workers=workers)
        job = job_for(bootstrap, work, f"cluster-{workers}", topic)
        store = Store(job.store_url)
        command = [sys.executable, str(ROOT / "spark" / "detector.py"), "--registry", str(REGISTRY),
                   "--bootstrap-servers", bootstrap, "--trace-topic", topic, "--lost-topic", "",
                   "--checkpoint", str(job.checkpoint_dir), "--archive", str(job.archive_dir), "--master", cluster.url,
                   "--max-offsets-per-trigger", str(args.max_per_batch), "--buckets", str(args.buckets)]  # fmt: skip
        env = {**os.environ, "KHIPU_STORE_URL": job.store_url, "PYSPARK_PYTHON": sys.executable}
        log = (work / f"cluster-{workers}.log").open("wb")
        driver = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for(f"{workers} worker(s): the backlog",
                     lambda: sum(b["input_rows"] for b in store.heartbeat.series(DETECTOR_QUERY, 0)) >= total, 1800)  # fmt: skip
            rate, batches, per_batch = sustained(store.heartbeat.series(DETECTOR_QUERY, 0), total)
            wait_for(f"{workers} worker(s): every verdict", lambda: decided(store) >= HOPS * messages, 600, 2)
        finally:
            stop_process_group(driver.pid)
            cluster.stop()
            log.close()
        print(f"cluster, {workers} worker(s) x 1 core: {rate:,.0f} traces/s sustained ({total:,} traces, {batches} "
              f"batches, median {per_batch:,.0f} rows), every verdict decided", flush=True)  # fmt: skip
        store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=600_000, help="throughput: messages in the backlog (x5 traces)")
    parser.add_argument("--hold-s", type=float, default=120.0, help="throughput: the slow group's delay")
    parser.add_argument("--grace-ms", type=int, default=DetectorConfig().grace_ms)
    parser.add_argument("--max-per-batch", type=int, default=None, help="maxOffsetsPerTrigger (default: the job's)")
    parser.add_argument("--buckets", type=int, default=DEFAULT_BUCKETS)
    parser.add_argument("--lost", type=int, default=40)
    parser.add_argument("--background", type=int, default=200, help="latency: background messages per loss")
    parser.add_argument("--in-flight", type=int, default=10_000, help="state: messages held in flight")
    parser.add_argument("--cluster-messages", type=int, default=100_000)
    parser.add_argument("--only", choices=("throughput", "latency", "state", "cluster"), help="run one part only")
    parser.add_argument("--progress", action="store_true", help="throughput: every batch's rows, time and state")
    args = parser.parse_args()
    from khipu.detector.job import DEFAULT_MAX_OFFSETS_PER_TRIGGER

    args.max_per_batch = args.max_per_batch or DEFAULT_MAX_OFFSETS_PER_TRIGGER
    if args.progress:  # the writer's line per batch: where its time went
        logging.basicConfig(level=logging.WARNING, format="  %(asctime)s %(message)s")
        logging.getLogger("khipu.detector.outputs").setLevel(logging.INFO)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = Path(tempfile.mkdtemp(prefix="khipu-bench-"))
    broker = start_broker(BrokerSpec.scratch(work / "kafka", settings={"log.retention.check.interval.ms": "300000"}),
                          work / "broker.log")  # fmt: skip
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[*]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.memory", "4g")
        .config("spark.jars", ",".join(str(jar) for jar in connector_jars()))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        broker.admin().ensure_topics({IN: PARTITIONS, OUT: PARTITIONS})
        print(f"detector bench: {os.cpu_count()} CPUs, {args.buckets} buckets, batches of at most "
              f"{args.max_per_batch:,} records, work in {work}", flush=True)  # fmt: skip
        if args.only in (None, "throughput"):
            throughput(spark, broker.bootstrap_servers, work, args)
        if args.only in (None, "latency"):
            lost_latency(spark, broker.bootstrap_servers, work, args)
        if args.only in (None, "state"):
            state_per_message(spark, broker.bootstrap_servers, work, args)
        if args.only in (None, "cluster"):
            spark.stop()
            cluster_throughput(broker.bootstrap_servers, work, args)
        return 0
    finally:
        spark.stop()
        stop_process_group(broker.pid)


if __name__ == "__main__":
    sys.exit(main())
