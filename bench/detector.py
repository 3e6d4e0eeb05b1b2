"""Detector figures from one run on this machine (not tests):

1. sustained traces/s from the broker to stored verdicts, next to the raw confluent-kafka consume
   rate of the same topic (the limit);
2. time from a group's commit passing a lost message to the LOST verdict in the store, p50 / p95;
3. state bytes per in-flight message at two traffic levels (flat means state follows messages in
   flight, not traffic).

    .venv/bin/python bench/detector.py [--messages 20000] [--grace-ms 2000] [--only throughput] [--progress]

Synthetic traces of demo-shaped messages (5 hops) are written straight to trace topics of its own
broker, and the groups' committed offsets are set by the bench: the figures are the detector's.
Targets: >= 25,000 traces/s, LOST p95 <= 15 s (with the grace printed), state flat in traffic.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from khipu.detector.job import VERDICT_QUERY, DetectorJob, connector_jars, start_detector
from khipu.detector.model import DetectorConfig
from khipu.kafka import KafkaAdmin, KafkaConnection
from khipu.localstack.broker import BrokerSpec, start_broker
from khipu.localstack.processes import stop_process_group
from khipu.store import Store
from khipu.trace import Trace, TraceType, encode_trace

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "config" / "registry.yaml"
IN, OUT = "demo.orders", "demo.orders-enriched"
GROUPS = {"demo-enricher": IN, "demo-sink-store": OUT, "demo-sink-audit": OUT}
PARTITIONS = 3


def traces_of(message: int, run: str, now_ms: int, skip_sink: bool = False) -> list[Trace]:
    """The five traces of one demo message; with skip_sink, demo-sink-store's RECEIVED is missing."""
    mid, partition, offset = f"{run}-{message:08d}", message % PARTITIONS, message // PARTITIONS

    def trace(location: str, kind: TraceType, topic: str, group: str | None, n: int) -> Trace:
        return Trace(
            mid,
            "demo.orders",
            location,
            "local",
            kind,
            now_ms + n,
            topic,
            partition,
            offset,
            group,
            f"{location}-{run}",
            2 * message + (n == 2) if location == "demo-enricher" else message,  # each emitter numbers 0, 1, 2...
            100.0,
            prev_offsets=back if kind is TraceType.RECEIVED else (),
        )

    back = tuple(o for o in (offset - 1, offset - 2, offset - 3) if o >= 0)  # as an emitter points back

    hops = [
        trace("demo-producer", TraceType.SENT, IN, None, 0),
        trace("demo-enricher", TraceType.RECEIVED, IN, "demo-enricher", 1),
        trace("demo-enricher", TraceType.SENT, OUT, None, 2),
        trace("demo-sink-store", TraceType.RECEIVED, OUT, "demo-sink-store", 3),
        trace("demo-sink-audit", TraceType.RECEIVED, OUT, "demo-sink-audit", 4),
    ]
    return [t for t in hops if not (skip_sink and t.location == "demo-sink-store")]


def produce(bootstrap: str, topic: str, traces: list[Trace]) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "queue.buffering.max.messages": 2_000_000,
        }
    )
    for trace in traces:
        while True:
            try:
                producer.produce(topic, encode_trace(trace), trace.message_id.encode())
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(300)


def commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, p, offset) for p in range(PARTITIONS)], asynchronous=False)
    consumer.close()


def raw_consume_rate(bootstrap: str, topic: str, expected: int) -> float:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"raw-{secrets.token_hex(3)}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got, started = 0, None
    while got < expected:
        batch = consumer.consume(10_000, 1.0)
        if batch and started is None:
            started = time.perf_counter()
        got += sum(1 for m in batch if m.error() is None)
    elapsed = time.perf_counter() - (started or time.perf_counter())
    consumer.close()
    return got / elapsed if elapsed else float("inf")


def detector(
    bootstrap: str, work: Path, name: str, topic: str, args: argparse.Namespace, recheck_ms: int = 1_000
) -> tuple[DetectorJob, Store]:
    store_url = f"sqlite:///{work / f'{name}.db'}"
    store = Store(store_url)
    store.migrate()
    job = DetectorJob(
        registry_path=REGISTRY,
        trace_connection=KafkaConnection(bootstrap),
        store_url=store_url,
        checkpoint_dir=work / f"ckpt-{name}",
        archive_dir=work / f"archive-{name}",
        trace_topic=topic,
        lost_topic=None,
        trigger_seconds=args.trigger_seconds,
        max_offsets_per_trigger=args.max_per_batch,
        detector=DetectorConfig(grace_ms=args.grace_ms, max_wait_ms=600_000, recheck_ms=recheck_ms),
    )
    return job, store


def throughput(spark: Any, bootstrap: str, work: Path, args: argparse.Namespace) -> None:
    """A backlog of decidable messages (every group already past them): traces/s to stored verdicts."""
    topic, now = "bench.traces", time.time_ns() // 1_000_000
    KafkaAdmin(KafkaConnection(bootstrap)).ensure_topics({topic: 4})
    produce(bootstrap, topic, [t for m in range(args.messages) for t in traces_of(m, "tp", now)])
    for group, group_topic in GROUPS.items():
        commit(bootstrap, group, group_topic, args.messages)
    traces = args.messages * 5
    raw = raw_consume_rate(bootstrap, topic, traces)
    job, store = detector(bootstrap, work, "throughput", topic, args)
    started = time.perf_counter()
    queries = start_detector(spark, job)
    first_batch = None
    while len(store.verdicts.read()) < traces:
        time.sleep(1)
        if first_batch is None and store.heartbeat.latest(VERDICT_QUERY):
            first_batch = time.perf_counter()
    finished = time.perf_counter()
    if args.progress:
        print_progress(queries)
    for query in queries:
        query.stop()
    rate = traces / (finished - started)
    print(
        f"throughput: {rate:,.0f} traces/s to stored verdicts ({traces:,} traces in {finished - started:.0f} s "
        f"from query start; {args.grace_ms / 1000:g} s of it is the grace); raw confluent-kafka consume of the "
        f"same topic: {raw:,.0f} records/s"
    )


