"""Offset-range planning of the Kafka stream source, as pure functions.

Offsets are Spark's Kafka source JSON shape: ``{"topic": {"partition": next_offset}}``.
"""

from __future__ import annotations

from collections.abc import Mapping

PartitionOffsets = dict[tuple[str, int], int]


def to_json_offsets(offsets: Mapping[tuple[str, int], int]) -> dict[str, dict[str, int]]:
    result: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        result.setdefault(topic, {})[str(partition)] = int(offset)
    return result


def from_json_offsets(data: Mapping[str, Mapping[str, int]]) -> PartitionOffsets:
    return {
        (topic, int(partition)): int(offset) for topic, parts in data.items() for partition, offset in parts.items()
    }


def plan_end(start: PartitionOffsets, latest: PartitionOffsets, max_records: int | None) -> PartitionOffsets:
    """The end offsets of the next micro-batch.

    Partitions new since ``start`` begin at the start the caller put in ``start`` for them. With
    ``max_records``, the batch takes at most that many records in all, split across partitions in
    proportion to what each has waiting (as Spark's Kafka source does with maxOffsetsPerTrigger);
    every partition with data gets at least one record so none starves.
    """
    end = {tp: max(start.get(tp, offset), offset) for tp, offset in latest.items()}
    end.update({tp: offset for tp, offset in start.items() if tp not in end})
    if max_records is None:
        return end
    waiting = {tp: end[tp] - start.get(tp, end[tp]) for tp in end}
    total = sum(waiting.values())
    if total <= max_records:
        return end
    capped = dict(end)
    for tp, available in waiting.items():
        if available > 0:
            share = max(1, int(max_records * available / total))
            capped[tp] = start[tp] + min(available, share)
    return capped
