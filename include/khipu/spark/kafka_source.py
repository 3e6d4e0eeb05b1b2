"""A Spark streaming source that reads Kafka through confluent-kafka (format ``khipu_kafka``).

For clusters where Spark's JVM Kafka connector cannot be installed. It plans per-partition offset
ranges like Spark's own Kafka source, keeps its offsets in the Spark checkpoint (so a restarted
query reprocesses exactly from where it committed), and yields the same columns: key, value,
topic, partition, offset, timestamp, timestampType (and headers with ``includeHeaders``).

Options (Spark's Kafka source names): ``kafka.bootstrap.servers``, ``subscribe`` (comma
separated topics), ``startingOffsets`` (``earliest`` | ``latest`` | JSON), ``maxOffsetsPerTrigger``,
``failOnDataLoss`` (default true), ``includeHeaders`` (default false),
``kafkaConsumer.pollTimeoutMs`` (default 120000); any other ``kafka.*`` option is passed to
librdkafka (security settings, ...).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from khipu.spark.offsets import from_json_offsets, plan_end, to_json_offsets

KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int"
)
HEADERS_FIELD = "headers array<struct<key: string, value: binary>>"
_ARROW_FIELDS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
]
_HEADERS_ARROW = pa.field("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))
_TIMESTAMP_TYPES = {1: 0, 2: 1}  # librdkafka create / log-append time -> Spark's 0 / 1; none -> -1
_ROWS_PER_BATCH = 10_000


class KafkaSourceError(RuntimeError):
    """The Kafka stream source could not plan or read; the message says which topic, partition and offset."""


def _options(options: Mapping[str, str]) -> dict[str, Any]:
    bootstrap = options.get("kafka.bootstrap.servers")
    if not bootstrap:
        raise KafkaSourceError("option 'kafka.bootstrap.servers' is required (the cluster's host:port list)")
    topics = [t.strip() for t in options.get("subscribe", "").split(",") if t.strip()]
    if not topics:
        raise KafkaSourceError("option 'subscribe' is required (comma-separated topic names)")
    client = {k[len("kafka.") :]: v for k, v in options.items() if k.startswith("kafka.")}
    max_records = options.get("maxOffsetsPerTrigger")
    return {
        "client": client,
        "topics": topics,
        "starting": options.get("startingOffsets", "latest"),
        "max_records": int(max_records) if max_records else None,
        "fail_on_data_loss": options.get("failOnDataLoss", "true").lower() != "false",
        "include_headers": options.get("includeHeaders", "false").lower() == "true",
        "poll_timeout_s": int(options.get("kafkaConsumer.pollTimeoutMs", "120000")) / 1000,
    }


class KafkaStreamDataSource(DataSource):  # type: ignore[misc]
    @classmethod
    def name(cls) -> str:
        return "khipu_kafka"

    def schema(self) -> str:
        include_headers = self.options.get("includeHeaders", "false").lower() == "true"
        return f"{KAFKA_SCHEMA}, {HEADERS_FIELD}" if include_headers else KAFKA_SCHEMA

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        return KafkaStreamReader(_options(self.options))


class KafkaStreamReader(DataSourceStreamReader):  # type: ignore[misc]
    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self._metadata_consumer: Consumer | None = None
        self._latest: dict[str, dict[str, int]] | None = None

    # -- planning (driver) ------------------------------------------------------------------

    def _consumer(self) -> Consumer:
        if self._metadata_consumer is None:
            self._metadata_consumer = _new_consumer(self.settings["client"])
        return self._metadata_consumer

    def _watermarks(self) -> dict[tuple[str, int], tuple[int, int]]:
        consumer = self._consumer()
        marks: dict[tuple[str, int], tuple[int, int]] = {}
        for topic in self.settings["topics"]:
            try:
                metadata = consumer.list_topics(topic, timeout=30)
            except KafkaException as exc:
                raise KafkaSourceError(f"cannot list topic {topic!r}: {_text(exc)}") from None
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                reason = meta.error.str() if meta is not None and meta.error else "no partitions"
                raise KafkaSourceError(f"topic {topic!r} cannot be read: {reason}")
            for partition in sorted(meta.partitions):
                try:
                    low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
                except KafkaException as exc:
                    raise KafkaSourceError(f"watermarks of {topic}[{partition}]: {_text(exc)}") from None
                marks[(topic, partition)] = (int(low), int(high))
        return marks

    def initialOffset(self) -> dict[str, dict[str, int]]:
        starting = self.settings["starting"]
        marks = self._watermarks()
        if starting == "earliest":
            return to_json_offsets({tp: low for tp, (low, _) in marks.items()})
        if starting == "latest":
            return to_json_offsets({tp: high for tp, (_, high) in marks.items()})
        try:
            given = from_json_offsets(json.loads(starting))
        except (ValueError, AttributeError, TypeError):
            raise KafkaSourceError(
                f'startingOffsets: got {starting!r}; expected earliest, latest or {{"topic": {{"partition": offset}}}}'
            ) from None
        return to_json_offsets({tp: given.get(tp, low) for tp, (low, _) in marks.items()})

    def getDefaultReadLimit(self) -> ReadLimit:
        max_records = self.settings["max_records"]
        return ReadMaxRows(max_records) if max_records else ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, dict[str, int]]:
        begin = from_json_offsets(start)
        marks = self._watermarks()
        for tp, (low, _) in marks.items():
            begin.setdefault(tp, low)  # a partition added since the last batch: from its beginning
        latest = {tp: high for tp, (_, high) in marks.items()}
        self._latest = to_json_offsets(latest)
        max_records = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return to_json_offsets(plan_end(begin, latest, max_records))

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        """The topic's true end when the last batch was planned: with a rate limit the batch may stop short."""
        return self._latest

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, finish = from_json_offsets(start), from_json_offsets(end)
        return [
            InputPartition((topic, partition, begin.get((topic, partition), 0), stop))
            for (topic, partition), stop in sorted(finish.items())
            if stop > begin.get((topic, partition), stop)
        ]

    def commit(self, end: dict[str, Any]) -> None:
        """Offsets live in Spark's checkpoint; nothing is committed to Kafka."""

    def stop(self) -> None:
        if self._metadata_consumer is not None:
            self._metadata_consumer.close()
            self._metadata_consumer = None

    # -- reading (executors) ----------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        topic, number, start, end = partition.value
        return read_range(self.settings, topic, number, start, end)


