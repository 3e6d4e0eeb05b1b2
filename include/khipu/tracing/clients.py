"""Traced confluent-kafka clients: a one-line swap for ``Producer`` and ``Consumer``.

    producer = TracedProducer(conf, emitter=emitter, stream="orders", sampling_percent=10)
    consumer = TracedConsumer(conf, emitter=emitter)

The producer assigns (or takes) a message id, decides sampling from the id, carries the id in
record headers and emits a SENT trace only from a successful delivery report, stamped with the record's
own timestamp and saying what Kafka's transactions and compaction need: the short hash of its key,
whether its value is null, whether the producer is transactional (its transactions work unchanged:
``init_transactions`` .. ``commit_transaction`` / ``abort_transaction`` are the client's own). The consumer
emits a RECEIVED trace for every traced record that ``poll``/``consume`` returns, and flushes
pending traces before committing offsets (Inca lost traces on restarts without this).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from functools import partial
from itertools import compress
from typing import Any

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, Message, Producer, TopicPartition

from khipu.trace.keys import key_hash
from khipu.trace.names import NAME_PATTERN, NAME_RULE
from khipu.trace.sampling import SAMPLING_BUCKETS, MessageIds, sampling_bucket, sampling_threshold
from khipu.tracing.config import TracingConfigError
from khipu.tracing.emitter import TraceEmitter
from khipu.tracing.headers import (
    HEADER_TRACE,
    RESEND_HEADERS,
    TRACE_HEADERS,
    Headers,
    HeaderValue,
    TraceContext,
    new_context,
    read_headers,
    trace_context,
    trace_header_tail,
)

DeliveryCallback = Callable[[KafkaError | None, Message], None]
_Traced = tuple[TraceContext, str, int, int, Mapping[str, str] | None]  # a record to trace: where it was, its mark
_HEADERS_OF = Message.headers  # the C method: mapped over a batch, no Python frame per record


class TracedProducer(Producer):  # type: ignore[misc]  # confluent-kafka's C type has no stubs
    """A ``confluent_kafka.Producer`` that traces sampled messages.

    With ``stream`` set it is a *source*. A message produced with ``message_id=`` is traced when
    that id falls in the stream's sample; without one, the producer draws the sampling decision
    and gives each sampled message a new id (unsampled messages need none and get none).
    Records whose ``headers`` already carry a trace context (see :func:`carry_trace_headers`)
    are traced as a processor's output whatever ``stream`` is. Other records pass through.
    """

    _produce = Producer.produce  # the C method, called directly on the hot path

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        emitter: TraceEmitter,
        stream: str | None = None,
        sampling_percent: float = 100.0,
        cluster: str | None = None,
    ) -> None:
        super().__init__(dict(config))
        if stream is not None and not (isinstance(stream, str) and NAME_PATTERN.match(stream)):
            raise TracingConfigError("stream", stream, NAME_RULE)  # the trace header separates its fields by spaces
        if (
            isinstance(sampling_percent, bool)
            or not isinstance(sampling_percent, (int, float))
            or not 0 <= sampling_percent <= 100
        ):
            raise TracingConfigError("sampling_percent", sampling_percent, "a number in [0, 100]")
        self._emitter = emitter
        self._stream = stream
        self._sampling_percent = float(sampling_percent)
        self._threshold = sampling_threshold(sampling_percent)
        # A draw below this cut samples the message (and is its bucket); -1 never samples.
        self._cut = self._threshold / SAMPLING_BUCKETS if stream is not None else -1.0
        self._random = random.Random().random
        self._cluster = cluster or emitter.config.cluster
        self._ids = MessageIds()
        # the delivery report of a traced record, less what is its own (a partial per record adds that). It holds no
        # reference to the producer, so a producer dropped with records in flight is freed like any other. Its SENT
        # traces say whether the producer is transactional: a transaction may abort.
        self._report = partial(_report_delivery, emitter.sent, self._cluster, bool(config.get("transactional.id")))
        self._header_tail = "" if stream is None else trace_header_tail(stream, self._sampling_percent)

    def produce(  # type: ignore[override]  # same parameters plus keyword-only extras; returns the id
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = -1,
        callback: DeliveryCallback | None = None,
        on_delivery: DeliveryCallback | None = None,
        timestamp: int = 0,
        headers: Headers | None = None,
        *,
        message_id: str | None = None,
        attributes: Mapping[str, str] | None = None,
    ) -> str | None:
        """Produce like ``Producer.produce`` (same parameters, same order); return the message id,
        or ``None`` for an untraced record the application gave no id."""
        if on_delivery is None:
            on_delivery = callback
        if headers is None and message_id is None and partition == -1 and timestamp == 0:
            draw = self._random()
            if draw >= self._cut:  # the common case: not sampled, nothing to add
                self._produce(topic, value, key, on_delivery=on_delivery)
                return None
            # sampled: what _produce_traced does, inlined for the case every source producer takes
            message_id = self._ids.with_bucket(int(draw * SAMPLING_BUCKETS))
            report = partial(
                self._report, new_context((message_id, self._stream, self._sampling_percent)), attributes,
                None if key is None else key_hash(key) if isinstance(key, (bytes, str)) else None, value is None,
                on_delivery,
            )  # fmt: skip
            self._produce(
                topic,
                value,
                key,
                on_delivery=report,
                headers=[(HEADER_TRACE, (message_id + self._header_tail).encode())],
            )
            return message_id
        if headers:
            headers = _without_resend_marks(headers)  # an application forwarding a resent record's headers whole
        carried = trace_context(headers) if headers else None
        context = carried or self._source_context(message_id)
        if context is None:
            self._produce(
                topic,
                value,
                key,
                partition=partition,
                on_delivery=on_delivery,
                timestamp=timestamp,
                headers=_as_client_headers(headers),
            )
            return message_id
        return self._produce_traced(
            topic, value, key, partition, on_delivery, timestamp, headers, context, carried is None, attributes
        )

    def _source_context(self, message_id: str | None) -> TraceContext | None:
        """The trace context of a message this source writes, or ``None`` when it is not sampled."""
        if self._stream is None:
            return None
        if message_id is None:
            message_id = self._ids.new_if_sampled(self._threshold)
        elif sampling_bucket(message_id) >= self._threshold:
            return None
        return None if message_id is None else TraceContext(message_id, self._stream, self._sampling_percent)

    def _produce_traced(
        self,
        topic: str,
        value: Any,
        key: Any,
        partition: int,
        on_delivery: DeliveryCallback | None,
        timestamp: int,
        headers: Headers | None,
        context: TraceContext,
        add_headers: bool,
        attributes: Mapping[str, str] | None,
    ) -> str:
        """Produce a traced record; its delivery report emits the SENT trace. The key's hash and whether the value
        is null are taken here (the report's ``key()`` and ``value()`` would copy them again).

        This runs once per traced message, and what it hands the client lives until the broker acknowledges the
        record, among thousands in flight: the report is one ``partial`` (two objects for the garbage collector to
        track), where a closure was a function and a cell per captured name. ``produce`` inlines this for a sampled
        record of its own stream: change the two together."""
        message_id = context.message_id
        if add_headers:
            trace_headers = [(HEADER_TRACE, (message_id + self._header_tail).encode())]
            headers = _with_headers(headers, trace_headers) if headers else trace_headers
        report = partial(
            self._report, context, attributes, key_hash(key) if isinstance(key, (bytes, str)) else None,
            value is None, on_delivery,
        )  # fmt: skip
        self._produce(
            topic, value, key, partition=partition, on_delivery=report, timestamp=timestamp,
            headers=_as_client_headers(headers),
        )  # fmt: skip
        return message_id

    def commit_transaction(self, *args: Any, **kwargs: Any) -> Any:
        """Flush pending traces (bounded), then commit as ``Producer.commit_transaction`` does: an exactly-once
        processor's consumer offsets commit with its transaction (``send_offsets_to_transaction``), so its RECEIVED
        traces go out before, as :meth:`TracedConsumer.commit` sends them before a commit."""
        self._emitter.flush_before_commit()
        return super().commit_transaction(*args, **kwargs)

    def flush(self, timeout: float = -1) -> int:
        """Flush the records, then the traces their delivery reports produced."""
        remaining = int(super().flush(timeout) if timeout >= 0 else super().flush())
        self._emitter.flush(None if timeout < 0 else min(timeout, self._emitter.config.close_timeout_s))
        return remaining


def _report_delivery(
    sent: Callable[..., None],
    cluster: str,
    transactional: bool,
    context: TraceContext,
    attributes: Mapping[str, str] | None,
    hashed_key: str | None,
    tombstone: bool,
    on_delivery: DeliveryCallback | None,
    err: KafkaError | None,
    msg: Message,
) -> None:
    """A traced record's delivery report: the SENT trace on success (``sent``: the emitter's), then the application's
    own callback. Partialled once per producer (``sent``, ``cluster``, ``transactional``) and once per record."""
    if err is None:
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()  # acks=0: no offset
        if topic is not None and partition is not None and offset is not None and offset >= 0:
            kind, stamped = msg.timestamp()  # the record's CreateTime, or the broker's LogAppendTime
            sent(
                context, cluster, topic, partition, offset, attributes,
                stamped if kind != TIMESTAMP_NOT_AVAILABLE else None, hashed_key, tombstone, transactional,
            )  # fmt: skip
    if on_delivery is not None:
        on_delivery(err, msg)


def _without_resend_marks(headers: Headers) -> Headers:
    """The headers without Khipu's resend mark: what an application writes is never itself a resend."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    if not any(name in RESEND_HEADERS for name, _ in pairs):
        return headers
    return [(name, value) for name, value in pairs if name not in RESEND_HEADERS]


