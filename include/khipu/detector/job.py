"""The detector job: its settings, the connections file it reads its secrets from, and its streaming queries.

Two queries read the trace topic with Spark's own Kafka source (``format("kafka")``, the
``spark-sql-kafka-0-10`` connector from ``.jvm/spark-kafka/``): ``khipu_verdicts`` (decode ->
stateful verdicts -> store, lost topic, metrics) and ``khipu_archive`` (decode -> Parquet archive,
quarantine, back-pointers, emitter sequences). Both keep their progress in their own checkpoint
under ``checkpoint_dir``.

Secrets (SASL passwords, the store's password) never travel on a command line: a supervisor
writes them to a connections file only its user can read (:func:`write_connections_file`) and
passes its path.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from khipu.detector.committed import (
    ClusterClients,
    CommittedOffsets,
    PointedPositions,
    RecordRemovals,
    StreamReadProgress,
)
from khipu.detector.model import ARCHIVE_QUERY, VERDICT_QUERY, DetectorConfig
from khipu.detector.outputs import ArchiveWriter, HeartbeatListener, VerdictWriter
from khipu.detector.parse import parse_traces, valid
from khipu.detector.processor import VERDICT_SCHEMA, VerdictProcessor
from khipu.errors import InvalidSetting
from khipu.kafka import KafkaConnection
from khipu.registry.loader import load_registry
from khipu.settings import project_root

__all__ = ["ARCHIVE_QUERY", "VERDICT_QUERY", "DetectorJob", "connector_jars", "start_detector"]
CONNECTOR_JARS = project_root() / ".jvm" / "spark-kafka"


class DetectorJobError(InvalidSetting):
    kind = "detector job setting"


def connector_jars(directory: Path = CONNECTOR_JARS) -> list[Path]:
    """The jars of Spark's Kafka connector and its dependencies, installed by `make install`."""
    jars = sorted(directory.glob("*.jar"))
    if not any(jar.name.startswith("spark-sql-kafka-0-10") for jar in jars):
        raise DetectorJobError(
            "connector jars", str(directory), "spark-sql-kafka-0-10 and its dependencies there; run `make install`"
        )
    return jars


@dataclass(frozen=True, slots=True)
class DetectorJob:
    registry_path: Path
    trace_connection: KafkaConnection  # the cluster of the trace topic and the lost topic
    store_url: str = field(repr=False)  # may hold a password
    checkpoint_dir: Path
    archive_dir: Path
    trace_topic: str = "khipu.traces"
    lost_topic: str | None = "khipu.lost"
    cluster_connections: Mapping[str, KafkaConnection] = field(default_factory=dict)  # per registry cluster
    starting_offsets: str = "earliest"
    trigger_seconds: float = 5.0
    max_offsets_per_trigger: int | None = None
    shuffle_partitions: int = 4
    detector: DetectorConfig = field(default_factory=DetectorConfig)

    def __post_init__(self) -> None:
        if not self.trigger_seconds > 0:
            raise DetectorJobError("trigger_seconds", self.trigger_seconds, "a number of seconds > 0")
        if self.max_offsets_per_trigger is not None and self.max_offsets_per_trigger < 1:
            raise DetectorJobError("max_offsets_per_trigger", self.max_offsets_per_trigger, "an integer >= 1, or none")

    @property
    def bootstrap_servers(self) -> str:
        return self.trace_connection.bootstrap_servers

    def connections_by_cluster(self, clusters: list[str]) -> dict[str, KafkaConnection]:
        """Each registry cluster's connection; a cluster without one is reached like the trace cluster
        when it is the trace cluster, and is otherwise an error naming the missing connection."""
        found = dict(self.cluster_connections)
        for name in clusters:
            if name not in found:
                if name != self.trace_connection.cluster:
                    raise DetectorJobError(
                        f"connection of cluster {name!r}",
                        None,
                        "one per registry cluster (clusters.<name>.connection_id)",
                    )
                found[name] = self.trace_connection
        return found


