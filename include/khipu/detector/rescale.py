"""Rescaling the detector to another bucket count: its messages in flight carried to a new checkpoint.

    python spark/rescale.py --buckets 64          # or: spark-submit spark/rescale.py --buckets 64

A checkpoint keeps a message's state in bucket ``pmod(xxhash64(message_id), buckets)``, so its bucket count is fixed
(:mod:`khipu.detector.sizing`). With the detector stopped, :func:`rescale_detector`:

1. plans without Spark (:func:`plan_rescale`): the query checkpoint in use
   (:func:`khipu.detector.checkpoint.query_checkpoint`), its bucket count, its last committed batch and where on the
   trace topic that batch ended; refused: a count the checkpoint already has, a checkpoint that committed no batch
   (or whose count is not recorded), a driver recorded as running on this host;
2. reads that batch's state with Spark's state data source (``format("statestore")``, the processor's value state
   ``bucket``), cuts each old bucket's messages by their bucket under the new count on the executors
   (:class:`khipu.detector.handover.Rekeyed`) and writes the slices into a new folder beside the old one
   (``khipu_detector.<n>/khipu-handover``);
3. copies the routes the old state was kept under, writes the manifest (:class:`khipu.detector.handover.Handover`)
   and the new checkpoint's epoch: the old one's second and the new count, its batch keys continuing after the old
   one's last committed batch (:class:`khipu.detector.outputs.BatchKeys`);
4. checks that the old checkpoint's offset and commit logs have not moved meanwhile (a detector still running would
   have decided past the state read), and only then writes ``<checkpoint>/khipu-query.json`` naming the new folder:
   the one write that moves the detector over. The old folder is left as it was, for the operator to remove.

The detector started afterwards (:func:`khipu.detector.job.start_detector`) reads the trace topic from where the old
checkpoint's last committed batch ended, with the slices as its processor's initial state. Why that loses and
repeats nothing: the state handed over is the one that batch committed, and reading resumes exactly after it; if
the old query had started another batch and not committed it, the new batch 0 reads that batch's records again (and
what arrived since) under that batch's own key, so it replaces what the unfinished batch wrote (archive files, the
decided index, metric parts) and settles against the verdicts it stored, as Spark's own replay of it would have.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from khipu.detector.checkpoint import (
    Epoch,
    point_at,
    query_checkpoint,
    read_epoch,
    recorded_shuffle_partitions,
    write_epoch,
)
from khipu.detector.driver import read_driver_record
from khipu.detector.handover import (
    HANDOVER_DDL,
    HANDOVER_STATE,
    Handover,
    Rekeyed,
    committed_batches,
    offsets_of_batch,
    write_handover,
)
from khipu.detector.model import DETECTOR_QUERY
from khipu.detector.processor import STATE_VAR
from khipu.detector.sizing import DEFAULT_SHUFFLE_PARTITIONS, MAX_BUCKETS, RESCALING
from khipu.errors import InvalidSetting
from khipu.storage.location import Location


class RescaleError(InvalidSetting):
    kind = "detector rescale"


@dataclass(frozen=True, slots=True)
class RescalePlan:
    checkpoint: Location  # the detector's checkpoint folder
    source: Location  # the query checkpoint in use: the one rescaled
    target: Location  # the new query checkpoint, beside it
    epoch: Epoch  # the source's
    buckets: int  # the new count
    batch: int  # the source's last committed batch
    replayed: bool  # the source started a batch after it that it did not commit
    topic: str
    offsets: dict[int, int]  # where that batch ended on the trace topic
    shuffle_partitions: int  # the target's: the source's, or the ones asked for
    logs: tuple[tuple[int, ...], tuple[int, ...]]  # the source's offset and commit logs (batch ids) when planned

    @property
    def first_batch(self) -> int:
        """The target's batch 0 as a batch key after the epoch's second: the batch after the source's last one."""
        return self.epoch.first_batch + self.batch + 1


