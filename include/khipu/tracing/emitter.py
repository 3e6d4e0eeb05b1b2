"""The trace emitter: sends traces to the trace topic without ever blocking or crashing the app.

It owns one idempotent ``acks=all`` producer. Its bounded queue is that producer's local queue
(``queue.buffering.max.messages``): when the trace channel is slow or down the queue fills,
further traces are dropped at once and counted, and the application carries on at full speed.
Traces that cannot be delivered within ``delivery_timeout_ms`` are counted as failed. Every
trace gets the next number of the emitter's sequence *before* any drop, so a later stage sees
the gap. Every RECEIVED trace points back to the emitter's previous ``BACK_POINTERS`` RECEIVED
offsets on its partition (``prev_offsets``), so the detector can tell a record whose trace was
lost (received: a later trace points at it) from a record the group skipped (nothing does). Every
``mark_interval_s`` while it has traced (and for ``mark_memory_s`` after), and on close, the
emitter publishes a mark with its next number and the newest offsets it received per partition:
a trace lost just before a quiet spell is then pointed at too.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from khipu.trace.codec import MAX_MARK_ENTRIES, encode_mark, encode_trace
from khipu.trace.model import NO_ATTRIBUTES, EmitterMark, Trace, TraceType
from khipu.tracing.config import TraceEmitterConfig
from khipu.tracing.headers import TraceContext

log = logging.getLogger(__name__)

_POLL_INTERVAL_S = 0.2
_WARN_INTERVAL_S = 60.0
BACK_POINTERS = 3  # previous RECEIVED offsets each trace points at: a run of this many lost traces is still told


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class EmitterStats:
    """Counters of one emitter. ``delivered`` is derived: accepted, not pending, not failed."""

    emitted: int  # traces the application asked for (each got a sequence number)
    accepted: int  # traces handed to the trace producer's queue
    dropped_queue_full: int  # dropped at once because the bounded queue was full
    dropped_invalid: int  # could not be built or encoded (a bug; logged)
    failed_delivery: int  # accepted, then not delivered within delivery_timeout_ms
    dropped_at_close: int  # still queued when close() gave up waiting
    pending: int  # in the queue right now

    @property
    def dropped(self) -> int:
        return self.dropped_queue_full + self.dropped_invalid + self.failed_delivery + self.dropped_at_close

    @property
    def delivered(self) -> int:
        return self.accepted - self.failed_delivery - self.dropped_at_close - self.pending


class TraceEmitter:
    """Builds traces for one location and publishes them to the trace topic."""

    def __init__(self, config: TraceEmitterConfig, *, clock_ms: Callable[[], int] = wall_clock_ms) -> None:
        self.config = config
        self.emitter_id = f"{config.location}-{secrets.token_hex(4)}"
        self._clock_ms = clock_ms
        self._location = config.location
        self._topic = config.topic
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._counts = {
            "accepted": 0,
            "dropped_queue_full": 0,
            "dropped_invalid": 0,
            "failed_delivery": 0,
            "dropped_at_close": 0,
        }
        self._emitted = 0
        self._marked_at_emitted = 0  # traces emitted when the last mark went out
        # partition -> its newest RECEIVED offsets (newest first), and when the newest was traced
        self._received: dict[tuple[str, str, int], tuple[tuple[int, ...], float]] = {}
        self._channel_healthy = True
        self._needs_new_producer = False
        self._last_warning = 0.0
        self._closed = threading.Event()
        self._producer = self._new_producer()
        self._poller = threading.Thread(target=self._poll_loop, name=f"khipu-emitter-{config.location}", daemon=True)
        self._poller.start()

    # -- what traced clients call ----------------------------------------------------------

    def emit_sent(
        self,
        context: TraceContext,
        cluster: str,
        topic: str,
        partition: int,
        offset: int,
        attributes: Mapping[str, str] | None = None,
        *,
        timestamp_ms: int | None = None,
        key_hash: str | None = None,
        tombstone: bool = False,
        transactional: bool = False,
    ) -> None:
        """Record that the broker acknowledged a traced write: ``timestamp_ms`` is the record's own timestamp from
        the acknowledgement (None: not known, the emitter's clock stands in), ``key_hash`` the short hash of its
        key (:func:`khipu.trace.keys.key_hash`), ``tombstone`` a null value, ``transactional`` written by a
        transactional producer."""
        self._emit(
            context, TraceType.SENT, cluster, topic, partition, offset, None, attributes,
            timestamp_ms, key_hash, tombstone, transactional,
        )  # fmt: skip

    def emit_received(
        self,
        context: TraceContext,
        cluster: str,
        topic: str,
        partition: int,
        offset: int,
        group: str,
        attributes: Mapping[str, str] | None = None,
        *,
        read_uncommitted: bool = False,
    ) -> None:
        """Record that consumer group ``group`` received a traced record (``attributes``: a resent record's mark;
        ``read_uncommitted``: the group reads with isolation.level=read_uncommitted)."""
        self._emit(
            context, TraceType.RECEIVED, cluster, topic, partition, offset, group, attributes,
            read_uncommitted=read_uncommitted,
        )  # fmt: skip

    def flush_before_commit(self) -> None:
        """Give pending traces a bounded chance to be delivered before offsets are committed.

        While the channel is unhealthy (a previous flush timed out) this returns at once, so a
        broken trace channel never slows the application's commits; it recovers when the queue
        drains.
        """
        producer = self._producer
        if self._channel_healthy:
            remaining = producer.flush(self.config.commit_flush_timeout_s)
            if remaining:
                self._channel_healthy = False
                log.warning(
                    "trace channel slow: %d traces still queued after %.1fs; commits no longer wait for it",
                    remaining,
                    self.config.commit_flush_timeout_s,
                )
        elif len(producer) == 0:
            self._channel_healthy = True
            log.info("trace channel recovered: queue drained")

    def flush(self, timeout_s: float | None = None) -> int:
        """Wait up to ``timeout_s`` for queued traces; return how many are still queued."""
        return int(self._producer.flush(self.config.close_timeout_s if timeout_s is None else timeout_s))

    def close(self) -> EmitterStats:
        """Flush (bounded by ``close_timeout_s``), stop, and return the final counters."""
        if self._closed.is_set():
            return self.stats()
        self._mark()
        self._closed.set()  # the poller stops first: from here on only this flush serves callbacks ...
        self._poller.join(timeout=2)
        remaining = self.flush()  # ... so a trace still queued after it was never counted as failed
        with self._lock:
            # the queue may also hold the emitter's own last mark, which is no trace: never count more
            # than the traces still outstanding
            outstanding = self._counts["accepted"] - self._counts["failed_delivery"] - self._counts["dropped_at_close"]
            self._counts["dropped_at_close"] += max(0, min(remaining, outstanding))
        stats = self.stats()
        level = logging.WARNING if stats.dropped else logging.INFO
        log.log(
            level,
            "trace emitter %s closed: %d emitted, %d delivered, %d dropped (queue full %d, failed %d, at close %d)",
            self.emitter_id,
            stats.emitted,
            stats.delivered,
            stats.dropped,
            stats.dropped_queue_full,
            stats.failed_delivery,
            stats.dropped_at_close,
        )
        return stats

    def stats(self) -> EmitterStats:
        pending = 0 if self._closed.is_set() else len(self._producer)
        with self._lock:
            return EmitterStats(emitted=self._emitted, pending=pending, **self._counts)

    def __enter__(self) -> TraceEmitter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------

    def _emit(
        self,
        context: TraceContext,
        trace_type: TraceType,
        cluster: str,
        topic: str,
        partition: int,
        offset: int,
        group: str | None,
        attributes: Mapping[str, str] | None,
        timestamp_ms: int | None = None,
        key_hash: str | None = None,
        tombstone: bool = False,
        transactional: bool = False,
        read_uncommitted: bool = False,
    ) -> None:
        seq = next(self._seq)
        prev_offsets: tuple[int, ...] = ()
        if trace_type is TraceType.RECEIVED:
            with self._lock:
                prev_offsets = self._received.get((cluster, topic, partition), ((), 0.0))[0]
                newest = (offset, *prev_offsets)[:BACK_POINTERS]
                self._received[(cluster, topic, partition)] = (newest, time.monotonic())
        try:
            outcome = self._publish(
                Trace(
                    context.message_id,
                    context.stream,
                    self._location,
                    cluster,
                    trace_type,
                    self._clock_ms() if timestamp_ms is None else timestamp_ms,
                    topic,
                    partition,
                    offset,
                    group,
                    self.emitter_id,
                    seq,
                    context.sampling_percent,
                    attributes or NO_ATTRIBUTES,
                    prev_offsets,
                    key_hash,
                    tombstone,
                    transactional,
                    read_uncommitted,
                )
            )
        except Exception as exc:  # tracing must never crash the application it observes
            outcome = "dropped_invalid"
            self._warn("trace for message %r dropped: %s: %s", context.message_id, type(exc).__name__, exc)
        with self._lock:
            self._emitted += 1
            self._counts[outcome] += 1

    def _publish(self, trace: Trace) -> str:
        """Hand one trace to the trace producer; return the counter it falls under."""
        if self._closed.is_set():
            return "dropped_at_close"
        if self._needs_new_producer:
            self._replace_producer()
        try:
            # stamped by the emitter's clock, as a trace record written on its host is (Khipu's trace topic has the
            # broker stamp it again: LogAppendTime)
            self._producer.produce(
                self._topic, encode_trace(trace), trace.message_id.encode(), timestamp=self._clock_ms()
            )
        except BufferError:
            self._channel_healthy = False
            self._warn(
                "trace queue full (%d traces): dropping traces until the trace channel catches up",
                self.config.queue_max_traces,
            )
            return "dropped_queue_full"
        except KafkaException as exc:
            self._warn("trace producer refused a trace: %s", exc.args[0] if exc.args else exc)
            return "failed_delivery"
        return "accepted"

    def _new_producer(self) -> Producer:
        settings: dict[str, Any] = {
            **self.config.producer_config,
            "bootstrap.servers": self.config.bootstrap_servers,
            "client.id": self.emitter_id,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 20,
            "queue.buffering.max.messages": self.config.queue_max_traces,
            "message.timeout.ms": self.config.delivery_timeout_ms,
            "delivery.report.only.error": True,
            "on_delivery": self._on_delivery_error,
            "error_cb": self._on_client_error,
            # librdkafka's own log repeats every failed connection attempt; errors reach us through
            # error_cb instead and are logged at most once a minute.
            "log_level": 2,
        }
        return Producer(settings)

    def _replace_producer(self) -> None:
        with self._lock:
            if not self._needs_new_producer:
                return
            old, self._producer = self._producer, self._new_producer()
            self._needs_new_producer = False
        lost = len(old)
        old.flush(0)
        self._count("failed_delivery", lost)
        log.warning("trace producer replaced after a fatal error; %d queued traces lost", lost)

    def _on_delivery_error(self, err: KafkaError | None, _msg: Any) -> None:
        if err is not None:  # only errors are reported (delivery.report.only.error)
            self._count("failed_delivery")
            self._channel_healthy = False
            self._warn("trace not delivered: %s", err.str())

    def _on_client_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._needs_new_producer = True
            log.error("trace producer fatal error: %s; it will be replaced", err.str())
        else:
            self._warn("trace channel error: %s", err.str())

    def _poll_loop(self) -> None:
        next_mark = time.monotonic() + self.config.mark_interval_s
        while not self._closed.is_set():
            self._producer.poll(_POLL_INTERVAL_S)
            if time.monotonic() >= next_mark:
                next_mark = time.monotonic() + self.config.mark_interval_s
                self._mark()

    def _mark(self) -> None:
        """Publish the emitter's next sequence number and where it received lately: when it traced since
        the last mark, or received within ``mark_memory_s`` (a lost mark is made good by the next)."""
        with self._lock:
            now = time.monotonic()
            memory = self.config.mark_memory_s
            recent = sorted(
                (
                    (at, -rank, (cluster, topic, partition, offset))
                    for (cluster, topic, partition), (offsets, at) in self._received.items()
                    if now - at <= memory
                    for rank, offset in enumerate(offsets)
                ),
                reverse=True,
            )
            if self._emitted == self._marked_at_emitted and not recent:
                return
            self._marked_at_emitted = self._emitted
        received = tuple(entry for _, _, entry in recent[:MAX_MARK_ENTRIES])
        mark = EmitterMark(self.emitter_id, self._location, next(self._seq), self._clock_ms(), received)
        try:
            self._producer.produce(
                self._topic, encode_mark(mark), self.emitter_id.encode(), on_delivery=self._on_mark_delivery
            )
        except (BufferError, KafkaException) as exc:
            self._warn("emitter mark not sent: %s", exc)

    def _on_mark_delivery(self, err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            self._warn("emitter mark not delivered: %s", err.str())

    def _count(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[name] += amount

    def _warn(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last_warning >= _WARN_INTERVAL_S:
            self._last_warning = now
            log.warning(message, *args)