_consumers: dict[str, Consumer] = {}  # one reading consumer per Python worker and client config


def _new_consumer(client: Mapping[str, str]) -> Consumer:
    return Consumer(
        {
            **client,
            "group.id": client.get("group.id", "khipu-stream-source"),
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "enable.partition.eof": False,
        }
    )


def read_range(
    settings: Mapping[str, Any], topic: str, partition: int, start: int, end: int
) -> Iterator[pa.RecordBatch]:
    """Yield the records at offsets [start, end) of one partition as Arrow batches of Spark's Kafka schema."""
    key = json.dumps(settings["client"], sort_keys=True)
    consumer = _consumers.get(key)
    if consumer is None:
        consumer = _consumers[key] = _new_consumer(settings["client"])
    consumer.assign([TopicPartition(topic, partition, start if start >= 0 else OFFSET_BEGINNING)])
    include_headers, poll_timeout_s = settings["include_headers"], settings["poll_timeout_s"]
    columns: dict[str, list[Any]] = {field.name: [] for field in _ARROW_FIELDS}
    if include_headers:
        columns["headers"] = []
    expected = start
    deadline = time.monotonic() + poll_timeout_s
    try:
        while expected < end:
            messages = consumer.consume(min(_ROWS_PER_BATCH, end - expected), 1.0)
            if not messages and time.monotonic() > deadline:
                raise KafkaSourceError(
                    f"no records from {topic}[{partition}] at offset {expected} (reading up to "
                    f"{end}) within {poll_timeout_s:g}s"
                )
            for msg in messages:
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaSourceError(f"reading {topic}[{partition}] at offset {expected}: {error.str()}")
                offset = msg.offset()
                if offset is None or offset < expected:
                    continue
                if offset >= end:
                    expected = end
                    break
                if offset > expected and settings["fail_on_data_loss"]:
                    raise KafkaSourceError(
                        f"data loss in {topic}[{partition}]: offsets {expected}..{offset - 1} are "
                        "gone (retention or truncation); set failOnDataLoss=false to skip them"
                    )
                _append(columns, msg, topic, partition, offset, include_headers)
                expected = offset + 1
            if messages:
                deadline = time.monotonic() + poll_timeout_s
            if len(columns["offset"]) >= _ROWS_PER_BATCH:
                yield _batch(columns, include_headers)
                columns = {name: [] for name in columns}
    finally:
        consumer.unassign()
    if columns["offset"]:
        yield _batch(columns, include_headers)


def _append(
    columns: dict[str, list[Any]], msg: Any, topic: str, partition: int, offset: int, include_headers: bool
) -> None:
    timestamp_type, timestamp_ms = msg.timestamp()
    columns["key"].append(msg.key())
    columns["value"].append(msg.value())
    columns["topic"].append(topic)
    columns["partition"].append(partition)
    columns["offset"].append(offset)
    columns["timestamp"].append(datetime.fromtimestamp(timestamp_ms / 1000, UTC) if timestamp_ms >= 0 else None)
    columns["timestampType"].append(_TIMESTAMP_TYPES.get(timestamp_type, -1))
    if include_headers:
        columns["headers"].append([{"key": k, "value": v} for k, v in (msg.headers() or [])])


def _batch(columns: dict[str, list[Any]], include_headers: bool) -> pa.RecordBatch:
    fields = [*_ARROW_FIELDS, _HEADERS_ARROW] if include_headers else _ARROW_FIELDS
    return pa.RecordBatch.from_arrays(
        [pa.array(columns[f.name], type=f.type) for f in fields], schema=pa.schema(fields)
    )


def _text(exc: KafkaException) -> str:
    return exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else str(exc)