def plan_rescale(checkpoint_dir: Location | Path, buckets: int, shuffle_partitions: int | None = None) -> RescalePlan:
    """What rescaling the detector's checkpoint to ``buckets`` takes (``shuffle_partitions``: the new checkpoint's, else
    the old one's); refuses what cannot be rescaled (RescaleError)."""
    checkpoint = Location.of(checkpoint_dir, "checkpoint")
    source = query_checkpoint(checkpoint)
    if isinstance(buckets, bool) or not 1 <= buckets <= MAX_BUCKETS:
        raise RescaleError("buckets", buckets, f"an integer from 1 to {MAX_BUCKETS}")
    epoch = read_epoch(source)
    if epoch is None or epoch.buckets is None:
        raise RescaleError(
            "checkpoint", source.url,
            "a checkpoint whose bucket count is recorded in khipu-epoch.json (start the detector on it once with this "
            "release, let it commit a batch, and stop it)",
        )  # fmt: skip
    if buckets == epoch.buckets:
        raise RescaleError("buckets", buckets, f"another count than the {epoch.buckets} the checkpoint keeps")
    logs = _logs(source)
    if not logs[1]:
        raise RescaleError(
            "checkpoint", source.url,
            "a checkpoint that committed a batch, whose state is read (a checkpoint a rescale wrote that the detector "
            f"has not run on yet: delete <checkpoint>/khipu-query.json and that folder to undo it; see {RESCALING})",
        )  # fmt: skip
    if shuffle_partitions is not None and (isinstance(shuffle_partitions, bool) or shuffle_partitions < 1):
        raise RescaleError("shuffle_partitions", shuffle_partitions, "an integer >= 1, or none: the checkpoint's")
    batch = logs[1][-1]
    topic, offsets = offsets_of_batch(source, batch)
    partitions = shuffle_partitions or recorded_shuffle_partitions(source) or DEFAULT_SHUFFLE_PARTITIONS
    return RescalePlan(
        checkpoint, source, checkpoint / _next_folder(checkpoint), epoch, buckets, batch,
        replayed=bool(logs[0]) and logs[0][-1] > batch, topic=topic, offsets=offsets, shuffle_partitions=partitions,
        logs=logs,
    )  # fmt: skip


def rescale_detector(
    spark: SparkSession, checkpoint_dir: Location | Path, buckets: int, shuffle_partitions: int | None = None
) -> Handover:
    """Carry the detector's messages in flight to a new checkpoint of ``buckets`` buckets (and ``shuffle_partitions``,
    else the old one's) and switch the detector over to it (the module's steps). Returns what was handed over."""
    plan = plan_rescale(checkpoint_dir, buckets, shuffle_partitions)
    driver = read_driver_record(plan.checkpoint)
    if driver is not None and driver.alive():
        raise RescaleError(
            "detector", f"driver {driver.pid} running on this host",
            "the detector stopped first: pause the khipu_detector DAG, then stop its driver",
        )  # fmt: skip
    # RocksDB's state store asks Spark's StateStoreCoordinator when it loads, even to be read; the coordinator starts
    # with the session's streaming query manager, which a session that ran no stream has not made yet
    spark.streams.active  # noqa: B018
    old = (
        spark.read.format("statestore")
        .option("batchId", plan.batch)
        .option("stateVarName", STATE_VAR)
        .load(plan.source.spark_url)
        .selectExpr("CAST(key.bucket AS INT) AS from_bucket", "value.blob AS blob")
    )
    slices = plan.target / HANDOVER_STATE
    old.mapInArrow(Rekeyed(buckets), HANDOVER_DDL).write.mode("overwrite").parquet(slices.spark_url)
    written = spark.read.schema(HANDOVER_DDL).parquet(slices.spark_url)
    counted = written.agg(F.count("*").alias("slices"), F.sum("messages").alias("messages")).collect()[0]
    for info in (plan.source / "routes").children():  # the routes its states may have been kept under
        if info.base_name.endswith(".json"):
            (plan.target / "routes" / info.base_name).write_text((plan.source / "routes" / info.base_name).read_text())
    handover = Handover(
        source=plan.source.url, from_buckets=plan.epoch.buckets or 0, buckets=buckets, batch=plan.batch,
        replayed=plan.replayed, topic=plan.topic, offsets=plan.offsets, shuffle_partitions=plan.shuffle_partitions,
        messages=int(counted["messages"] or 0), slices=int(counted["slices"]), rescaled_ms=time.time_ns() // 1_000_000,
    )  # fmt: skip
    write_handover(plan.target, handover)
    write_epoch(plan.target, Epoch(plan.epoch.started_s, buckets, plan.first_batch))
    if _logs(plan.source) != plan.logs:
        raise RescaleError(
            "checkpoint", plan.source.url,
            f"no batch started or committed while it is rescaled (it moved past batch {plan.batch}: the detector "
            f"runs); stop the detector and rescale again ({plan.target.url} is left unused)",
        )  # fmt: skip
    point_at(plan.checkpoint, plan.target)
    return handover


def _logs(query: Location) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The batch ids of the query's offset log (batches started) and commit log (batches committed)."""
    started = sorted(int(info.base_name) for info in (query / "offsets").children() if info.base_name.isdigit())
    return tuple(started), tuple(committed_batches(query))


def _next_folder(checkpoint: Location) -> str:
    """``khipu_detector.<n>``, n one past any such folder there (one a failed rescale left is never reused)."""
    numbers = [
        int(suffix)
        for name in checkpoint.child_folders(f"{DETECTOR_QUERY}.")
        if (suffix := name.removeprefix(f"{DETECTOR_QUERY}.")).isdigit()
    ]
    return f"{DETECTOR_QUERY}.{max(numbers, default=0) + 1}"
