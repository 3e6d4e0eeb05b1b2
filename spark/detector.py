"""Khipu's streaming detector: reads the trace topic, writes verdicts, metrics, the archive and a heartbeat.

    spark-submit spark/detector.py [options]      # or: python spark/detector.py (local[*])

Settings default to the Khipu environment (KHIPU_REGISTRY, KHIPU_BOOTSTRAP_SERVERS,
KHIPU_STORE_URL, KHIPU_STATE_DIR); see --help. Restarting resumes from the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

from khipu.detector.job import DetectorJob, start_detector
from khipu.detector.model import DetectorConfig
from khipu.settings import KhipuSettings


def parse_args(argv: list[str]) -> tuple[DetectorJob, str]:
    settings, defaults = KhipuSettings.from_env(), DetectorConfig()
    parser = argparse.ArgumentParser(
        prog="detector", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--registry", type=Path, default=settings.registry_path)
    parser.add_argument("--bootstrap-servers", default=settings.bootstrap_servers, help="the trace cluster")
    parser.add_argument("--trace-topic", default=settings.trace_topic)
    parser.add_argument("--lost-topic", default="khipu.lost", help="LOST verdicts go here too ('' for none)")
    parser.add_argument("--store-url", default=settings.store_url)
    parser.add_argument("--checkpoint", type=Path, default=settings.state_dir / "detector" / "checkpoint")
    parser.add_argument("--archive", type=Path, default=settings.state_dir / "archive")
    parser.add_argument(
        "--source",
        choices=("khipu_kafka", "kafka"),
        default="khipu_kafka",
        help="kafka: Spark's JVM connector, where the cluster has it",
    )
    parser.add_argument("--starting-offsets", default="earliest")
    parser.add_argument("--trigger-seconds", type=float, default=5.0)
    parser.add_argument("--max-offsets-per-trigger", type=int)
    parser.add_argument("--shuffle-partitions", type=int, default=4)
    parser.add_argument("--grace-ms", type=int, default=defaults.grace_ms)
    parser.add_argument("--max-wait-ms", type=int, default=defaults.max_wait_ms)
    parser.add_argument("--recheck-ms", type=int, default=defaults.recheck_ms)
    parser.add_argument(
        "--master",
        default=os.environ.get("KHIPU_SPARK_MASTER", "local[*]"),
        help="used when not launched by spark-submit",
    )
    args = parser.parse_args(argv)
    job = DetectorJob(
        registry_path=args.registry,
        bootstrap_servers=args.bootstrap_servers,
        store_url=args.store_url,
        checkpoint_dir=args.checkpoint,
        archive_dir=args.archive,
        trace_topic=args.trace_topic,
        lost_topic=args.lost_topic or None,
        source=args.source,
        starting_offsets=args.starting_offsets,
        trigger_seconds=args.trigger_seconds,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        shuffle_partitions=args.shuffle_partitions,
        detector=DetectorConfig(grace_ms=args.grace_ms, max_wait_ms=args.max_wait_ms, recheck_ms=args.recheck_ms),
    )
    return job, args.master


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one line per callback otherwise
    job, master = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    job.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    driver_file = job.checkpoint_dir / "driver.json"  # lets a supervisor on this host stop a hung detector
    driver_file.write_text(
        json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started_ms": time.time_ns() // 1_000_000})
    )
    builder = SparkSession.builder.appName("khipu-detector")
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # started directly; under spark-submit the master is set
        builder = builder.master(master)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    queries = start_detector(spark, job)
    signal.signal(signal.SIGTERM, lambda *_: [q.stop() for q in queries])
    logging.getLogger("khipu.detector").info("detector running: %s", ", ".join(q.name for q in queries))
    spark.streams.awaitAnyTermination()
    failed = [q for q in queries if q.exception() is not None]
    for query in failed:
        logging.getLogger("khipu.detector").error("query %s failed: %s", query.name, query.exception())
    spark.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
