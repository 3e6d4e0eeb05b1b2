"""Khipu's streaming detector: reads the trace topic, writes verdicts, metrics, the archive and a heartbeat.

    spark-submit --jars <.jvm/spark-kafka/*.jar> spark/detector.py [options]
    python spark/detector.py [options]            # local[*], the connector jars added by itself

Connections come from a connections file (``--connections-file`` or ``KHIPU_CONNECTIONS_FILE``,
mode 0600: the trace cluster, every registry cluster, the store URL; written by the
``khipu_detector`` DAG from Airflow connections), or else from the Khipu environment
(KHIPU_BOOTSTRAP_SERVERS, KHIPU_CLUSTER, KHIPU_KAFKA_*, KHIPU_STORE_URL). No secret is ever an
argument. Restarting resumes from the checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
from pathlib import Path

from khipu.config import DetectorSection, SparkSection, load
from khipu.detector.driver import write_driver_record
from khipu.detector.job import (
    DEFAULT_BUCKETS,
    DEFAULT_MAX_OFFSETS_PER_TRIGGER,
    DetectorJob,
    start_detector,
)
from khipu.detector.launch import connector_jars, driver_settings, read_connections_file, throughput_settings
from khipu.detector.model import DetectorConfig, DetectorConfigError
from khipu.detector.sizing import DEFAULT_SHUFFLE_PARTITIONS
from khipu.errors import InvalidSetting
from khipu.settings import KhipuSettings
from khipu.storage.location import Location
from khipu.storage.spark import hadoop_settings


def parse_args(argv: list[str]) -> tuple[DetectorJob, str]:
    settings, defaults = KhipuSettings.from_env(), DetectorConfig.from_env()
    detector = load(DetectorSection, error=DetectorConfigError)
    spark = load(SparkSection)
    parser = argparse.ArgumentParser(
        prog="detector", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--registry", type=Path, default=settings.registry_path)
    parser.add_argument(
        "--connections-file",
        type=Path,
        default=spark.connections_file,
        help="owner-only JSON with the clusters' connections and the store URL (default $KHIPU_CONNECTIONS_FILE)",
    )
    parser.add_argument(
        "--bootstrap-servers", default=settings.bootstrap_servers, help="the trace cluster, without a connections file"
    )
    parser.add_argument("--trace-topic", default=settings.trace_topic)
    parser.add_argument("--lost-topic", default=settings.lost_topic, help="LOST verdicts go here too ('' for none)")
    parser.add_argument(
        "--checkpoint", default=settings.checkpoint_dir.url, help="a folder or object-store URL (s3a://bucket/prefix)"
    )
    parser.add_argument("--archive", default=settings.archive_dir.url, help="the raw-trace archive (folder or URL)")
    parser.add_argument(
        "--verdict-archive", default=settings.verdict_archive_dir.url, help="plain DELIVERED verdicts (folder or URL)"
    )
    parser.add_argument("--starting-offsets", default="earliest")
    parser.add_argument(
        "--trigger-seconds", type=float, default=detector.trigger_s, help="default $KHIPU_DETECTOR_TRIGGER_S"
    )
    parser.add_argument(
        "--max-offsets-per-trigger",
        type=int,
        default=DEFAULT_MAX_OFFSETS_PER_TRIGGER,
        help="bounds a batch, so a backlog is worked off in batches that each report (0: no bound)",
    )
    parser.add_argument(
        "--shuffle-partitions",
        type=int,
        default=DEFAULT_SHUFFLE_PARTITIONS,
        help="partitions of the one shuffle by bucket (fixed for a checkpoint: Spark keeps it in the offset log)",
    )
    parser.add_argument(
        "--buckets",
        type=int,
        default=DEFAULT_BUCKETS,
        help="hash buckets of message ids the state is kept in (fixed for a checkpoint)",
    )
    parser.add_argument("--grace-ms", type=int, default=defaults.grace_ms)
    parser.add_argument("--max-wait-ms", type=int, default=defaults.max_wait_ms)
    parser.add_argument("--recheck-ms", type=int, default=defaults.recheck_ms)
    parser.add_argument(
        "--open-transaction-wait-ms",
        type=int,
        default=defaults.open_transaction_wait_ms,
        help="how much longer than --max-wait-ms a hop waits on a transaction Kafka has not decided",
    )
    parser.add_argument(
        "--master",
        default=spark.master,
        help="used when not launched by spark-submit",
    )
    args = parser.parse_args(argv)
    if args.connections_file:
        trace, clusters, store_url = read_connections_file(args.connections_file)
    else:
        trace = dataclasses.replace(settings, bootstrap_servers=args.bootstrap_servers).kafka()
        clusters, store_url = {}, settings.store_url
    job = DetectorJob(
        registry_path=args.registry,
        trace_connection=trace,
        store_url=store_url,
        checkpoint_dir=Location.of(args.checkpoint, "--checkpoint"),
        archive_dir=Location.of(args.archive, "--archive"),
        verdicts_dir=Location.of(args.verdict_archive, "--verdict-archive"),
        trace_topic=args.trace_topic,
        lost_topic=args.lost_topic or None,
        cluster_connections=clusters,
        starting_offsets=args.starting_offsets,
        trigger_seconds=args.trigger_seconds,
        max_offsets_per_trigger=args.max_offsets_per_trigger or None,
        shuffle_partitions=args.shuffle_partitions,
        buckets=args.buckets,
        detector=DetectorConfig(
            grace_ms=args.grace_ms,
            max_wait_ms=args.max_wait_ms,
            recheck_ms=args.recheck_ms,
            open_transaction_wait_ms=args.open_transaction_wait_ms,
        ),
    )
    return job, args.master


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one line per callback otherwise
    try:
        job, master = parse_args(sys.argv[1:] if argv is None else argv)
    except InvalidSetting as exc:
        print(f"detector: {exc}", file=sys.stderr)
        return 2
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("khipu-detector")
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # started directly; under spark-submit master and jars are set
        builder = builder.master(master).config("spark.jars", ",".join(str(jar) for jar in connector_jars()))
        started = {**driver_settings(master), **throughput_settings(master), **hadoop_settings(os.environ)}
        for key, value in started.items():
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        queries = start_detector(spark, job)
    except InvalidSetting as exc:
        print(f"detector: {exc}", file=sys.stderr)
        spark.stop()
        return 2
    signal.signal(signal.SIGTERM, lambda *_: [q.stop() for q in queries])
    write_driver_record(job.checkpoint_dir)  # up: a supervisor on this host tells a hung detector from a dead one
    logging.getLogger("khipu.detector").info("detector running: %s", ", ".join(q.name for q in queries))
    spark.streams.awaitAnyTermination()
    failed = [q for q in queries if q.exception() is not None]
    for query in failed:
        logging.getLogger("khipu.detector").error("query %s failed: %s", query.name, query.exception())
    spark.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