# -- the connections file: secrets for the driver, readable by its owner only --------------------------


def write_connections_file(
    path: Path, trace: KafkaConnection, clusters: Mapping[str, KafkaConnection], store_url: str
) -> Path:
    """Write the detector's connections (credentials included) to ``path``, mode 0600, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "trace": trace.to_json(),
        "clusters": {name: connection.to_json() for name, connection in sorted(clusters.items())},
        "store_url": store_url,
    }
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a left-over file keeps its old mode through O_CREAT
    with os.fdopen(fd, "w") as handle:
        json.dump(body, handle)
    os.replace(temporary, path)
    return path


def read_connections_file(path: Path) -> tuple[KafkaConnection, dict[str, KafkaConnection], str]:
    """(trace connection, connection per cluster, store URL); refuses a file others can read."""
    try:
        mode = path.stat().st_mode
        data: dict[str, Any] = json.loads(path.read_text())
    except OSError as exc:
        raise DetectorJobError("connections file", str(path), f"a readable file ({exc.strerror})") from None
    except ValueError:
        raise DetectorJobError("connections file", str(path), "JSON written by write_connections_file") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise DetectorJobError(
            "connections file", f"{path} (mode {stat.filemode(mode)})", "readable by its owner only (chmod 600)"
        )
    try:
        trace = KafkaConnection.from_json(data["trace"])
        clusters = {name: KafkaConnection.from_json(body) for name, body in dict(data.get("clusters", {})).items()}
        return trace, clusters, str(data["store_url"])
    except (KeyError, TypeError):
        raise DetectorJobError(
            "connections file", str(path), '{"trace": ..., "clusters": {...}, "store_url": ...}'
        ) from None


# -- the queries -----------------------------------------------------------------------------------------


def read_traces(spark: SparkSession, job: DetectorJob) -> DataFrame:
    """The trace topic as a stream of Spark's Kafka schema, through Spark's Kafka connector."""
    reader = (
        spark.readStream.format("kafka")
        .option("subscribe", job.trace_topic)
        .option("startingOffsets", job.starting_offsets)
        .option("failOnDataLoss", "false")
    )
    for key, value in job.trace_connection.spark_options().items():  # credentials stay in the driver
        reader = reader.option(key, value)
    if job.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(job.max_offsets_per_trigger))
    return reader.load()


def start_detector(spark: SparkSession, job: DetectorJob) -> list[StreamingQuery]:
    registry = load_registry(job.registry_path)
    spark.conf.set("spark.sql.shuffle.partitions", str(job.shuffle_partitions))
    spark.conf.set("spark.sql.session.timeZone", "UTC")  # the archive's hour partitions are UTC hours
    spark.conf.set(
        "spark.sql.streaming.stateStore.providerClass",
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    )
    spark.streams.addListener(HeartbeatListener(job.store_url))
    clients = ClusterClients(job.connections_by_cluster(sorted(registry.clusters)), job.store_url)
    committed = CommittedOffsets(clients)
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
                RecordRemovals(clients),
            ),
            outputStructType=VERDICT_SCHEMA,
            outputMode="Update",
            timeMode="ProcessingTime",
        )
    )
    verdict_query = (
        verdicts.writeStream.queryName(VERDICT_QUERY)
        .foreachBatch(VerdictWriter(job.store_url, job.lost_topic, job.trace_connection))
        .option("checkpointLocation", str(job.checkpoint_dir / VERDICT_QUERY))
        .trigger(**trigger)
        .start()
    )
    archive_query = (
        parse_traces(read_traces(spark, job), registry.streams)
        .writeStream.queryName(ARCHIVE_QUERY)
        .foreachBatch(
            ArchiveWriter(
                job.store_url, str(job.archive_dir), 2 * job.detector.max_wait_ms + 3_600_000, tuple(registry.streams)
            )
        )
        .option("checkpointLocation", str(job.checkpoint_dir / ARCHIVE_QUERY))
        .trigger(**trigger)
        .start()
    )
    return [verdict_query, archive_query]
