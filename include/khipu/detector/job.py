"""The detector job: its settings and its streaming query.

One query, ``khipu_detector``, reads the trace topic once with Spark's own Kafka source (``format("kafka")``, the
``spark-sql-kafka-0-10`` connector from ``.jvm/spark-kafka/``), decodes it once in Python
(:mod:`khipu.detector.parse`), packs every record by a hash bucket of message ids (:mod:`khipu.detector.packed`)
and shuffles them once. From that one shuffle the stateful processor (:mod:`khipu.detector.processor`) reads its
buckets' records, and the records themselves go beside it (:func:`judged_and_records`); both are written per
micro-batch by :class:`khipu.detector.outputs.DetectorWriter`: verdicts (store, verdict archive, lost topic,
metrics), the raw-trace archive, quarantine, back-pointers and emitter sequences. Its progress is kept in
``checkpoint_dir/khipu_detector``.

Its secrets come from the connections file a supervisor writes (:mod:`khipu.detector.launch`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import DataFrame, GroupedData, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from khipu.detector.bucket import route_ids, routes_fingerprint
from khipu.detector.checkpoint import EPOCH_FILE, Epoch, query_checkpoint, read_epoch, write_epoch
from khipu.detector.clock import source_offsets
from khipu.detector.committed import (
    ClusterClients,
    CommittedOffsets,
    PointedPositions,
    RecordFates,
    RecordRemovals,
    StreamReadProgress,
)
from khipu.detector.handover import HANDOVER_DDL, HANDOVER_STATE, pending_handover
from khipu.detector.launch import DetectorJobError, check_deployment
from khipu.detector.model import DETECTOR_QUERY, DetectorConfig
from khipu.detector.outage import SOURCE_OPTIONS, OutageWatch, WaitingReporter
from khipu.detector.outputs import BatchFigures, BatchKeys, DetectorWriter, HeartbeatListener, ReadProgress
from khipu.detector.packed import PACKED_SCHEMA
from khipu.detector.parse import RecordDecoder, kafka_columns
from khipu.detector.processor import VerdictProcessor
from khipu.detector.routes import RoutePlans
from khipu.detector.sizing import DEFAULT_BUCKETS, DEFAULT_SHUFFLE_PARTITIONS, MAX_BUCKETS, settle
from khipu.kafka import KafkaAdmin, KafkaConnection, KafkaUnavailable
from khipu.kafka.admin import TRACE_TOPIC_CONFIG
from khipu.registry.loader import load_registry
from khipu.storage.location import Location
from khipu.store import Store

__all__ = ["DEFAULT_BUCKETS", "DETECTOR_QUERY", "EPOCH_FILE", "DetectorJob", "start_detector"]
log = logging.getLogger(__name__)
DEFAULT_TRIGGER_S = 2.0  # a batch at least this often: LOST within seconds; under load batches grow instead
DEFAULT_MAX_OFFSETS_PER_TRIGGER = 250_000  # a batch's bound: ten seconds of work here, well inside the staleness limit


def known_routes(query_checkpoint: Location | Path, plans: RoutePlans) -> dict[str, dict[str, list[str]]]:
    """Every set of routes this checkpoint's state was kept under, by fingerprint, the current one recorded
    first (``<checkpoint>/routes/<fingerprint>.json``): after a registry change the processor restates what
    it kept under the old routes (:class:`khipu.detector.bucket.BucketJudge`)."""
    folder = Location.of(query_checkpoint, "checkpoint") / "routes"
    current = route_ids(plans)
    path = folder / f"{routes_fingerprint(current)}.json"
    if not path.exists():
        path.write_text(json.dumps(current, sort_keys=True))
    known: dict[str, dict[str, list[str]]] = {}
    for name in _names(folder):
        if not name.endswith(".json") or name.startswith("."):
            continue
        file = folder / name
        try:
            known[file.name.removesuffix(".json")] = json.loads(file.read_text())
        except ValueError as exc:
            raise DetectorJobError("routes file", file.url, f"JSON of stream -> hop ids ({exc})") from exc
    return known


OLD_ARCHIVE_QUERY = "khipu_archive"  # the two-query detector's archive query (before one query did everything)


def carried_over_offsets(checkpoint_dir: Location | Path, topic: str) -> str | None:
    """Where the two-query detector's archive query stopped on the trace topic (its last committed batch's end),
    as ``startingOffsets`` JSON; None when there is no such checkpoint. A detector upgraded from it starts there:
    every trace before is archived once already, and reading them again would count them again."""
    old = Location.of(checkpoint_dir, "checkpoint") / OLD_ARCHIVE_QUERY
    committed = [int(name) for name in _names(old / "commits") if name.isdigit()]
    if not committed:
        return None
    lines = (old / "offsets" / str(max(committed))).read_text().splitlines()
    ends = source_offsets(lines[-1], topic) if lines else None
    if not ends:
        return None
    return json.dumps({topic: {str(partition): offset for partition, offset in sorted(ends.items())}})


def checkpoint_epoch(query_checkpoint: Location | Path, now_s: int, buckets: int = DEFAULT_BUCKETS) -> tuple[int, bool]:
    """The checkpoint's identity: the second it was first started, kept in it (a checkpoint deleted and started
    again is another). Returns (that second, whether this start is the checkpoint's first: no batch yet).

    Beside it, the bucket count its state is kept in, recorded at its first start (a checkpoint of an earlier
    release, which did not keep it, gets this start's); a start with another count is refused (SizingError)."""
    query = Location.of(query_checkpoint, "checkpoint")
    epoch = read_epoch(query)
    if epoch is not None:
        settle("buckets", buckets, epoch.buckets, DEFAULT_BUCKETS, str(query))
        if epoch.buckets is None:
            write_epoch(query, Epoch(epoch.started_s, buckets))
        return epoch.started_s, False
    first = not any(name.isdigit() for name in _names(query / "offsets"))
    write_epoch(query, Epoch(now_s, buckets))
    return now_s, first


def _names(folder: Location) -> list[str]:
    """The names of what is directly in a checkpoint folder (files and folders; none when it does not exist)."""
    return [info.base_name for info in folder.children()]


@dataclass(frozen=True, slots=True)
class DetectorJob:
    registry_path: Path
    trace_connection: KafkaConnection  # the cluster of the trace topic and the lost topic
    store_url: str = field(repr=False)  # may hold a password
    checkpoint_dir: Location
    archive_dir: Location  # the raw-trace archive
    verdicts_dir: Location  # the verdict archive: plain DELIVERED verdicts (khipu.verdicts.archive)
    trace_topic: str = "khipu.traces"
    lost_topic: str | None = "khipu.lost"
    cluster_connections: Mapping[str, KafkaConnection] = field(default_factory=dict)  # per registry cluster
    starting_offsets: str = "earliest"
    trigger_seconds: float = DEFAULT_TRIGGER_S
    max_offsets_per_trigger: int | None = DEFAULT_MAX_OFFSETS_PER_TRIGGER
    shuffle_partitions: int = DEFAULT_SHUFFLE_PARTITIONS  # fixed for a checkpoint too (Spark keeps it)
    buckets: int = DEFAULT_BUCKETS  # messages' state is kept per hash bucket of their ids; fixed for a checkpoint
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    # a query quiet this long has its clusters and store asked whether they answer; what does not goes in the heartbeat
    outage_quiet_after_s: float = 30.0

    def __post_init__(self) -> None:
        locations = (("checkpoint_dir", "checkpoint"), ("archive_dir", "archive"), ("verdicts_dir", "verdict archive"))
        for name, setting in locations:  # a Path or URL given: a Location
            object.__setattr__(self, name, Location.of(getattr(self, name), setting))
        if not self.trigger_seconds > 0:
            raise DetectorJobError("trigger_seconds", self.trigger_seconds, "a number of seconds > 0")
        if not 1 <= self.buckets <= MAX_BUCKETS:
            expected = f"an integer from 1 to {MAX_BUCKETS}, the same for a checkpoint"
            raise DetectorJobError("buckets", self.buckets, expected)
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


# -- the queries -----------------------------------------------------------------------------------------


def read_traces(spark: SparkSession, job: DetectorJob) -> DataFrame:
    """The trace topic as a stream of Spark's Kafka schema, through Spark's Kafka connector."""
    reader = (
        spark.readStream.format("kafka")
        .option("subscribe", job.trace_topic)
        .option("startingOffsets", job.starting_offsets)
        .option("failOnDataLoss", "false")
    )
    for key, value in SOURCE_OPTIONS.items():  # through an outage of the trace cluster: wait, then ask again
        reader = reader.option(key, value)
    for key, value in job.trace_connection.spark_options().items():  # credentials stay in the driver
        reader = reader.option(key, value)
    if job.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(job.max_offsets_per_trigger))
    return reader.load()


def judged_and_records(
    kafka_rows: DataFrame,
    decoder: RecordDecoder,
    processor: VerdictProcessor,
    partitions: int,
    initial_state: GroupedData | None = None,
) -> DataFrame:
    """The trace topic's records, decoded and packed by bucket in Python (:class:`khipu.detector.parse.RecordDecoder`)
    and shuffled once, and what the processor decides from them, in one frame of
    :data:`khipu.detector.packed.PACKED_SCHEMA`: the records' packed rows (kind ``records``) and one row per bucket
    evaluated (kind ``judged``). Both sides read the same shuffle, which Spark runs once (``ReusedExchange`` in the
    plan; ``test_detector.py`` checks it). The processor's side comes first in the union, as it had to before the
    records were packed (as the union's first child the records' side then kept an alias the other side's copy
    dropped, and the two shuffles were no longer equal). ``initial_state``: a rescale's hand-over by bucket, which the
    processor takes in the checkpoint's first batch (:mod:`khipu.detector.handover`)."""
    packed = kafka_columns(kafka_rows).mapInArrow(decoder, PACKED_SCHEMA)
    shuffled = packed.repartition(partitions, "bucket")
    judged = shuffled.groupBy("bucket").transformWithStateInPandas(
        statefulProcessor=processor,
        outputStructType=PACKED_SCHEMA,
        outputMode="Update",
        timeMode="ProcessingTime",
        initialState=initial_state,
    )
    return judged.unionByName(shuffled)


def warn_unless_stamped_by_the_broker(job: DetectorJob) -> None:
    """How far the trace topic is read is taken from its record times when the detector is behind: exact with
    LogAppendTime, off by the emitters' clock skew with CreateTime (``khipu topics ensure`` sets the former)."""
    try:
        stamped = KafkaAdmin(job.trace_connection, timeout_s=10).timestamp_type(job.trace_topic)
    except KafkaUnavailable as exc:
        log.warning("the trace topic's timestamp type could not be read: %s", exc)
        return
    if stamped is not None and stamped != TRACE_TOPIC_CONFIG["message.timestamp.type"]:
        log.warning(
            "trace topic %s keeps %s: while the detector is behind, how far it has read follows the clocks of the "
            "applications writing traces; set message.timestamp.type=LogAppendTime (`khipu topics ensure` does)",
            job.trace_topic,
            stamped,
        )


def start_detector(spark: SparkSession, job: DetectorJob) -> list[StreamingQuery]:
    check_deployment(
        spark.sparkContext.master or "local",
        job.store_url,
        {"checkpoint": job.checkpoint_dir, "archive": job.archive_dir, "verdict archive": job.verdicts_dir},
    )
    registry = load_registry(job.registry_path)
    spark.conf.set("spark.sql.shuffle.partitions", str(job.shuffle_partitions))
    spark.conf.set("spark.sql.session.timeZone", "UTC")  # the archive's hour partitions are UTC hours
    spark.conf.set(
        "spark.sql.streaming.stateStore.providerClass",
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    )
    spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    figures = BatchFigures()
    spark.streams.addListener(HeartbeatListener(job.store_url, figures))
    reporter = WaitingReporter(job.store_url, DETECTOR_QUERY)
    warn_unless_stamped_by_the_broker(job)
    clients = ClusterClients(job.connections_by_cluster(sorted(registry.clusters)), job.store_url)
    removals = RecordRemovals(clients)
    plans = RoutePlans.of(registry)
    query_dir = query_checkpoint(job.checkpoint_dir)  # khipu_detector, or the folder a rescale wrote
    epoch_s, first_start = checkpoint_epoch(query_dir, int(time.time()), job.buckets)
    carried = carried_over_offsets(job.checkpoint_dir, job.trace_topic) if first_start else None
    if carried is not None and job.starting_offsets == "earliest":
        log.info("upgraded from the two-query detector: reading %s from where its archive query stopped: %s",
                 job.trace_topic, carried)  # fmt: skip
        job = dataclasses.replace(job, starting_offsets=carried)
    if first_start:  # reading from the start: earlier checkpoints' progress says nothing of what this one read
        store = Store(job.store_url)
        try:
            store.heartbeat.start_over(DETECTOR_QUERY, int(time.time() * 1000))
        finally:
            store.close()
    handover, initial_state = pending_handover(query_dir), None
    if handover is not None:  # a rescale's: read on from where the old checkpoint stopped, with its messages in flight
        log.info("rescaled from %s (%d buckets, batch %d) to %d buckets: %d messages in flight taken over",
                 handover.source, handover.from_buckets, handover.batch, handover.buckets,
                 handover.messages)  # fmt: skip
        job = dataclasses.replace(job, starting_offsets=handover.starting_offsets(job.trace_topic))
        slices = spark.read.schema(HANDOVER_DDL).parquet((query_dir / HANDOVER_STATE).spark_url)
        initial_state = slices.select("bucket", "blob").groupBy("bucket")
    earlier_routes = known_routes(query_dir, plans)
    committed = CommittedOffsets(clients)
    read_progress = StreamReadProgress(job.store_url, (DETECTOR_QUERY,), clients.not_answered)
    processor = VerdictProcessor(
        registry,
        committed,
        job.detector,
        PointedPositions(job.store_url, clients.not_answered),
        read_progress,
        removals,
        removals.log_start,
        earlier_routes,
        RecordFates(clients),
        committed.history,
        read_progress.running,
        clients.take_unanswered,
    )
    decoder = RecordDecoder(tuple(registry.streams), plans.hop_keys(), job.buckets)
    judged = judged_and_records(read_traces(spark, job), decoder, processor, job.shuffle_partitions, initial_state)
    writer = DetectorWriter(
        job.store_url,
        job.archive_dir.url,
        job.verdicts_dir.url,
        job.lost_topic,
        job.trace_connection,
        keep_pointers_ms=2 * job.detector.max_wait_ms + 3_600_000,
        known_streams=tuple(registry.streams),
        hops=plans.described(),
        feeders=plans.feeders(),
        batch_keys=BatchKeys(epoch_s, (read_epoch(query_dir) or Epoch(epoch_s, None)).first_batch),
        figures=figures,
        reporter=reporter,
        progress=ReadProgress(
            query_dir,
            DETECTOR_QUERY,
            job.trace_topic,
            job.trace_connection,
            max_offsets_per_trigger=job.max_offsets_per_trigger,
        ),
        grace_ms=job.detector.grace_ms,
    )
    query = (
        judged.writeStream.queryName(DETECTOR_QUERY)
        .foreachBatch(writer)
        .option("checkpointLocation", query_dir.spark_url)
        .trigger(processingTime=f"{job.trigger_seconds} seconds")
        .start()
    )
    clusters = {**job.connections_by_cluster(sorted(registry.clusters)), "(traces)": job.trace_connection}
    watch = OutageWatch(
        reporter, clusters, lambda: figures.last_progress_ms, quiet_after_s=job.outage_quiet_after_s,
        active=lambda: bool(query.isActive),
    )  # fmt: skip
    watch.start()
    return [query]
