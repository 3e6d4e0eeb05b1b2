"""Tracing overhead: untraced against traced, producer and consumer, Python and Java, printed next to the targets.

    .venv/bin/python bench/tracing_overhead.py [--messages 200000] [--rounds 3] [--skip-java]

Starts its own broker unless KHIPU_BOOTSTRAP_SERVERS is set. Two workloads:

- **tight**: the application does nothing but produce (or consume) 100-byte records, as fast as it can (5x the
  ``--messages``: a run of 200,000 lasted 0.1-0.2 s, too short to time steadily);
- **app**: an application that builds and serializes a ~1 KB JSON record per message (json.dumps) before producing
  it, or parses each record it consumes (json.loads).

Every loop, in both languages, is measured the same way:

- **warm-up**, untimed: the first ``min(20,000, a tenth of the messages)`` records produced (or read) and, traced, their
  traces delivered (connections, metadata, producer ids and the JIT's first compilations are set up once in an
  application's life);
- **the clock** runs from the first timed produce (or poll) until the client is closed: every record acknowledged (or
  read), and, traced, every trace the loop made delivered by the emitter (Python: the client closed, then its
  emitter; Java: the client closed, whose interceptor closes its emitter, its batch no longer lingering). The
  emitter's work is inside the clock, and so is its last batch's wait.

Producer figures: records acknowledged per second, with an application delivery callback on every record. Consumer
figures: records returned by poll per second, reading a topic filled beforehand (by a traced producer at the mode's
sampling rate, so the same share of its records carry trace headers; "untraced" reads the 0 % topic with a plain
consumer). CPU per message is the CPU the whole process spent (every thread: the client's, the trace emitter's) over
the clock, divided by the messages. Modes are interleaved over rounds; the median is printed. "+us per traced
message" is (CPU at 100 % - CPU untraced): what tracing adds for each message it traces.

The Java loops (jvm/testapps BenchApp, built by ``make test-jvm-apps`` or ``make bench``) run the same tight workload
through kafka-clients 4.4 with and without Khipu's interceptors, 5x the messages (one JVM per run: its JIT compiler's
work is in the figure, amortized), measured the same way (the JVM's process CPU, every thread). Targets (issue 19),
each printed with "met" or "NOT met" beside its figure (a figure without one says "(no target)"): added CPU at most
5 us per traced message; at 1 % sampling at least 0.97 of untraced throughput for the app workload and 0.90 for the
tight loop; the consumer within the same bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from figures import NO_TARGET, against
from khipu.kafka import KafkaAdmin, KafkaConnection
from khipu.localstack.broker import BrokerSpec, start_broker
from khipu.localstack.processes import stop_process_group
from khipu.settings import project_root
from khipu.tracing import TracedConsumer, TracedProducer, TraceEmitter, TraceEmitterConfig

TIGHT_VALUE = b"x" * 100
PERCENTS = (0.0, 1.0, 10.0, 100.0)
MODES = ("untraced", *(f"traced {p:g}%" for p in PERCENTS))
PRODUCER_SETTINGS = {"linger.ms": 5, "batch.num.messages": 10000, "queue.buffering.max.messages": 1_000_000}
TARGET_RATIO_AT_1 = {"tight": 0.90, "app": 0.97}
TARGET_ADDED_US = 5.0
TIGHT_TIMES = 5  # the tight loops run 5x the messages: at 1-2 million a second, 200,000 took 0.1-0.2 s, too short to
# time steadily (the untraced consumer's CPU per message ranged 0.45-0.65 between rounds); the Java loops too: its JIT
# compiler compiles the traced path early in a run, not at its end
JVM = project_root() / ".jvm"
WARMUP_RECORDS = 20_000  # at most: a tenth of a short run's messages


def warmup_records(messages: int) -> int:
    """Records produced (or read) before the clock starts, the same in every loop of both languages."""
    return min(WARMUP_RECORDS, messages // 10)


Figure = tuple[float, float]  # (messages per second, CPU microseconds per message)


def app_record(n: int) -> bytes:
    """What the application workload serializes per message: a ~1 KB JSON order."""
    return json.dumps(
        {
            "order_id": n,
            "customer": {"id": n % 9973, "name": "Customer " + str(n % 9973), "tier": "gold" if n % 7 == 0 else "std"},
            "lines": [{"sku": f"SKU-{(n + i) % 5000:05d}", "qty": i + 1, "price": 9.99 + i} for i in range(12)],
            "currency": "EUR",
            "note": "x" * 64,
        }
    ).encode()


def timed(loop: Callable[[], int]) -> Figure:
    started, cpu_started = time.perf_counter(), time.process_time()
    messages = loop()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return messages / elapsed, cpu / messages * 1e6


def close(client: Producer | Consumer, emitter: TraceEmitter | None) -> None:
    """The end of a timed loop: the client closed, then its emitter (every trace it was given delivered)."""
    client.close()
    if emitter is not None:
        emitter.close()


def produce_loop(producer: Producer, emitter: TraceEmitter | None, topic: str, messages: int, workload: str) -> Figure:
    """Produce ``messages`` records; the clock runs from the first timed produce until the producer and its emitter
    are closed (every record acknowledged, every trace delivered)."""
    for _ in range(warmup_records(messages)):  # untimed: connections, metadata, producer ids
        while True:
            try:
                producer.produce(topic, value=TIGHT_VALUE)
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(30)  # a traced producer flushes its emitter too: the warm-up's traces are delivered
    acknowledged = 0

    def on_delivery(err: Any, _msg: Any) -> None:
        nonlocal acknowledged
        if err is None:
            acknowledged += 1

    def loop() -> int:
        for n in range(messages):
            value = TIGHT_VALUE if workload == "tight" else app_record(n)
            while True:
                try:
                    producer.produce(topic, value=value, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.01)
            if n % 1000 == 0:
                producer.poll(0)
        producer.flush(120)
        close(producer, emitter)
        return messages

    figure = timed(loop)
    if acknowledged != messages:
        raise RuntimeError(f"only {acknowledged} of {messages} records acknowledged")
    return figure


def consume_loop(
    consumer: Consumer, emitter: TraceEmitter | None, topic: str, partitions: int, messages: int, workload: str
) -> Figure:
    """Read ``messages`` records; the clock starts once the warm-up's records were read (and, traced, their traces
    delivered), and runs until the consumer and its emitter are closed; it counts the records read after the
    warm-up."""
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    deadline = time.monotonic() + 120
    warm = 0
    while warm < max(1, warmup_records(messages)):  # untimed: joining, metadata, the first fetches
        warm += sum(1 for m in consumer.consume(1000, 0.5) if m.error() is None)
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {warm} records read from {topic} in 120 s")
    if emitter is not None:
        emitter.flush(30)
    wanted = messages - warm

    def loop() -> int:
        received = 0
        while received < wanted:
            for msg in consumer.consume(1000, 0.5):
                if msg.error() is None:
                    if workload == "app":
                        json.loads(msg.value())
                    received += 1
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {received} of {wanted} records in 120 s")
        close(consumer, emitter)
        return received

    return timed(loop)


class Bench:
    def __init__(self, bootstrap: str, messages: int, scratch: Path) -> None:
        self.bootstrap = bootstrap
        self.messages = messages
        self.scratch = scratch
        self.run = secrets.token_hex(3)
        self.admin = KafkaAdmin(KafkaConnection(bootstrap))
        self.topic = f"bench-{self.run}"
        self.trace_topic = f"bench-traces-{self.run}"
        self.admin.ensure_topics({self.topic: 3})
        self.admin.ensure_trace_topic(self.trace_topic, 3)
        self.filled: dict[
            tuple[str, float, int], str
        ] = {}  # (workload, percent) -> a topic of that many traced records

    def emitter(self, location: str) -> TraceEmitter:
        return TraceEmitter(
            TraceEmitterConfig(self.bootstrap, location, "local", self.trace_topic, queue_max_traces=1_000_000)
        )

    def settings(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, **PRODUCER_SETTINGS}

    def python_producer(self, workload: str, mode: str) -> Figure:
        count = self.messages * TIGHT_TIMES if workload == "tight" else self.messages // 2
        if mode == "untraced":
            return produce_loop(Producer(self.settings()), None, self.topic, count, workload)
        emitter = self.emitter("bench-producer")
        try:
            producer = TracedProducer(self.settings(), emitter=emitter, stream="bench", sampling_percent=percent(mode))
            return produce_loop(producer, emitter, self.topic, count, workload)
        finally:
            emitter.close()  # closed in the loop already; here only if the loop failed

    def fill(self, workload: str, sampling: float, messages: int | None = None) -> str:
        """A topic of ``messages`` records (default: the bench's count) written by a traced producer at ``sampling``
        (the consumer's input)."""
        messages = messages or self.messages
        key = (workload, sampling, messages)
        if key not in self.filled:
            topic = f"bench-{workload}-{sampling:g}-{messages}-{self.run}"
            self.admin.ensure_topics({topic: 3})
            emitter = self.emitter("bench-filler")
            try:
                producer = TracedProducer(self.settings(), emitter=emitter, stream="bench", sampling_percent=sampling)
                for n in range(messages):
                    value = TIGHT_VALUE if workload == "tight" else app_record(n)
                    while True:
                        try:
                            producer.produce(topic, value=value)
                            break
                        except BufferError:
                            producer.poll(0.01)
                producer.flush(120)
            finally:
                emitter.close()
            self.filled[key] = topic
        return self.filled[key]

    def consumer_settings(self) -> dict[str, Any]:
        """With librdkafka's fetch pacing at 10 ms (fetch.queue.backoff.ms: how long a consumer whose local queue
        passed queued.min.messages waits before it fetches again). Its default, 1 s, made whole runs 20x slower in
        wall time at the same CPU, untraced or traced alike, at random: a fast reader empties the queue and waits.
        At 0 the fetcher thread spins while the queue is full, for as long as the reader is slower than the broker:
        that charged a traced reader 1.3 us per message of spinning (perf: 41 % of the process's samples in
        librdkafka's broker thread), and an untraced one, ten times faster, almost none."""
        return {"bootstrap.servers": self.bootstrap, "group.id": f"bench-{secrets.token_hex(4)}",
                "enable.auto.commit": False, "auto.offset.reset": "earliest", "fetch.queue.backoff.ms": 10}  # fmt: skip

    def python_consumer(self, workload: str, mode: str) -> Figure:
        count = self.messages * TIGHT_TIMES if workload == "tight" else self.messages
        topic = self.fill(workload, 0.0 if mode == "untraced" else percent(mode), count)
        if mode == "untraced":
            return consume_loop(Consumer(self.consumer_settings()), None, topic, 3, count, workload)
        emitter = self.emitter("bench-consumer")
        try:
            return consume_loop(TracedConsumer(self.consumer_settings(), emitter=emitter), emitter, topic, 3, count,
                                workload)  # fmt: skip
        finally:
            emitter.close()  # closed in the loop already; here only if the loop failed

    def java(self, side: str, mode: str) -> Figure:
        settings: dict[str, Any] = {"bootstrap.servers": self.bootstrap}
        if side == "producer":
            settings.update({"linger.ms": 5, "batch.size": 262144, "buffer.memory": 268435456})
        if mode != "untraced":
            interceptor = "Producer" if side == "producer" else "Consumer"
            settings.update({
                "interceptor.classes": f"io.khipu.tracing.Khipu{interceptor}Interceptor",
                "khipu.location": f"bench-java-{side}", "khipu.trace.topic": self.trace_topic,
                "khipu.queue.max.traces": 1_000_000,
            })  # fmt: skip
            if side == "producer":
                settings.update({"khipu.stream": "bench", "khipu.sampling.percent": percent(mode)})
        if side == "consumer":  # as the Python consumer: no commits (Java's default commits at close)
            settings.update({"group.id": f"bench-java-{secrets.token_hex(4)}", "enable.auto.commit": "false"})
        count = self.messages * TIGHT_TIMES
        warmup = str(warmup_records(count))
        props = self.scratch / f"java-{side}.properties"
        props.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        if side == "producer":
            args = ["bench-produce", str(props), self.topic, str(count), str(len(TIGHT_VALUE)), warmup]
        else:
            topic = self.fill("tight", 0.0 if mode == "untraced" else percent(mode), count)
            args = ["bench-consume", str(props), topic, str(count), warmup]
        classpath = os.pathsep.join([str(JVM / "testapps" / "*"), str(JVM / "tracing" / "khipu-tracing.jar")])
        done = subprocess.run(
            ["java", "-Xmx1g", "-cp", classpath, "io.khipu.testapps.Apps", *args],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"the Java {side} loop failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        return figures["messages"] / figures["seconds"], figures["cpu_ns"] / figures["messages"] / 1000


def percent(mode: str) -> float:
    return float(mode.removeprefix("traced ").removesuffix("%"))


def table(title: str, figures: dict[str, list[Figure]], target_ratio: float | None) -> list[str]:
    rate0 = statistics.median(r for r, _ in figures["untraced"])
    cpu0 = statistics.median(c for _, c in figures["untraced"])
    lines = [
        f"\n{title}",
        "| mode | msg/s | ratio to untraced | CPU us per message | target |",
        "|---|---|---|---|---|",
    ]
    for mode in MODES:
        rate, cpu = statistics.median(r for r, _ in figures[mode]), statistics.median(c for _, c in figures[mode])
        extra, target = "", NO_TARGET
        if mode == "traced 1%" and target_ratio is not None:
            target = against(f"ratio >= {target_ratio:.2f}", rate / rate0 >= target_ratio)
        if mode == "traced 100%":
            added = cpu - cpu0
            extra = f" (+{added:.2f} us per traced message)"
            target = against(f"+<= {TARGET_ADDED_US:g} us", added <= TARGET_ADDED_US)
        lines.append(f"| {mode} | {rate:,.0f} | {rate / rate0:.3f} | {cpu:.2f}{extra} | {target} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-java", action="store_true", help="leave out the Java loops")
    args = parser.parse_args()
    java = not args.skip_java
    if java and not (JVM / "testapps" / "khipu-testapps.jar").exists():
        print("the Java loops need .jvm/testapps (make bench builds it); run with --skip-java to leave them out")
        return 2

    broker = None
    scratch = Path(tempfile.mkdtemp())
    bootstrap = os.environ.get("KHIPU_BOOTSTRAP_SERVERS")
    if not bootstrap:
        broker = start_broker(BrokerSpec.scratch(scratch / "kafka"), scratch / "broker.log")
        bootstrap = broker.bootstrap_servers
    try:
        bench = Bench(bootstrap, args.messages, scratch)
        runs: dict[str, Callable[[str], Figure]] = {
            "Python producer, tight loop": lambda mode: bench.python_producer("tight", mode),
            "Python producer, application workload": lambda mode: bench.python_producer("app", mode),
            "Python consumer, tight loop": lambda mode: bench.python_consumer("tight", mode),
            "Python consumer, application workload": lambda mode: bench.python_consumer("app", mode),
        }
        if java:
            runs["Java producer (kafka-clients 4.4), tight loop"] = lambda mode: bench.java("producer", mode)
            runs["Java consumer (kafka-clients 4.4), tight loop"] = lambda mode: bench.java("consumer", mode)
        figures: dict[str, dict[str, list[Figure]]] = {name: {mode: [] for mode in MODES} for name in runs}
        for round_number in range(1, args.rounds + 1):
            for name, run in runs.items():
                for mode in MODES:
                    rate, cpu = run(mode)
                    figures[name][mode].append((rate, cpu))
                    print(f"round {round_number}: {name:46} {mode:12} {rate:>10,.0f} msg/s {cpu:7.2f} CPU us/msg",
                          file=sys.stderr, flush=True)  # fmt: skip
        print(
            f"\ntracing overhead: {args.messages * TIGHT_TIMES:,} messages per mode in the tight loops, "
            f"{args.messages:,} in the application workload's consumer and {args.messages // 2:,} in its producer, "
            f"median of {args.rounds} rounds, broker {bootstrap} ({os.cpu_count()} CPUs shared with the broker); "
            f"each loop's first min({WARMUP_RECORDS:,}, a tenth) records untimed: a producer's on top of these, a "
            "consumer's out of them"
        )
        for name in runs:
            workload = "app" if "application" in name else "tight"
            for line in table(name, figures[name], TARGET_RATIO_AT_1[workload]):
                print(line)
        return 0
    finally:
        if broker is not None:
            stop_process_group(broker.pid)
        shutil.rmtree(scratch, ignore_errors=True)  # a run writes gigabytes: the broker's log, and the trace topic


if __name__ == "__main__":
    sys.exit(main())
