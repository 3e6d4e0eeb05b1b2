"""Taking an offset-watermark snapshot of one cluster, through :class:`khipu.kafka.KafkaAdmin`.

Standard Kafka calls only: ListConsumerGroups (when every group is wanted), DescribeConsumerGroups
(state, members and their assignments), OffsetFetch (committed offsets), ListOffsets (earliest /
latest) and DescribeConfigs (``retention.ms``, ``retention.bytes``). A failure for one group or
topic is recorded in the run's errors and the rest is still snapshotted; an unreachable cluster
raises :class:`SnapshotError`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from khipu.kafka import KafkaAdmin, KafkaConnection, KafkaUnavailable
from khipu.offsets.model import PartitionSnapshot, SnapshotRun
from khipu.registry.model import Registry


class SnapshotError(RuntimeError):
    """The cluster could not be snapshotted at all."""


def groups_to_watch(registry: Registry, cluster: str) -> dict[str, frozenset[str]]:
    """Every consumer group the registry's routes name on ``cluster``, with the topics it reads there; not a group
    that keeps its offsets outside Kafka (``commits_offsets: false``): Kafka has no offsets of it to watch."""
    watched: dict[str, set[str]] = {}
    for stream in registry.streams.values():
        for consumer in stream.route.consumers:
            if not consumer.commits_offsets:
                continue
            topics = {ref.topic for ref in consumer.reads if ref.cluster == cluster}
            if topics:
                watched.setdefault(consumer.group, set()).update(topics)
    return {group: frozenset(topics) for group, topics in watched.items()}


def collect_snapshot(
    connection: KafkaConnection,
    watched: Mapping[str, frozenset[str]],
    snapshot_ms: int,
    *,
    all_groups: bool = False,
    timeout_s: float = 15.0,
) -> tuple[SnapshotRun, list[PartitionSnapshot]]:
    """Snapshot the watched groups (and every other group when ``all_groups``) of the connection's cluster."""
    started = time.monotonic()
    cluster = connection.cluster
    admin = KafkaAdmin(connection, timeout_s)
    errors: list[str] = []
    try:
        partitions_of = admin.partitions()
    except KafkaUnavailable as exc:
        raise SnapshotError(str(exc)) from None

    every_partition = [(topic, partition) for topic, parts in partitions_of.items() for partition in parts]
    groups = set(watched)
    if all_groups:
        try:
            groups.update(admin.list_groups())
        except KafkaUnavailable as exc:
            errors.append(f"list groups: {exc}")
    described = admin.describe_groups(groups)
    errors.extend(described.errors)

    committed: dict[tuple[str, str, int], int | None] = {}
    for group in sorted(groups):
        for topic in sorted(watched.get(group, ())):
            if topic not in partitions_of:
                errors.append(f"topic {topic} read by group {group} does not exist on {cluster}")
                continue
            for partition in partitions_of[topic]:
                committed[(group, topic, partition)] = None  # watched partitions appear even before any commit
        try:
            offsets = admin.committed_offsets(group, every_partition)
        except KafkaUnavailable as exc:
            errors.append(f"committed offsets of group {group}: {exc}")
            continue
        for (topic, partition), at in offsets.items():
            if topic in partitions_of:
                committed[(group, topic, partition)] = at

    positions = sorted({(topic, partition) for _, topic, partition in committed})
    watermarks = admin.watermarks(positions)
    retention = admin.retention({topic for topic, _ in positions})
    errors.extend([*watermarks.errors, *retention.errors])

    rows = []
    for (group, topic, partition), offset in sorted(committed.items()):
        marks = watermarks.found.get((topic, partition))
        kept = retention.found.get(topic)
        description = described.found.get(group)
        rows.append(
            PartitionSnapshot(
                snapshot_ms,
                cluster,
                group,
                topic,
                partition,
                offset,
                marks[0] if marks else None,
                marks[1] if marks else None,
                description.state if description else None,
                kept.retention_ms if kept else None,
                members=description.members if description else None,
                assigned=(topic, partition) in description.assigned if description else None,
                retention_bytes=kept.retention_bytes if kept else None,
            )
        )
    run = SnapshotRun(
        snapshot_ms, cluster, len(groups), len(rows), int((time.monotonic() - started) * 1000), tuple(errors)
    )
    return run, rows