def _as_client_headers(headers: Headers | None) -> dict[str, HeaderValue] | list[tuple[str, HeaderValue]] | None:
    """The header shapes confluent-kafka accepts: a dict or a list of pairs."""
    if headers is None or isinstance(headers, (dict, list)):
        return headers
    return dict(headers) if isinstance(headers, Mapping) else list(headers)


def _with_headers(headers: Headers, trace_headers: list[tuple[str, bytes]]) -> list[tuple[str, Any]]:
    existing = headers.items() if isinstance(headers, Mapping) else headers
    return [*((n, v) for n, v in existing if n not in TRACE_HEADERS), *trace_headers]


class TracedConsumer(Consumer):  # type: ignore[misc]  # confluent-kafka's C type has no stubs
    """A ``confluent_kafka.Consumer`` that emits RECEIVED traces for traced records.

    ``group.id`` is required: a RECEIVED trace says which group received the record.

    A record Khipu resent for a confirmed loss at one group's read hop (header ``khipu-resend-target``)
    reaches that group only: the others' ``poll``/``consume`` pass over it silently and trace nothing
    (they had the message). Its RECEIVED trace carries the resend id and lost hop as attributes, which is
    how the detector tells the resend from a duplicate. An untraced consumer sees the resent record like
    any other (see docs/resend.md).
    With ``enable.auto.commit`` the commit runs in librdkafka's background and cannot wait
    for the traces; the detector's grace period covers that, but explicit commits are safer.
    """

    def __init__(self, config: Mapping[str, Any], *, emitter: TraceEmitter, cluster: str | None = None) -> None:
        group = config.get("group.id")
        if not isinstance(group, str) or not group:
            raise TracingConfigError("group.id", group, "a consumer group id: RECEIVED traces name the group")
        super().__init__(dict(config))
        self._emitter = emitter
        self._emit_received = emitter.received
        self._group = group
        self._cluster = cluster or emitter.config.cluster
        # librdkafka reads read_committed unless told otherwise (the Java client's default is read_uncommitted)
        self._read_uncommitted = config.get("isolation.level") == "read_uncommitted"
        # per partition: the offsets passed over since the last record handed to the application [from, to)
        self._passed: dict[tuple[str, int], tuple[int, int]] = {}
        self._committed_to: dict[tuple[str, int], int] = {}  # per partition: the application's last explicit commit

    @property
    def group_id(self) -> str:
        return self._group

    def poll(self, timeout: float | None = None) -> Message | None:
        """Like ``Consumer.poll``; a record Khipu resent for another group is passed over (see the class doc)."""
        wait = -1.0 if timeout is None or timeout < 0 else float(timeout)
        deadline = time.monotonic() + wait
        while True:
            msg = super().poll(wait)
            if msg is None or (not self._passed and not msg.headers()) or msg.error() is not None:
                return msg
            traced: list[_Traced] = []
            taken = self._take(msg, traced)
            if traced:
                self._emit(traced)
            if taken:
                return msg
            if wait >= 0:
                wait = max(0.0, deadline - time.monotonic())
                if wait == 0.0:
                    return None

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        """Like ``Consumer.consume``, without the records Khipu resent for other groups.

        Only records with headers can be traced or resent: those are found by the client's own code
        (``compress``/``map`` over the C method), so a record that is neither costs no Python per record. The
        records one call returns were received together: their RECEIVED traces go to the emitter in one call, with
        one clock reading."""
        messages: list[Message] = super().consume(num_messages, timeout)
        traced: list[_Traced] = []
        take = self._take
        if self._passed:  # passing over a run of resent records: every record counts (it ends the run)
            messages = [msg for msg in messages if msg.error() is not None or take(msg, traced)]
        else:
            for index in compress(range(len(messages)), map(_HEADERS_OF, messages)):
                if not take(messages[index], traced):  # resent for another group: the rest the careful way
                    kept = messages[:index]
                    kept.extend(msg for msg in messages[index + 1 :] if msg.error() is not None or take(msg, traced))
                    messages = kept
                    break
        if traced:
            self._emit(traced)
        return messages

    def _emit(self, traced: list[_Traced]) -> None:
        self._emit_received(self._cluster, self._group, self._read_uncommitted, None, traced)

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        """Flush pending traces (bounded), then commit as ``Consumer.commit`` does. An explicit commit up to a run
        of records passed over (resent for other groups) commits past them, so that the group's lag does not
        stay at one after the last record of a quiet partition was such a resend."""
        self._emitter.flush_before_commit()
        message = kwargs.get("message") or (args[0] if args and isinstance(args[0], Message) else None)
        if message is not None:
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            if topic is None or partition is None or offset is None:  # not a record: let the client say so
                return super().commit(*args, **kwargs)
            where, next_offset = (topic, partition), offset + 1
            self._committed_to[where] = next_offset
            passed = self._passed.get(where)
            if passed is None or passed[0] != next_offset:
                return super().commit(*args, **kwargs)  # as it was asked (the message's leader epoch included)
            kwargs.pop("message", None)
            args = args[1:] if args and args[0] is message else args
            kwargs["offsets"] = [TopicPartition(where[0], where[1], next_offset)]
        if self._passed and kwargs.get("offsets"):
            kwargs["offsets"] = [self._past_passed(tp) for tp in kwargs["offsets"]]
        for tp in kwargs.get("offsets") or ():
            self._committed_to[(tp.topic, tp.partition)] = tp.offset
        return super().commit(*args, **kwargs)

    def _past_passed(self, tp: TopicPartition) -> TopicPartition:
        passed = self._passed.get((tp.topic, tp.partition))
        if passed is not None and tp.offset == passed[0]:
            return TopicPartition(tp.topic, tp.partition, passed[1])
        return tp

    def close(self) -> None:
        self._emitter.flush_before_commit()
        super().close()

    def _take(self, msg: Message, traced: list[_Traced]) -> bool:
        """Add a traced record this group takes to ``traced``; False for a record resent only for another group
        (no trace: the group never had it)."""
        context, mark = read_headers(msg.headers())
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        if mark is not None:
            if mark.target_group is not None and mark.target_group != self._group:
                if topic is not None and partition is not None and offset is not None:
                    self._pass_over(topic, partition, offset)
                return False
            attributes: dict[str, str] | None = mark.as_attributes()
        else:
            attributes = None
        if self._passed and topic is not None and partition is not None:
            self._passed.pop((topic, partition), None)
        if context is not None and topic is not None and partition is not None and offset is not None:
            traced.append((context, topic, partition, offset, attributes))
        return True

    def _pass_over(self, topic: str, partition: int, offset: int) -> None:
        """A record resent for another group: extend the run of records passed over on its partition, and commit
        past it when the application had committed up to the run."""
        passed = self._passed.get((topic, partition))
        start = passed[0] if passed and passed[1] == offset else offset
        self._passed[(topic, partition)] = (start, offset + 1)
        if self._committed_to.get((topic, partition)) == start:  # the application committed up to it
            super().commit(offsets=[TopicPartition(topic, partition, offset + 1)], asynchronous=True)
            self._committed_to[(topic, partition)] = offset + 1
