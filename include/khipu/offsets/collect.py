"""Taking an offset-watermark snapshot of one cluster: the adapter to Kafka's admin API.

Standard Kafka calls only: ListConsumerGroups (when every group is wanted), DescribeConsumerGroups
(state), OffsetFetch (committed offsets), ListOffsets (earliest / latest) and DescribeConfigs
(``retention.ms``). A failure for one group or topic is recorded in the run's errors and the
rest is still snapshotted; an unreachable cluster raises :class:`SnapshotError`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec, ResourceType

from khipu.offsets.model import PartitionSnapshot, SnapshotRun
from khipu.registry.model import Registry

_NO_OFFSET = -1001  # librdkafka's OFFSET_INVALID: no commit for the partition


class SnapshotError(RuntimeError):
    """The cluster could not be snapshotted at all."""


def groups_to_watch(registry: Registry, cluster: str) -> dict[str, frozenset[str]]:
    """Every consumer group the registry's routes name on ``cluster``, with the topics it reads there."""
    watched: dict[str, set[str]] = {}
    for stream in registry.streams.values():
        for consumer in stream.route.consumers:
            topics = {ref.topic for ref in consumer.reads if ref.cluster == cluster}
            if topics:
                watched.setdefault(consumer.group, set()).update(topics)
    return {group: frozenset(topics) for group, topics in watched.items()}


def collect_snapshot(
    client_config: Mapping[str, Any],
    cluster: str,
    watched: Mapping[str, frozenset[str]],
    snapshot_ms: int,
    *,
    all_groups: bool = False,
    timeout_s: float = 15.0,
) -> tuple[SnapshotRun, list[PartitionSnapshot]]:
    """Snapshot the watched groups (and every other group when ``all_groups``) at ``snapshot_ms``."""
    started = time.monotonic()
    admin = AdminClient(dict(client_config))
    errors: list[str] = []
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise SnapshotError(f"cannot reach Kafka cluster {cluster!r}: {_text(exc)}") from None
    partitions_of = {name: sorted(meta.partitions) for name, meta in metadata.topics.items() if meta.error is None}

    groups = set(watched)
    if all_groups:
        try:
            listing = admin.list_consumer_groups(request_timeout=timeout_s).result(timeout=timeout_s)
            groups.update(g.group_id for g in listing.valid)
        except KafkaException as exc:
            errors.append(f"list groups: {_text(exc)}")

    states: dict[str, str | None] = {}
    for group, future in (
        admin.describe_consumer_groups(sorted(groups), request_timeout=timeout_s).items() if groups else []
    ):
        try:
            states[group] = future.result(timeout=timeout_s).state.name
        except KafkaException as exc:
            states[group] = None
            errors.append(f"describe group {group}: {_text(exc)}")

    committed: dict[tuple[str, str, int], int | None] = {}
    for group in sorted(groups):
        for topic in sorted(watched.get(group, ())):
            if topic not in partitions_of:
                errors.append(f"topic {topic} read by group {group} does not exist on {cluster}")
                continue
            for partition in partitions_of[topic]:
                committed[(group, topic, partition)] = None  # watched partitions appear even before any commit
        try:
            request = ConsumerGroupTopicPartitions(group)
            result = admin.list_consumer_group_offsets([request], request_timeout=timeout_s)[group].result(
                timeout=timeout_s
            )
        except KafkaException as exc:
            errors.append(f"committed offsets of group {group}: {_text(exc)}")
            continue
        for tp in result.topic_partitions or []:
            if tp.error is not None:
                errors.append(f"committed offset of group {group} on {tp.topic}[{tp.partition}]: {tp.error}")
            elif tp.topic in partitions_of:
                committed[(group, tp.topic, tp.partition)] = None if tp.offset == _NO_OFFSET else tp.offset

    positions = sorted({(topic, partition) for _, topic, partition in committed})
    earliest, latest = OffsetSpec.earliest(), OffsetSpec.latest()  # type: ignore[no-untyped-call]  # untyped stubs
    log_start = _list_offsets(admin, positions, earliest, timeout_s, errors)
    log_end = _list_offsets(admin, positions, latest, timeout_s, errors)
    retention = _retention(admin, sorted({topic for topic, _ in positions}), timeout_s, errors)

    rows = [
        PartitionSnapshot(
            snapshot_ms,
            cluster,
            group,
            topic,
            partition,
            offset,
            log_start.get((topic, partition)),
            log_end.get((topic, partition)),
            states.get(group),
            retention.get(topic),
        )
        for (group, topic, partition), offset in sorted(committed.items())
    ]
    run = SnapshotRun(
        snapshot_ms, cluster, len(groups), len(rows), int((time.monotonic() - started) * 1000), tuple(errors)
    )
    return run, rows


def _list_offsets(
    admin: AdminClient, positions: list[tuple[str, int]], spec: OffsetSpec, timeout_s: float, errors: list[str]
) -> dict[tuple[str, int], int]:
    if not positions:
        return {}
    found: dict[tuple[str, int], int] = {}
    request = {TopicPartition(topic, partition): spec for topic, partition in positions}
    for tp, future in admin.list_offsets(request, request_timeout=timeout_s).items():
        try:
            found[(tp.topic, tp.partition)] = future.result(timeout=timeout_s).offset
        except KafkaException as exc:
            errors.append(f"list offsets of {tp.topic}[{tp.partition}]: {_text(exc)}")
    return found


def _retention(admin: AdminClient, topics: list[str], timeout_s: float, errors: list[str]) -> dict[str, int]:
    if not topics:
        return {}
    found: dict[str, int] = {}
    resources = [ConfigResource(ResourceType.TOPIC, topic) for topic in topics]
    for resource, future in admin.describe_configs(resources, request_timeout=timeout_s).items():
        try:
            entry = future.result(timeout=timeout_s).get("retention.ms")
        except KafkaException as exc:
            errors.append(f"configs of topic {resource.name}: {_text(exc)}")
            continue
        if entry is not None and entry.value is not None:
            found[resource.name] = int(entry.value)
    return found


def _text(exc: KafkaException) -> str:
    return exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else str(exc)
