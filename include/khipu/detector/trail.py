"""How far the detector trails the trace topic, and the offsets it skipped, after each micro-batch.

After a batch the driver knows, per trace-topic partition, where the batch started and ended (the query's offset log:
the previous batch's end and its own), which offsets it read (the batch's records), and the log's start and end, asked
of the broker right after (:meth:`khipu.detector.outputs.ReadProgress.advance`). From them:

- **records behind** (:attr:`TrailFigures.records_behind`): the offsets from where the batch ended to the log end,
  summed over the partitions: what the detector has yet to read, those the broker removed first among them
  (:attr:`TrailFigures.removed_unread`);
- **seconds behind** (:meth:`TrailFigures.seconds_behind`): how old the oldest record no finished batch has read is.
  Per partition the first record still in the log at or after where the batch ended is fetched once
  (:meth:`khipu.kafka.KafkaAdmin.record_times`); its timestamp is the broker's append time on the trace topic
  (LogAppendTime, as ``khipu topics ensure`` sets it; the producer's clock on a CreateTime topic). The clock covers
  the time from when the broker appended the oldest of them to now: exact while the detector reads no further, at
  most one batch over while a batch that holds it runs (it is told when that batch ends). It is not how far the topic
  is *read* (:mod:`khipu.detector.clock`: a time before which every trace is read); it is the age of the oldest trace
  not read, which is what retention ages out;
- **skipped** (:func:`skipped_offsets`): the offsets from where a batch started up to the first it read that the
  broker no longer has: records retention (or DeleteRecords) removed before the batch read them. Spark's Kafka source
  runs with ``failOnDataLoss=false`` (:func:`khipu.detector.job.read_traces`): it reads on from the log start and says
  so only in a warning of the driver's log, and the messages those records traced are never judged.

The functions are pure but :func:`with_oldest_unread`, which asks the broker.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc

from khipu.clock import elapsed_ms
from khipu.kafka import KafkaAdmin, KafkaUnavailable
from khipu.store.heartbeat import PartitionTrail, TraceSkip

log = logging.getLogger(__name__)


def first_read_offsets(records: pa.Table) -> dict[int, int]:
    """Per trace-topic partition, the lowest offset among a batch's records
    (:data:`khipu.detector.packed.RECORD_FIELDS`: a row for every line of every record the batch read, with where it
    sat)."""
    rows = records.select(["source_partition", "source_offset"]).filter(pc.is_valid(records.column("source_offset")))
    if not rows.num_rows:
        return {}
    lowest = rows.group_by("source_partition").aggregate([("source_offset", "min")])
    return dict(
        zip(
            (int(p) for p in lowest.column("source_partition").to_pylist()),
            (int(o) for o in lowest.column("source_offset_min").to_pylist()),
            strict=True,
        )
    )


def partition_trails(
    batch_id: int, ends: Mapping[int, int], marks: Mapping[int, tuple[int, int]], asked_ms: int
) -> list[PartitionTrail]:
    """Where batch ``batch_id`` ended on each partition (``ends``, from the offset log) with the partition's (log start,
    log end) asked at ``asked_ms`` (``marks``); partitions the broker did not answer for are left out."""
    return [
        PartitionTrail(partition, end, batch_id, marks[partition][0], marks[partition][1], asked_ms)
        for partition, end in sorted(ends.items())
        if partition in marks
    ]


def waiting_from(trail: PartitionTrail) -> int | None:
    """The offset of the oldest record still in the log the detector has not read (None: none waits)."""
    position = max(trail.read_end, trail.log_start)
    return position if position < trail.log_end else None


def with_oldest_unread(
    admin: KafkaAdmin, topic: str, trails: Sequence[PartitionTrail], known: Sequence[PartitionTrail] = ()
) -> list[PartitionTrail]:
    """The trails with the offset and timestamp of their oldest record not read yet (:func:`waiting_from`): taken from
    ``known`` (earlier trails) where that record is the same one, else fetched from the broker. Left unknown where the
    broker has no answer (logged): seconds behind are then not known."""
    times = {
        trail.partition: (trail.oldest_unread_offset, trail.oldest_unread_ms)
        for trail in known
        if trail.oldest_unread_ms is not None and trail.oldest_unread_offset is not None
    }
    wanted = {
        trail.partition: position
        for trail in trails
        if (position := waiting_from(trail)) is not None and times.get(trail.partition, (None, None))[0] != position
    }
    if wanted:
        try:
            fetched = admin.record_times(topic, wanted)
        except KafkaUnavailable as exc:
            log.warning("the oldest unread records of %s not fetched (%s): seconds behind not known", topic, exc)
        else:
            times.update(fetched.found)
            for error in fetched.errors:
                log.warning("oldest unread record of %s: %s", topic, error)
    filled = []
    for trail in trails:
        position = waiting_from(trail)
        offset, at_ms = times.get(trail.partition, (None, None))
        if position is None or offset is None or offset < position:
            filled.append(replace(trail, oldest_unread_offset=None, oldest_unread_ms=None))
        else:
            filled.append(replace(trail, oldest_unread_offset=offset, oldest_unread_ms=at_ms))
    return filled


def skipped_offsets(
    batch_id: int,
    starts: Mapping[int, int],
    ends: Mapping[int, int],
    first_read: Mapping[int, int],
    log_starts: Mapping[int, int],
    detected_ms: int,
) -> list[TraceSkip]:
    """The offsets batch ``batch_id`` skipped, per partition: from where it started (``starts``: the previous batch's
    ends) up to the first offset it read (``first_read``; its end when it read none there) or the log start asked after
    it (``log_starts``), whichever is lower. Those are offsets it did not read that the broker no longer has: removed
    before it read them. (Offsets it did not read that are still there, a transaction's commit marker, are no skip.)
    A partition new since the previous batch, or without a log start, is left out."""
    found = []
    for partition, end in sorted(ends.items()):
        start = starts.get(partition)
        if start is None or partition not in log_starts:
            continue
        gone_to = min(first_read.get(partition, end), end, log_starts[partition])
        if gone_to > start:
            found.append(TraceSkip(partition, start, gone_to, batch_id, detected_ms))
    return found


@dataclass(frozen=True, slots=True)
class TrailFigures:
    """How far the detector trails the whole trace topic (:func:`trail_figures`)."""

    records_behind: int  # offsets from where the newest batch ended to the log end, summed over the partitions
    removed_unread: int  # of those, offsets the broker removed before the detector read them (it skips them)
    oldest_unread_ms: int | None  # of the oldest record in the log not read (None: none, or unknown)
    waiting: bool  # some record still in the log is not read yet
    timed: bool  # every partition where one waits has its oldest's timestamp
    asked_ms: int  # the oldest of the partitions' asks of the broker

    def seconds_behind(self, now_ms: int) -> float | None:
        """How old the oldest record not read yet is at ``now_ms``: 0 when none waits in the log; None when one waits
        whose time is not known."""
        if not self.waiting:
            return 0.0
        if not self.timed or self.oldest_unread_ms is None:
            return None
        return elapsed_ms(self.oldest_unread_ms, now_ms) / 1000


def trail_figures(trails: Sequence[PartitionTrail]) -> TrailFigures | None:
    """The figures of a query's partition trails (None: none recorded yet)."""
    if not trails:
        return None
    waiting = [trail for trail in trails if waiting_from(trail) is not None]
    times = [trail.oldest_unread_ms for trail in waiting if trail.oldest_unread_ms is not None]
    return TrailFigures(
        records_behind=sum(trail.unread for trail in trails),
        removed_unread=sum(trail.removed_unread for trail in trails),
        oldest_unread_ms=min(times) if times else None,
        waiting=bool(waiting),
        timed=len(times) == len(waiting),
        asked_ms=min(trail.asked_ms for trail in trails),
    )
