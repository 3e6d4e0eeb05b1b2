"""Tracing overhead: untraced vs traced producer throughput, in one run, printed as ratios.

    .venv/bin/python bench/tracing_overhead.py [--messages 200000] [--rounds 3]

Starts its own embedded broker unless KHIPU_BOOTSTRAP_SERVERS is set. Every mode produces the
same small records as fast as the application can, with an application delivery callback, and
flushes; the figure is records acknowledged per second. Modes are interleaved over rounds and
the median is reported. Targets (not tests): traced/untraced >= 0.97 at 1 % sampling and >= 0.70
at 100 %.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from khipu.kafka import KafkaAdmin, KafkaConnection
from khipu.localstack.broker import BrokerSpec, start_broker
from khipu.localstack.processes import free_port, stop_process_group
from khipu.tracing import TracedProducer, TraceEmitter, TraceEmitterConfig

VALUE = b"x" * 100
PRODUCER_SETTINGS = {"linger.ms": 5, "batch.num.messages": 10000, "queue.buffering.max.messages": 1_000_000}


def warmed_up(producer: Producer, topic: str) -> Producer:
    """Connections, metadata and producer ids are set up once in an application's life: not timed."""
    for _ in range(2000):
        producer.produce(topic, value=VALUE)
    producer.flush(30)
    return producer


def produce_all(producer: Producer, topic: str, messages: int) -> tuple[float, float]:
    """(records acknowledged per second, CPU microseconds per record spent by this process, all threads)."""
    acknowledged = 0

    def on_delivery(err: Any, _msg: Any) -> None:
        nonlocal acknowledged
        if err is None:
            acknowledged += 1

    started, cpu_started = time.perf_counter(), time.process_time()
    for n in range(messages):
        while True:
            try:
                producer.produce(topic, value=VALUE, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.01)
        if n % 1000 == 0:
            producer.poll(0)
    producer.flush(120)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    if acknowledged != messages:
        raise RuntimeError(f"only {acknowledged} of {messages} records acknowledged")
    return messages / elapsed, cpu / messages * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    broker = None
    bootstrap = os.environ.get("KHIPU_BOOTSTRAP_SERVERS")
    if not bootstrap:
        scratch = Path(tempfile.mkdtemp())
        broker = start_broker(BrokerSpec.scratch(scratch / "kafka"), scratch / "broker.log")
        bootstrap = broker.bootstrap_servers
    try:
        topic, trace_topic = f"bench-{secrets.token_hex(3)}", f"bench-traces-{secrets.token_hex(3)}"
        KafkaAdmin(KafkaConnection(bootstrap)).ensure_topics({topic: 3, trace_topic: 3})
        emitter_config = TraceEmitterConfig(
            bootstrap_servers=bootstrap,
            location="bench",
            cluster="local",
            topic=trace_topic,
            queue_max_traces=1_000_000,
        )
        dead_config = TraceEmitterConfig(
            bootstrap_servers=f"127.0.0.1:{free_port()}",
            location="bench",
            cluster="local",
            queue_max_traces=10_000,
            close_timeout_s=0,
        )
        settings = {"bootstrap.servers": bootstrap, **PRODUCER_SETTINGS}

        def traced(percent: float, config: TraceEmitterConfig = emitter_config) -> Callable[[], tuple[float, float]]:
            def run() -> tuple[float, float]:
                emitter = TraceEmitter(config)
                try:
                    producer = TracedProducer(settings, emitter=emitter, stream="bench", sampling_percent=percent)
                    return produce_all(warmed_up(producer, topic), topic, args.messages)
                finally:
                    emitter.close()

            return run

        modes: dict[str, Callable[[], tuple[float, float]]] = {
            "untraced": lambda: produce_all(warmed_up(Producer(settings), topic), topic, args.messages),
            "traced 0%": traced(0),
            "traced 1%": traced(1),
            "traced 10%": traced(10),
            "traced 100%": traced(100),
            "traced 100%, trace channel down": traced(100, dead_config),
        }
        rates: dict[str, list[float]] = {name: [] for name in modes}
        cpu: dict[str, list[float]] = {name: [] for name in modes}
        for round_number in range(1, args.rounds + 1):
            for name, run in modes.items():
                rate, cpu_us = run()
                rates[name].append(rate)
                cpu[name].append(cpu_us)
                print(
                    f"round {round_number}: {name:32} {rate:>10,.0f} msg/s {cpu_us:6.2f} CPU us/msg",
                    file=sys.stderr,
                    flush=True,
                )

        baseline = statistics.median(rates["untraced"])
        baseline_cpu = statistics.median(cpu["untraced"])
        print(
            f"\ntracing overhead: {args.messages:,} records of {len(VALUE)} B, median of {args.rounds} rounds, "
            f"broker {bootstrap} ({os.cpu_count()} CPUs shared with the broker)"
        )
        print(f"{'mode':34} {'msg/s':>10} {'ratio':>7} {'app CPU us/msg':>15} {'CPU ratio':>10}  target (ratio)")
        targets = {"traced 1%": 0.97, "traced 100%": 0.70}
        for name in modes:
            rate, cpu_us = statistics.median(rates[name]), statistics.median(cpu[name])
            target = f">= {targets[name]:.2f}" if name in targets else ""
            print(
                f"{name:34} {rate:>10,.0f} {rate / baseline:>7.3f} {cpu_us:>15.2f} {baseline_cpu / cpu_us:>10.3f}"
                f"  {target}"
            )
        print(
            "CPU ratio: untraced CPU per record / this mode's CPU per record, for the producing process alone "
            "(the broker's work excluded)."
        )
        return 0
    finally:
        if broker is not None:
            stop_process_group(broker.pid)


if __name__ == "__main__":
    sys.exit(main())
