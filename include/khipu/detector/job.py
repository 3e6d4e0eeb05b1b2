"""The detector job: its settings, and the streaming queries it runs.

Two queries read the trace topic: ``khipu_verdicts`` (parse -> stateful verdicts -> store, lost
topic, metrics) and ``khipu_archive`` (parse -> Parquet archive, quarantine). Both keep their
progress in their own checkpoint under ``checkpoint_dir``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from khipu.detector.committed import CommittedOffsets, PointedPositions, StreamReadProgress
from khipu.detector.model import DetectorConfig
from khipu.detector.outputs import ArchiveWriter, HeartbeatListener, VerdictWriter
from khipu.detector.parse import parse_traces, valid
from khipu.detector.processor import VERDICT_SCHEMA, VerdictProcessor
from khipu.errors import InvalidSetting
from khipu.registry.loader import load_registry
from khipu.spark.kafka_source import KafkaStreamDataSource

VERDICT_QUERY, ARCHIVE_QUERY = "khipu_verdicts", "khipu_archive"


class DetectorJobError(InvalidSetting):
    kind = "detector job setting"


@dataclass(frozen=True, slots=True)
class DetectorJob:
    registry_path: Path
    bootstrap_servers: str  # the trace cluster
    store_url: str
    checkpoint_dir: Path
    archive_dir: Path
    trace_topic: str = "khipu.traces"
    lost_topic: str | None = "khipu.lost"
    source: str = "khipu_kafka"  # or "kafka" where Spark's JVM connector is installed
    starting_offsets: str = "earliest"
    trigger_seconds: float = 5.0
    max_offsets_per_trigger: int | None = None
    shuffle_partitions: int = 4
    cluster_clients: dict[str, dict[str, Any]] = field(default_factory=dict)  # for committed offsets
    client_config: dict[str, str] = field(default_factory=dict, repr=False)  # security settings, never logged
    detector: DetectorConfig = field(default_factory=DetectorConfig)

    def __post_init__(self) -> None:
        if self.source not in ("khipu_kafka", "kafka"):
            raise DetectorJobError("source", self.source, "khipu_kafka or kafka")
        if not self.trigger_seconds > 0:
            raise DetectorJobError("trigger_seconds", self.trigger_seconds, "a number of seconds > 0")


def read_traces(spark: SparkSession, job: DetectorJob) -> DataFrame:
    """The trace topic as a stream of Spark's Kafka schema, from either source."""
    if job.source == "khipu_kafka":
        spark.dataSource.register(KafkaStreamDataSource)
    reader = (
        spark.readStream.format(job.source)
        .option("kafka.bootstrap.servers", job.bootstrap_servers)
        .option("subscribe", job.trace_topic)
        .option("startingOffsets", job.starting_offsets)
        .option("failOnDataLoss", "false")
    )
    for key, value in job.client_config.items():
        reader = reader.option(f"kafka.{key}", value)
    if job.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(job.max_offsets_per_trigger))
    return reader.load()


def start_detector(spark: SparkSession, job: DetectorJob) -> list[StreamingQuery]:
    registry = load_registry(job.registry_path)
    spark.conf.set("spark.sql.shuffle.partitions", str(job.shuffle_partitions))
    spark.conf.set(
        "spark.sql.streaming.stateStore.providerClass",
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    )
    spark.streams.addListener(HeartbeatListener(job.store_url))
    clients = job.cluster_clients or {
        name: {"bootstrap.servers": job.bootstrap_servers, **job.client_config} for name in registry.clusters
    }
    committed = CommittedOffsets(clients, job.store_url)
    trigger = {"processingTime": f"{job.trigger_seconds} seconds"}

    verdicts = (
        valid(parse_traces(read_traces(spark, job), registry.streams))
        .groupBy("message_id")
        .transformWithState(
            statefulProcessor=VerdictProcessor(
                registry,
                committed,
                job.detector,
                PointedPositions(job.store_url),
                StreamReadProgress(job.store_url, (VERDICT_QUERY, ARCHIVE_QUERY)),
            ),
            outputStructType=VERDICT_SCHEMA,
            outputMode="Update",
            timeMode="ProcessingTime",
        )
    )
    verdict_query = (
        verdicts.writeStream.queryName(VERDICT_QUERY)
        .foreachBatch(
            VerdictWriter(
                job.store_url, job.lost_topic, {"bootstrap.servers": job.bootstrap_servers, **job.client_config}
            )
        )
        .option("checkpointLocation", str(job.checkpoint_dir / VERDICT_QUERY))
        .trigger(**trigger)
        .start()
    )
    archive_query = (
        parse_traces(read_traces(spark, job), registry.streams)
        .writeStream.queryName(ARCHIVE_QUERY)
        .foreachBatch(ArchiveWriter(job.store_url, str(job.archive_dir), 2 * job.detector.max_wait_ms + 3_600_000))
        .option("checkpointLocation", str(job.checkpoint_dir / ARCHIVE_QUERY))
        .trigger(**trigger)
        .start()
    )
    return [verdict_query, archive_query]
