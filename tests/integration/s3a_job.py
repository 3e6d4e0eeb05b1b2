"""A Spark driver on the object store, for tests/integration/test_object_store.py: run in a process of its own, so
that its JVM starts with the store's environment (S3A reads the credentials from it, as a Khipu job does), and
configured only by ``khipu.storage.spark.hadoop_settings``.

    python s3a_job.py write-read s3a://bucket/prefix ROWS
        Spark writes ids 0..ROWS-1 (with ``key = id % 7``) as Parquet there, reads them back.
    python s3a_job.py stream s3a://bucket/in s3a://bucket/checkpoint
        A Structured Streaming query on the JSON files under ``in`` (one file a micro-batch), its checkpoint on the
        store, run until it has read every file there, then stopped; each batch's id and ids as foreachBatch saw them.

The last line printed is a JSON object: what the job saw, the Spark settings it ran with, and the command lines of
its process tree (the test checks that no secret is in either).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import psutil

from khipu.detector.launch import connector_jars
from khipu.storage.spark import hadoop_settings


def _command_line(process: psutil.Process) -> str | None:
    """A process's command line; None for one that ended (or is a zombie) while the tree was read."""
    try:
        return " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def session() -> Any:
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("khipu-s3a-test")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.jars", ",".join(str(jar) for jar in connector_jars()))
    )
    for key, value in hadoop_settings(os.environ).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def write_read(spark: Any, url: str, rows: int) -> dict[str, Any]:
    spark.range(0, rows, numPartitions=3).selectExpr("id", "id % 7 AS key").write.mode("overwrite").parquet(url)
    back = spark.read.parquet(url)
    return {"ids": sorted(row.id for row in back.select("id").collect()), "keys": back.select("key").distinct().count()}


def stream(spark: Any, source: str, checkpoint: str) -> dict[str, Any]:
    batches: list[dict[str, Any]] = []

    def record(frame: Any, batch_id: int) -> None:
        batches.append({"batch_id": batch_id, "ids": sorted(row.id for row in frame.select("id").collect())})

    query = (
        spark.readStream.schema("id LONG")
        .option("maxFilesPerTrigger", 1)
        .json(source)
        .writeStream.foreachBatch(record)
        .option("checkpointLocation", checkpoint)
        .start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    return {"batches": batches}


def main(argv: list[str]) -> None:
    spark = session()
    try:
        if argv[0] == "write-read":
            seen = write_read(spark, argv[1], int(argv[2]))
        elif argv[0] == "stream":
            seen = stream(spark, argv[1], argv[2])
        else:
            raise SystemExit(f"unknown mode {argv[0]!r}; expected write-read or stream")
        me = psutil.Process()
        tree = [me, *me.children(recursive=True), *me.parents()]
        seen["settings"] = dict(spark.sparkContext.getConf().getAll())
        seen["command_lines"] = [line for line in (_command_line(process) for process in tree) if line is not None]
    finally:
        spark.stop()
    print(json.dumps(seen))


if __name__ == "__main__":
    main(sys.argv[1:])
