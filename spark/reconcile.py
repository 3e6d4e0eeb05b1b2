"""Khipu's reconciliation batch: re-decide a window's messages that are not final, with all their traces.

    spark-submit spark/reconcile.py --start 2026-11-23T10:00:00Z --end 2026-11-23T11:00:00Z [options]
    python spark/reconcile.py --start ... --end ...        # local[*]

Reads the trace archive (Parquet by hour) for the window plus the horizon, the stored verdicts (the
SQL store's, and the plain DELIVERED ones of the verdict archive, ``--verdict-archive``) and the offset
snapshots; stores final verdicts (CONFIRMED_LOST, RETRACTED, ...) with their history, unless
``--dry-run``. Writes a JSON summary to ``--summary-file`` (what the Airflow task returns).
Connections come from a connections file (``--connections-file``, mode 0600, written by the DAG
from Airflow connections) or the Khipu environment; no secret is ever an argument.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from khipu.config import SparkSection, load
from khipu.detector.committed import ClusterClients, cluster_lookups
from khipu.detector.launch import check_deployment, connector_jars, driver_settings, read_connections_file
from khipu.detector.model import DetectorConfig
from khipu.errors import InvalidSetting
from khipu.reconcile.run import SPARK_SETTINGS, kafka_record_namer, reconcile
from khipu.reconcile.window import ReconcileError, ReconcileWindow, horizon_from_env, parse_time
from khipu.registry.loader import load_registry
from khipu.settings import KhipuSettings
from khipu.storage.location import Location
from khipu.storage.spark import hadoop_settings
from khipu.store import Store
from khipu.verdicts.book import VerdictBook


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings, spark = KhipuSettings.from_env(), load(SparkSection)
    parser = argparse.ArgumentParser(
        prog="reconcile", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--start", required=True, help="window start (ISO time or ms)")
    parser.add_argument("--end", required=True, help="window end, exclusive (ISO time or ms)")
    parser.add_argument("--horizon-ms", type=int, default=None, help="default $KHIPU_RECONCILE_HORIZON_MS or 2 h")
    parser.add_argument("--streams", default="", help="comma-separated stream names (default: every stream)")
    parser.add_argument("--dry-run", action="store_true", help="say what would change, write nothing")
    parser.add_argument("--registry", type=Path, default=settings.registry_path)
    parser.add_argument("--archive", default=settings.archive_dir.url, help="the raw-trace archive (folder or URL)")
    parser.add_argument(
        "--verdict-archive",
        default=settings.verdict_archive_dir.url,
        help="the verdict archive (plain DELIVERED verdicts by hour; folder or URL)",
    )
    parser.add_argument(
        "--work",
        default=(settings.data / "reconcile").url,
        help="where the run writes what its executors read (folder or URL every executor reaches)",
    )
    parser.add_argument("--connections-file", type=Path, default=spark.connections_file)
    parser.add_argument("--summary-file", type=Path, default=None)
    parser.add_argument(
        "--master", default=spark.master, help="when not launched by spark-submit (default $KHIPU_SPARK_MASTER)"
    )
    args = parser.parse_args(argv)
    try:
        horizon = horizon_from_env() if args.horizon_ms is None else args.horizon_ms
        streams = tuple(s for s in args.streams.split(",") if s)
        window = ReconcileWindow(parse_time(args.start), parse_time(args.end), horizon, streams)
        archive = Location.of(args.archive, "--archive")
        verdict_archive = Location.of(args.verdict_archive, "--verdict-archive")
        work = Location.of(args.work, "--work")
        registry = load_registry(args.registry)
        unknown = sorted(set(streams) - set(registry.streams))
        if unknown:
            raise ReconcileError("streams", ",".join(unknown), f"streams of the registry: {sorted(registry.streams)}")
        if args.connections_file:
            trace, clusters, store_url = read_connections_file(args.connections_file)
        else:
            trace, clusters, store_url = settings.kafka(), {}, settings.store_url
    except InvalidSetting as exc:
        print(f"reconcile: {exc}", file=sys.stderr)
        return 2
    connections = {trace.cluster: trace, **clusters}

    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("khipu-reconcile")
    settings_now = dict(SPARK_SETTINGS)
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # started directly; under spark-submit the submitter's master wins
        builder = builder.master(args.master).config("spark.jars", ",".join(str(jar) for jar in connector_jars()))
        settings_now |= driver_settings(args.master) | hadoop_settings(os.environ)
    for key, value in settings_now.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        check_deployment(
            spark.sparkContext.master,
            store_url,
            {"--archive": archive, "--verdict-archive": verdict_archive, "--work": work},
        )
    except InvalidSetting as exc:
        print(f"reconcile: {exc}", file=sys.stderr)
        spark.stop()
        return 2
    store = Store(store_url)
    try:
        clients = ClusterClients(connections, store_url)
        lookups = cluster_lookups(clients, store_url)
        report = reconcile(
            spark,
            archive,
            window,
            registry,
            VerdictBook(store.verdicts),
            lookups,
            DetectorConfig.from_env(),
            time.time_ns() // 1_000_000,
            dry_run=args.dry_run,
            name_record=kafka_record_namer(connections),
            progress=lambda line: print(f"reconcile: {line}", flush=True),
            verdict_archive_dir=verdict_archive,
            work_dir=work,
        )
        summary = report.summary()
        if args.summary_file:
            args.summary_file.write_text(json.dumps(summary, indent=2))
        print(json.dumps(summary, indent=2))
        return 0
    finally:
        store.close()
        spark.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
