"""Rescale the stopped detector's checkpoint to another bucket count, its messages in flight carried over.

    spark-submit --jars <.jvm/spark-kafka/*.jar> spark/rescale.py --buckets 64 [--checkpoint URL]
    python spark/rescale.py --buckets 64            # local[*], the jars added by itself

Stop the detector first (pause the khipu_detector DAG, then stop its driver). This reads the state of the
checkpoint's last committed batch with Spark's state data source, re-keys every message in flight by the new count,
writes it beside the old query checkpoint with where the trace topic is to be read from, and points the checkpoint
at the new folder; the next start of the detector (with the new count, or leaving it unset) takes over from there.
The old folder is kept until you remove it. Prints what was handed over as JSON. Steps and checks:
docs/detector.md, "Rescaling to another bucket count"; the code: khipu.detector.rescale.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from khipu.config import SparkSection, load
from khipu.detector.checkpoint import query_checkpoint
from khipu.detector.launch import check_deployment, connector_jars, driver_settings
from khipu.detector.rescale import rescale_detector
from khipu.errors import InvalidSetting
from khipu.settings import KhipuSettings
from khipu.storage.location import Location
from khipu.storage.spark import hadoop_settings


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    settings, spark_section = KhipuSettings.from_env(), load(SparkSection)
    parser = argparse.ArgumentParser(
        prog="rescale", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--buckets", type=int, required=True, help="the new bucket count")
    parser.add_argument(
        "--shuffle-partitions", type=int, default=None, help="the new checkpoint's (default: the old checkpoint's)"
    )
    parser.add_argument(
        "--checkpoint", default=settings.checkpoint_dir.url, help="the detector's checkpoint (folder or URL)"
    )
    parser.add_argument("--master", default=spark_section.master, help="when not launched by spark-submit")
    args = parser.parse_args(argv)
    try:
        checkpoint = Location.of(args.checkpoint, "--checkpoint")
    except InvalidSetting as exc:
        print(f"rescale: {exc}", file=sys.stderr)
        return 2
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("khipu-rescale")
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # started directly; under spark-submit master and jars are set
        builder = builder.master(args.master).config("spark.jars", ",".join(str(jar) for jar in connector_jars()))
        for key, value in {**driver_settings(args.master), **hadoop_settings(os.environ)}.items():
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        check_deployment(spark.sparkContext.master or "local", "", {"--checkpoint": checkpoint})
        handover = rescale_detector(spark, checkpoint, args.buckets, args.shuffle_partitions)
    except InvalidSetting as exc:
        print(f"rescale: {exc}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    print(json.dumps({"checkpoint": query_checkpoint(checkpoint).url, **json.loads(handover.to_json())}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
