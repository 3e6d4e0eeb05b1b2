"""The one place Khipu asks a Kafka cluster about itself: topics, groups, offsets, retention.

Standard Kafka admin calls only (Metadata, CreateTopics, ListConsumerGroups, DescribeConsumerGroups,
OffsetFetch, ListOffsets, DescribeConfigs, DeleteRecords). Whole-call failures raise
:class:`~khipu.kafka.connection.KafkaUnavailable` naming the cluster; per-item failures of a
batch call are returned to the caller as text, so one bad group or topic does not hide the rest.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    OffsetSpec,
    ResourceType,
)

from khipu.kafka.connection import KafkaConnection, KafkaUnavailable

T = TypeVar("T")
# Khipu's trace topic is stamped by the broker: how far the detector has read it is then a broker time, whatever
# the clocks of the applications writing traces (docs/detector.md, "Time")
TRACE_TOPIC_CONFIG = {"message.timestamp.type": "LogAppendTime"}
NO_OFFSET = -1001  # librdkafka's OFFSET_INVALID: the group has no commit for the partition
Position = tuple[str, int]  # (topic, partition)


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """A consumer group as the broker describes it: state, members, and the partitions assigned to them."""

    group: str
    state: str | None  # STABLE, EMPTY, PREPARING_REBALANCE, ..., None when unknown
    members: int
    assigned: frozenset[Position]


@dataclass(frozen=True, slots=True)
class TopicRetention:
    """How a topic keeps its records: ``retention.ms`` and ``retention.bytes`` (-1: unlimited), its
    ``cleanup.policy`` (delete, compact, or both) and how long compaction keeps a tombstone
    (``delete.retention.ms``)."""

    retention_ms: int | None
    retention_bytes: int | None
    cleanup_policy: frozenset[str] = frozenset({"delete"})
    delete_retention_ms: int | None = None

    @property
    def compacted(self) -> bool:
        """Compaction removes records of this topic behind later ones of their key."""
        return "compact" in self.cleanup_policy


# what a group coordinator answers while it loads its groups (a broker just started) or moves: ask again
COORDINATOR_SETTLING = frozenset(
    {KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR}
)


def group_partition(group: str, partitions: int) -> int:
    """The partition of ``__consumer_offsets`` whose leader coordinates ``group``: Kafka's
    ``Utils.abs(group.hashCode()) % partitions``, with Java's ``String.hashCode`` over UTF-16 code units."""
    if partitions < 1:
        raise ValueError(f"__consumer_offsets has at least one partition, not {partitions}")
    units = group.encode("utf-16-be")
    code = 0
    for i in range(0, len(units), 2):
        code = (31 * code + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    signed = code - (1 << 32) if code & 0x80000000 else code
    return (0 if signed == -(1 << 31) else abs(signed)) % partitions


def one_group_per_coordinator(partitions: int, prefix: str = "khipu-coordinator-probe-") -> list[str]:
    """Group names that land one on each partition of ``__consumer_offsets``, in partition order: asking each
    for its offsets reaches every group coordinator of the cluster."""
    chosen: dict[int, str] = {}
    n = 0
    while len(chosen) < partitions:
        chosen.setdefault(group_partition(f"{prefix}{n}", partitions), f"{prefix}{n}")
        n += 1
    return [chosen[p] for p in range(partitions)]


@dataclass(frozen=True, slots=True)
class Results(Generic[T]):
    """A batch call's answers per item, and what failed (one line per item)."""

    found: dict[Any, T]
    errors: tuple[str, ...] = ()


class KafkaAdmin:
    """Admin requests to one cluster (a :class:`KafkaConnection`); ``timeout_s`` bounds each request."""

    def __init__(self, connection: KafkaConnection, timeout_s: float = 15.0) -> None:
        self.connection, self.timeout_s = connection, timeout_s
        self._client_errors: deque[str] = deque(maxlen=8)  # what librdkafka said about the connection lately
        config: dict[str, Any] = {**connection.client_config(), "socket.connection.setup.timeout.ms": 5000}
        config["error_cb"] = lambda error: self._client_errors.append(error.str())
        self._client = AdminClient(config)

    def _unavailable(self, what: str, exc: KafkaException) -> KafkaUnavailable:
        return KafkaUnavailable(f"cannot {what} on {self.connection.describe()}: {error_text(exc)}{self._why()}")

    def _why(self) -> str:
        """The client's own account of a failed connection (a refused login, a TLS error), when it has one:
        a request only says "transport failure"."""
        self._client.poll(0)
        telling = [e for e in self._client_errors if "brokers are down" not in e]
        return f" ({telling[-1].split(': ', 1)[-1]})" if telling else ""

    # -- topics ---------------------------------------------------------------------------------------

    def partitions(self) -> dict[str, list[int]]:
        """Every topic and its partitions (raises when the cluster cannot be reached)."""
        try:
            metadata = self._client.list_topics(timeout=self.timeout_s)
        except KafkaException as exc:
            raise KafkaUnavailable(
                f"cannot reach {self.connection.describe()}: {error_text(exc)}{self._why()}"
            ) from None
        return {name: sorted(meta.partitions) for name, meta in metadata.topics.items() if meta.error is None}

    def ensure_topics(
        self, partitions_by_topic: Mapping[str, int], configs: Mapping[str, Mapping[str, str]] | None = None
    ) -> list[str]:
        """Create the topics that do not exist yet (replication: the broker's default); return those created."""
        existing = set(self.partitions())
        missing = [
            NewTopic(name, partitions, replication_factor=-1, config=dict((configs or {}).get(name, {})))
            for name, partitions in partitions_by_topic.items()
            if name not in existing
        ]
        if not missing:
            return []
        created = []
        for name, future in self._client.create_topics(missing, operation_timeout=self.timeout_s).items():
            try:
                future.result(timeout=self.timeout_s)
                created.append(name)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise self._unavailable(f"create topic {name!r}", exc) from None
        return created

    def ensure_trace_topic(self, topic: str, partitions: int) -> str:
        """Create Khipu's trace topic stamped by the broker (:data:`TRACE_TOPIC_CONFIG`), or set an existing one
        so; returns what was done, in words."""
        if self.ensure_topics({topic: partitions}, {topic: TRACE_TOPIC_CONFIG}):
            return f"created {topic} ({partitions} partitions, LogAppendTime)"
        if self.timestamp_type(topic) == TRACE_TOPIC_CONFIG["message.timestamp.type"]:
            return f"{topic} exists, stamped by the broker (LogAppendTime)"
        resource = ConfigResource(
            ResourceType.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
                for name, value in TRACE_TOPIC_CONFIG.items()
            ],
        )
        for future in self._client.incremental_alter_configs([resource], request_timeout=self.timeout_s).values():
            try:
                future.result(timeout=self.timeout_s)
            except KafkaException as exc:
                raise self._unavailable(f"set message.timestamp.type=LogAppendTime on topic {topic!r}", exc) from None
        return f"{topic} exists; set it to be stamped by the broker (LogAppendTime)"

    def timestamp_type(self, topic: str) -> str | None:
        """The topic's ``message.timestamp.type`` (CreateTime or LogAppendTime); None when it cannot be read."""
        resource = ConfigResource(ResourceType.TOPIC, topic)
        for future in self._client.describe_configs([resource], request_timeout=self.timeout_s).values():
            try:
                entry = future.result(timeout=self.timeout_s).get("message.timestamp.type")
            except KafkaException:
                return None
            return None if entry is None else str(entry.value)
        return None

    def retention(self, topics: Iterable[str]) -> Results[TopicRetention]:
        resources = [ConfigResource(ResourceType.TOPIC, topic) for topic in sorted(set(topics))]
        if not resources:
            return Results({})
        found: dict[Any, TopicRetention] = {}
        errors: list[str] = []
        for resource, future in self._client.describe_configs(resources, request_timeout=self.timeout_s).items():
            try:
                entries = future.result(timeout=self.timeout_s)
            except KafkaException as exc:
                errors.append(f"configs of topic {resource.name}: {error_text(exc)}")
                continue
            policy = entries.get("cleanup.policy")
            policies = frozenset(p.strip() for p in (policy.value if policy and policy.value else "delete").split(","))
            found[resource.name] = TopicRetention(
                _int_config(entries, "retention.ms"),
                _int_config(entries, "retention.bytes"),
                policies,
                _int_config(entries, "delete.retention.ms"),
            )
        return Results(found, tuple(errors))

    # -- offsets --------------------------------------------------------------------------------------

    def watermarks(self, positions: Iterable[Position]) -> Results[tuple[int, int]]:
        """(log-start offset, log-end offset) per partition (ListOffsets earliest / latest)."""
        wanted = sorted(set(positions))
        if not wanted:
            return Results({})
        errors: list[str] = []
        starts = self._list_offsets(wanted, OffsetSpec.earliest(), errors)  # type: ignore[no-untyped-call]
        ends = self._list_offsets(wanted, OffsetSpec.latest(), errors)  # type: ignore[no-untyped-call]
        found: dict[Any, tuple[int, int]] = {tp: (starts[tp], ends[tp]) for tp in wanted if tp in starts and tp in ends}
        return Results(found, tuple(errors))

    def stable_offsets(self, positions: Iterable[Position]) -> Results[int]:
        """The last stable offset per partition (ListOffsets latest, read_committed): records from there on may
        belong to a transaction not decided yet, and no read_committed consumer reads past it."""
        wanted = sorted(set(positions))
        errors: list[str] = []
        found = (
            self._list_offsets(wanted, OffsetSpec.latest(), errors, IsolationLevel.READ_COMMITTED)  # type: ignore[no-untyped-call]
            if wanted
            else {}
        )
        return Results(dict(found), tuple(errors))

    def log_starts(self, positions: Iterable[Position]) -> Results[int]:
        wanted = sorted(set(positions))
        errors: list[str] = []
        found = self._list_offsets(wanted, OffsetSpec.earliest(), errors) if wanted else {}  # type: ignore[no-untyped-call]
        return Results(dict(found), tuple(errors))

    def _list_offsets(
        self,
        positions: list[Position],
        spec: OffsetSpec,
        errors: list[str],
        isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    ) -> dict[Position, int]:
        found: dict[Position, int] = {}
        request = {TopicPartition(topic, partition): spec for topic, partition in positions}
        answers = self._client.list_offsets(request, isolation_level=isolation, request_timeout=self.timeout_s)
        for tp, future in answers.items():
            try:
                found[(tp.topic, tp.partition)] = future.result(timeout=self.timeout_s).offset
            except KafkaException as exc:
                errors.append(f"list offsets of {tp.topic}[{tp.partition}]: {error_text(exc)}")
            except TimeoutError:
                errors.append(
                    f"list offsets of {tp.topic}[{tp.partition}]: no answer within {self.timeout_s:g} s{self._why()}"
                )
        return found

    def record_times(self, topic: str, offsets: Mapping[int, int]) -> Results[tuple[int, int]]:
        """Per partition of ``topic``, the first record at or after the given offset: (its offset, its timestamp in
        ms: the broker's append time on a LogAppendTime topic, the producer's on a CreateTime one). One fetch per
        partition, as a read_uncommitted consumer of the group ``khipu-record-times`` that never joins it nor
        commits; an offset the broker no longer has is read from the log start on. A partition with no record there
        within ``timeout_s`` is among the errors."""
        if not offsets:
            return Results({})
        config: dict[str, Any] = {
            **self.connection.client_config(),
            "group.id": "khipu-record-times",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_uncommitted",
            "fetch.message.max.bytes": 1024,  # the broker still returns a whole record batch: the first is enough
            "socket.connection.setup.timeout.ms": 5000,
            "error_cb": lambda error: self._client_errors.append(error.str()),
        }
        wanted = dict(offsets)
        found: dict[Any, tuple[int, int]] = {}
        failed: dict[int, str] = {}
        reader = Consumer(config)
        try:
            reader.assign([TopicPartition(topic, partition, offset) for partition, offset in sorted(wanted.items())])
            deadline = time.monotonic() + self.timeout_s
            while len(found) + len(failed) < len(wanted) and time.monotonic() < deadline:
                message = reader.poll(0.2)
                partition = None if message is None else message.partition()
                if message is None or partition not in wanted or partition in found or partition in failed:
                    continue
                error = message.error()
                if error is not None:
                    eof = error.code() == KafkaError._PARTITION_EOF
                    failed[partition] = "no record there" if eof else error.str()
                elif (offset := message.offset()) is not None and offset >= wanted[partition]:
                    found[partition] = (offset, message.timestamp()[1])
                    reader.pause([TopicPartition(topic, partition)])
        except KafkaException as exc:
            raise self._unavailable(f"read records of {topic!r}", exc) from None
        finally:
            reader.close()
        errors = [
            f"{topic}[{partition}] at or after offset {offset}: "
            + failed.get(partition, f"no record within {self.timeout_s:g} s{self._why()}")
            for partition, offset in sorted(wanted.items())
            if partition not in found
        ]
        return Results(found, tuple(errors))

    def delete_records(self, before: Mapping[Position, int]) -> dict[Position, int]:
        """Truncate each partition's log below the given offset (DeleteRecords); return the new log starts."""
        request = [TopicPartition(topic, partition, offset) for (topic, partition), offset in sorted(before.items())]
        result: dict[Position, int] = {}
        for tp, future in self._client.delete_records(request, request_timeout=self.timeout_s).items():
            try:
                result[(tp.topic, tp.partition)] = future.result(timeout=self.timeout_s).low_watermark
            except KafkaException as exc:
                raise self._unavailable(f"delete records of {tp.topic}[{tp.partition}]", exc) from None
        return result

    # -- groups ---------------------------------------------------------------------------------------

    def list_groups(self) -> list[str]:
        try:
            listing = self._client.list_consumer_groups(request_timeout=self.timeout_s).result(timeout=self.timeout_s)
        except KafkaException as exc:
            raise self._unavailable("list consumer groups", exc) from None
        return sorted(g.group_id for g in listing.valid)

    def describe_groups(self, groups: Iterable[str]) -> Results[GroupDescription]:
        wanted = sorted(set(groups))
        if not wanted:
            return Results({})
        found: dict[Any, GroupDescription] = {}
        errors: list[str] = []
        for group, future in self._client.describe_consumer_groups(wanted, request_timeout=self.timeout_s).items():
            try:
                described = future.result(timeout=self.timeout_s)
            except KafkaException as exc:
                errors.append(f"describe group {group}: {error_text(exc)}")
                continue
            assigned = frozenset(
                (tp.topic, tp.partition)
                for member in described.members or []
                if member.assignment is not None
                for tp in member.assignment.topic_partitions or []
            )
            state = getattr(described.state, "name", None)
            found[group] = GroupDescription(group, state, len(described.members or []), assigned)
        return Results(found, tuple(errors))

    def committed_offsets(self, group: str, positions: Iterable[Position] | None = None) -> dict[Position, int]:
        """The group's committed offset per partition it has a commit for, among ``positions`` (by default every
        partition of the cluster; a partition of a topic that does not exist has no commit). A coordinator
        that is still loading its groups (a broker just restarted) or moving is asked again within ``timeout_s``,
        as Kafka's own clients do; past it, or on any other error, :class:`KafkaUnavailable`."""
        deadline, pause_s = time.monotonic() + self.timeout_s, 0.1
        asked = None if positions is None else list(positions)  # asked again as it was on a retry
        while True:
            try:
                return self._committed_offsets(group, asked)
            except KafkaException as exc:
                error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                settling = error is not None and error.code() in COORDINATOR_SETTLING
                if not settling or time.monotonic() + pause_s >= deadline:
                    raise self._unavailable(f"fetch the committed offsets of group {group!r}", exc) from None
            time.sleep(pause_s)
            pause_s = min(1.0, 2 * pause_s)

    def _committed_offsets(self, group: str, positions: Iterable[Position] | None) -> dict[Position, int]:
        """OffsetFetch for ``positions``, asked by a consumer of ``group`` that never joins it.

        Not the admin call ListConsumerGroupOffsets: librdkafka (2.16.0 and earlier) crashes the whole process when
        that call's answer is NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS, as a coordinator gives right after
        a broker starts or moves (confluentinc/librdkafka#5040; tests/integration/test_broker.py met it). A
        consumer handles those answers itself, asking the new coordinator again within the timeout."""
        if positions is None:
            positions = [(topic, p) for topic, parts in sorted(self.partitions().items()) for p in parts]
        asked = [TopicPartition(topic, partition) for topic, partition in positions]
        if not asked:
            return {}
        config: dict[str, Any] = {
            **self.connection.client_config(),
            "group.id": group,
            "enable.auto.commit": False,
            # what is committed, as the admin call answered: a read_committed consumer asks for stable offsets only
            # and waits out every transactional commit still open (KIP-447), which a frozen processor holds open
            "isolation.level": "read_uncommitted",
            "socket.connection.setup.timeout.ms": 5000,
            "error_cb": lambda error: self._client_errors.append(error.str()),
        }
        asker = Consumer(config)
        try:
            answered = asker.committed(asked, timeout=self.timeout_s)
        except KafkaException as exc:
            error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if error is not None and error.code() == KafkaError._TIMED_OUT:  # a broker that holds it, e.g. frozen
                raise KafkaUnavailable(
                    f"cannot fetch the committed offsets of group {group!r} on {self.connection.describe()}: "
                    f"no answer within {self.timeout_s:g} s{self._why()}"
                ) from None
            raise
        finally:
            asker.close()
        return {
            (tp.topic, tp.partition): tp.offset
            for tp in answered
            if tp.error is None and tp.offset != NO_OFFSET  # a partition the group never committed
        }


def _int_config(entries: Mapping[str, Any], name: str) -> int | None:
    entry = entries.get(name)
    if entry is None or entry.value is None:
        return None
    return int(entry.value)


def error_text(exc: KafkaException) -> str:
    """librdkafka's own words for a failure."""
    return exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else str(exc)
