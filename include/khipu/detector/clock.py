"""How far the detector has read the trace topic, as a time: every trace written before it has been read.

The rules wait on this clock, not on the wall clock (:func:`khipu.detector.decide.decide`'s ``read_to_ms``):
a group's commit seen past a message proves a loss only once every trace written before the commit (plus
the grace) has been read — the group's RECEIVED trace may sit further down the trace topic.

Per trace-topic partition, after a micro-batch:

- read to its end when the batch ended at its latest offset, asked right after the batch (``asked_ms``):
  every trace written before that moment is read;
- otherwise (a backlog, the batch cut by ``maxOffsetsPerTrigger``), up to the newest record time read
  from it: a record is written (appended) no earlier than its timestamp says, so every record appended
  before the newest timestamp read sits at a lower offset and has been read. (With ``CreateTime``
  timestamps this holds up to the clock skew between emitters and brokers, which the grace absorbs;
  with ``LogAppendTime`` exactly.)

The topic is read to the earliest of its partitions. So a detector working off a backlog still
decides, a few seconds behind what it has read, instead of waiting to be caught up.

**The running batch's clock** (:func:`running_read_to_ms`). Under steady traffic the batch that just ended
has read to about when it began, so a batch decides on a clock one batch old. Before its Spark job runs, the
writer knows more of the batch now running: Spark planned it after the previous batch's writer returned, and
where its offsets were not cut by ``maxOffsetsPerTrigger`` it reads every partition to the latest offset
Spark saw then. When it ends, every trace written before the previous writer returned is read: the batch
can decide on that. But the back-pointers among its own records are stored only after it (the writer's),
so a LOST decided on that clock alone is held back by the writer when a record of the same batch points at
its record (:func:`khipu.detector.outputs.held_back`), and decided again in the next batch on the stored
pointers, which keeps it in flight for that one more evaluation (:class:`khipu.detector.bucket.BucketJudge`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

PartitionOffsets = Mapping[int, int]


def read_to_ms(
    asked_ms: int,
    end_offsets: PartitionOffsets,
    latest_offsets: PartitionOffsets | None,
    newest_read_ms: Mapping[int, int],
) -> int | None:
    """The time up to which the trace topic is read after a batch (see the module doc); None when a partition
    the batch did not read to its end has no record time read yet (the caller keeps its previous answer)."""
    if not end_offsets:
        return None
    bounds: list[int] = []
    for partition, end in end_offsets.items():
        if latest_offsets is not None and latest_offsets.get(partition) == end:
            bounds.append(asked_ms)
        elif partition in newest_read_ms:
            bounds.append(min(newest_read_ms[partition], asked_ms))
        else:
            return None
    return min(bounds)


def running_read_to_ms(
    previous_end_ms: int | None,
    starts: PartitionOffsets | None,
    ends: PartitionOffsets,
    max_offsets: int | None,
) -> int | None:
    """How far the trace topic will be read when the batch now running ends, known before it runs (see the
    module doc): when the previous batch's writer returned (``previous_end_ms``, in this process) if this
    batch was planned after it, from where the previous batch ended (``starts``) to its own ``ends``, and read
    everything the topic held then. None when that cannot be told: no previous batch in this process, or
    ``maxOffsetsPerTrigger`` may have cut the batch.

    When the topic holds more than the limit, Spark's Kafka source gives each partition its share of the limit
    rounded down (``KafkaMicroBatchStream.rateLimit``): a cut batch spans more than the limit less one offset
    per partition (at least that, allowing for the rounding of its floating-point shares). So only a batch
    spanning fewer was surely cut nowhere. A partition new since the previous batch counts from offset 0 (at
    least what it spans)."""
    if previous_end_ms is None or starts is None or not ends:
        return None
    if max_offsets is not None:
        spanned = sum(max(0, end - starts.get(partition, 0)) for partition, end in ends.items())
        if spanned >= max_offsets - len(ends):
            return None
    return previous_end_ms


def source_offsets(raw: Any, topic: str) -> dict[int, int] | None:
    """A Kafka source's offsets as Spark's progress reports them (``{"topic": {"0": 12, ...}}``, JSON text or
    a mapping) for one topic; None when they are not there."""
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return None
    if not isinstance(parsed, Mapping) or not isinstance(parsed.get(topic), Mapping):
        return None
    try:
        return {int(partition): int(offset) for partition, offset in parsed[topic].items()}
    except (TypeError, ValueError):
        return None