def print_progress(queries: list[Any]) -> None:
    """Where each micro-batch's time went, per query: Spark's own progress (ms), and the state operator's."""
    phases = ("triggerExecution", "queryPlanning", "addBatch", "walCommit", "commitOffsets")
    for query in queries:
        for progress in query.recentProgress:
            if not progress.numInputRows and not progress.stateOperators:
                continue
            spent = ", ".join(f"{phase} {progress.durationMs.get(phase, 0) or 0}" for phase in phases)
            state = "; ".join(
                f"state rows {op.numRowsTotal}, updates {op.allUpdatesTimeMs} ms, commit {op.commitTimeMs} ms"
                for op in progress.stateOperators or []
            )
            print(f"  {query.name} batch {progress.batchId}: {progress.numInputRows} rows; {spent}. {state}")


def lost_latency(spark: Any, bootstrap: str, work: Path, args: argparse.Namespace) -> None:
    """Live detector; each lost message's group commits past it at a known time."""
    topic, base = "bench.lost", 10_000_000  # offsets far from the other parts'
    KafkaAdmin(KafkaConnection(bootstrap)).ensure_topics({topic: 4})
    job, store = detector(bootstrap, work, "latency", topic, args)
    queries = start_detector(spark, job)
    for group, group_topic in GROUPS.items():
        commit(bootstrap, group, group_topic, base)
    committed_at: dict[str, float] = {}
    seen: dict[str, float] = {}

    def look() -> None:
        for verdict in store.verdicts.read():
            if verdict["verdict"] == "LOST" and verdict["message_id"] not in seen:
                seen[verdict["message_id"]] = time.time()

    for n in range(args.lost):
        message = (base + n) * PARTITIONS  # partition 0, offset base + n
        produce(bootstrap, topic, traces_of(message, "lost", time.time_ns() // 1_000_000, skip_sink=True))
        time.sleep(0.3)
        for group, group_topic in GROUPS.items():
            commit(bootstrap, group, group_topic, base + n + 1)
        committed_at[f"lost-{message:08d}"] = time.time()
        look()
    deadline = time.time() + 180
    while len(seen) < args.lost and time.time() < deadline:
        look()
        time.sleep(0.2)
    for query in queries:
        query.stop()
    latencies = sorted(seen[m] - committed_at[m] for m in seen if m in committed_at)
    if latencies:
        p95 = latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))]
        print(
            f"LOST latency (commit passing the message -> LOST verdict stored), {len(latencies)} of {args.lost} "
            f"losses: p50 {statistics.median(latencies):.1f} s, p95 {p95:.1f} s (grace {args.grace_ms / 1000:g} s, "
            f"trigger {args.trigger_seconds:g} s)"
        )
    else:
        print("LOST latency: no LOST verdict within 180 s")


def state_per_message(spark: Any, bootstrap: str, work: Path, args: argparse.Namespace) -> None:
    """Messages nobody has committed past stay in flight: state bytes per message at two levels."""
    now = time.time_ns() // 1_000_000
    for level, count in (("low", args.messages // 10), ("high", args.messages // 2)):
        topic = f"bench.state.{level}"
        KafkaAdmin(KafkaConnection(bootstrap)).ensure_topics({topic: 4})
        produce(bootstrap, topic, [t for m in range(count) for t in traces_of(20_000_000 + m, level, now)])
        job, store = detector(bootstrap, work, f"state-{level}", topic, args, recheck_ms=60_000)
        queries = start_detector(spark, job)
        beat = None
        while beat is None or not beat["state_rows"] or beat["batch_id"] < 1:
            time.sleep(2)
            beat = store.heartbeat.latest(VERDICT_QUERY)
        for query in queries:
            query.stop()
        print(
            f"state, {level} traffic: {count:,} messages in flight, {beat['state_rows']:,} state rows, "
            f"{beat['state_bytes'] / count:,.0f} bytes per message"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--grace-ms", type=int, default=2_000)
    parser.add_argument("--trigger-seconds", type=float, default=2.0)
    parser.add_argument("--max-per-batch", type=int, default=50_000, help="maxOffsetsPerTrigger")
    parser.add_argument("--lost", type=int, default=40)
    parser.add_argument("--only", choices=("throughput", "latency", "state"), help="run one part only")
    parser.add_argument("--progress", action="store_true", help="throughput: where each micro-batch's time went")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = Path(tempfile.mkdtemp(prefix="khipu-bench-"))
    broker = start_broker(BrokerSpec.scratch(work / "kafka"), work / "broker.log")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[*]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.jars", ",".join(str(jar) for jar in connector_jars()))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        broker.admin().ensure_topics({IN: PARTITIONS, OUT: PARTITIONS})
        print(
            f"detector bench: {args.messages:,} messages x 5 traces, grace {args.grace_ms} ms, {os.cpu_count()} CPUs",
            flush=True,
        )
        if args.only in (None, "throughput"):
            throughput(spark, broker.bootstrap_servers, work, args)
        if args.only in (None, "latency"):
            lost_latency(spark, broker.bootstrap_servers, work, args)
        if args.only in (None, "state"):
            state_per_message(spark, broker.bootstrap_servers, work, args)
        return 0
    finally:
        spark.stop()
        stop_process_group(broker.pid)


if __name__ == "__main__":
    sys.exit(main())
