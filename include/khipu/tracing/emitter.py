"""The trace emitter: sends traces to the trace topic without ever blocking or crashing the app.

It owns one idempotent ``acks=all`` producer, and packs the traces it has ready into one trace-topic record, a
batch (:func:`khipu.trace.codec.encode_batch`): up to ``BATCH_MAX_TRACES`` traces or ``BATCH_MAX_BYTES``, or what
gathered in ``batch_linger_ms``. One record per trace cost the application more than the rest of tracing together
(bench/tracing_overhead.py). Its bounded queue counts traces, batched or in flight: when the trace channel is slow
or down the queue fills, further traces are dropped at once and counted, and the application carries on at full
speed. Traces that cannot be delivered within ``delivery_timeout_ms`` are counted as failed. Every
trace gets the next number of the emitter's sequence *before* any drop, so a later stage sees
the gap. Every RECEIVED trace points back to the emitter's previous ``BACK_POINTERS`` RECEIVED
offsets on its partition (``prev_offsets``), so the detector can tell a record whose trace was
lost (received: a later trace points at it) from a record the group skipped (nothing does). Every
``mark_interval_s`` while it has traced (and for ``mark_memory_s`` after), and on close, the
emitter publishes a mark with its next number and the newest offsets it received per partition:
a trace lost just before a quiet spell is then pointed at too.
"""

from __future__ import annotations

import functools
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from khipu.trace.codec import (
    BATCH_MAX_BYTES,
    BATCH_MAX_TRACES,
    MAX_MARK_ENTRIES,
    encode_batch,
    encode_mark,
    encode_trace,
)
from khipu.trace.model import NO_ATTRIBUTES, EmitterMark, Trace, TraceType
from khipu.tracing.config import TraceEmitterConfig
from khipu.tracing.headers import TraceContext

log = logging.getLogger(__name__)

_POLL_INTERVAL_S = 0.2
_WARN_INTERVAL_S = 60.0
BACK_POINTERS = 3  # previous RECEIVED offsets each trace points at: a run of this many lost traces is still told
# a Trace of all its values, without NamedTuple's Python-level __new__ (built once per traced message)
_new_trace = functools.partial(tuple.__new__, Trace)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class EmitterStats:
    """Counters of one emitter: every trace emitted ends up delivered, dropped or pending."""

    emitted: int  # traces the application asked for (each got a sequence number)
    accepted: int  # traces taken into the bounded queue (a batch being filled, or the trace producer's)
    delivered: int  # acknowledged by the trace cluster
    dropped_queue_full: int  # dropped at once because the bounded queue was full
    dropped_invalid: int  # could not be built or encoded (a bug; logged)
    failed_delivery: int  # accepted, then not delivered within delivery_timeout_ms
    dropped_at_close: int  # emitted while closing, or still queued when close() gave up waiting
    pending: int  # accepted and not yet delivered, failed or given up at close

    @property
    def dropped(self) -> int:
        return self.dropped_queue_full + self.dropped_invalid + self.failed_delivery + self.dropped_at_close


class TraceEmitter:
    """Builds traces for one location and publishes them to the trace topic, several per record."""

    def __init__(self, config: TraceEmitterConfig, *, clock_ms: Callable[[], int] = wall_clock_ms) -> None:
        self.config = config
        self.emitter_id = f"{config.location}-{secrets.token_hex(4)}"
        self._clock_ms = clock_ms
        self._location = config.location
        self._topic = config.topic
        self._record_key = self.emitter_id.encode()  # one emitter's records stay in order on one partition
        self._linger_s = config.batch_linger_ms / 1000
        self._seq = 0
        self._lock = threading.RLock()  # the sequence, the batch, the counters and the back-pointers
        self._queue_max_traces = config.queue_max_traces
        self._closing = False  # set by close(): traces emitted from then on are dropped and counted
        self._accepted = 0  # traces taken into the batch (the hot path's counter, kept out of the dict below)
        self._counts = {
            "delivered": 0,
            "dropped_queue_full": 0,
            "dropped_invalid": 0,
            "failed_delivery": 0,
            "dropped_at_close": 0,
        }
        self._emitted = 0
        self._batch: list[bytes] = []  # encoded traces, in sequence order
        self._batch_bytes = 0
        self._batch_since = 0.0  # when the batch's first trace came (monotonic)
        self._in_flight = 0  # traces handed to the trace producer, not yet reported delivered or failed
        self._marked_at_emitted = 0  # traces emitted when the last mark went out
        # partition -> its newest RECEIVED offsets (newest first), and when the newest was traced (monotonic)
        self._received: dict[tuple[str, str, int], tuple[tuple[int, ...], float]] = {}
        self._channel_healthy = True
        self._needs_new_producer = False
        self._last_warning = 0.0
        self._closed = threading.Event()
        self._producer = self._new_producer()
        self._poller = threading.Thread(target=self._poll_loop, name=f"khipu-emitter-{config.location}", daemon=True)
        self._poller.start()

    # -- what traced clients call ----------------------------------------------------------

    def sent(
        self,
        context: TraceContext,
        cluster: str,
        topic: str,
        partition: int,
        offset: int,
        attributes: Mapping[str, str] | None,
        timestamp_ms: int | None,
        key_hash: str | None,
        tombstone: bool,
        transactional: bool,
    ) -> None:
        """Record that the broker acknowledged a traced write: ``timestamp_ms`` is the record's own timestamp from
        the acknowledgement (None: not known, the emitter's clock stands in), ``key_hash`` the short hash of its
        key (:func:`khipu.trace.keys.key_hash`), ``tombstone`` a null value, ``transactional`` written by a
        transactional producer. Every argument in place: the traced producer's delivery reports call this once per
        traced message."""
        with self._lock:
            seq = self._seq
            self._seq = seq + 1
            self._emitted += 1
            if self._closing or len(self._batch) + self._in_flight >= self._queue_max_traces:
                self._refuse()
                return
            self._add(
                _new_trace((
                    context[0], context[1], self._location, cluster, TraceType.SENT,
                    self._clock_ms() if timestamp_ms is None else timestamp_ms, topic, partition, offset, None,
                    self.emitter_id, seq, context[2], attributes or NO_ATTRIBUTES, (), key_hash, tombstone,
                    transactional, False,
                ))
            )  # fmt: skip

    def received(
        self,
        cluster: str,
        group: str,
        read_uncommitted: bool,
        timestamp_ms: int | None,
        records: Sequence[tuple[TraceContext, str, int, int, Mapping[str, str] | None]],
    ) -> None:
        """Record that consumer group ``group`` received these traced records, in order: each is ``(context, topic,
        partition, offset, attributes)`` (``attributes``: a resent record's mark), all received together at
        ``timestamp_ms`` (None: now, by the emitter's clock, read once); ``read_uncommitted``: the group reads with
        isolation.level=read_uncommitted. Each trace points back at this emitter's previous RECEIVED offsets on its
        partition. What the traced consumer calls for the records one ``poll``/``consume`` returned: one lock and
        one call."""
        if timestamp_ms is None:
            timestamp_ms = self._clock_ms()
        location, emitter_id, received_at, add = self._location, self.emitter_id, self._received, self._add
        now = time.monotonic()  # for mark_memory_s: how long ago a partition was last received from
        with self._lock:
            seq = self._seq
            try:
                for context, topic, partition, offset, attributes in records:
                    where = (cluster, topic, partition)
                    known = received_at.get(where)
                    prev_offsets = () if known is None else known[0]
                    received_at[where] = ((offset, *prev_offsets[: BACK_POINTERS - 1]), now)
                    if self._closing or len(self._batch) + self._in_flight >= self._queue_max_traces:
                        self._refuse()
                    else:
                        add(
                            _new_trace((
                                context[0], context[1], location, cluster, TraceType.RECEIVED, timestamp_ms, topic,
                                partition, offset, group, emitter_id, seq, context[2], attributes or NO_ATTRIBUTES,
                                prev_offsets, None, False, False, read_uncommitted,
                            ))
                        )  # fmt: skip
                    seq += 1
            finally:
                self._emitted += seq - self._seq
                self._seq = seq

    def flush_before_commit(self) -> None:
        """Give pending traces a bounded chance to be delivered before offsets are committed.

        While the channel is unhealthy (a previous flush timed out) this returns at once, so a
        broken trace channel never slows the application's commits; it recovers when the queue
        drains.
        """
        self._send_batch()
        producer = self._producer
        if self._channel_healthy:
            remaining = producer.flush(self.config.commit_flush_timeout_s)
            if remaining:
                self._channel_healthy = False
                log.warning(
                    "trace channel slow: %d trace records still queued after %.1fs; commits no longer wait for it",
                    remaining,
                    self.config.commit_flush_timeout_s,
                )
        elif len(producer) == 0:
            self._channel_healthy = True
            log.info("trace channel recovered: queue drained")

    def flush(self, timeout_s: float | None = None) -> int:
        """Send the batch being filled and wait up to ``timeout_s`` for queued traces; return how many trace
        records are still queued."""
        self._send_batch()
        return int(self._producer.flush(self.config.close_timeout_s if timeout_s is None else timeout_s))

    def close(self) -> EmitterStats:
        """Flush (bounded by ``close_timeout_s``), stop, and return the final counters."""
        if self._closed.is_set():
            return self.stats()
        self._mark()  # closes the last batch: every trace is numbered below the mark's number
        with self._lock:
            self._closing = True
        self._closed.set()  # the poller stops first: from here on only this flush serves callbacks ...
        self._poller.join(timeout=2)
        self.flush()  # ... so a trace still queued after it was never counted as failed
        with self._lock:
            stranded, self._in_flight = self._in_flight, 0
            self._counts["dropped_at_close"] += stranded
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
        with self._lock:
            return EmitterStats(
                emitted=self._emitted,
                accepted=self._accepted,
                pending=len(self._batch) + self._in_flight,
                **self._counts,
            )

    def __enter__(self) -> TraceEmitter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------

    def _refuse(self) -> None:
        """Under the lock: a trace the emitter cannot take (closing, or the bounded queue full), counted."""
        if self._closing:
            self._counts["dropped_at_close"] += 1
            return
        self._counts["dropped_queue_full"] += 1
        self._channel_healthy = False
        self._warn(
            "trace queue full (%d traces): dropping traces until the trace channel catches up", self._queue_max_traces
        )

    def _add(self, trace: Trace) -> None:
        """Under the lock: encode a numbered trace into the batch (in sequence order); send the batch when full."""
        try:
            encoded = encode_trace(trace)
        except Exception as exc:  # tracing must never crash the application it observes
            self._counts["dropped_invalid"] += 1
            self._warn("trace for message %r dropped: %s: %s", trace.message_id, type(exc).__name__, exc)
            return
        batch = self._batch
        if not batch:
            self._batch_since = time.monotonic()
        batch.append(encoded)
        self._accepted += 1
        self._batch_bytes += len(encoded)
        if len(batch) >= BATCH_MAX_TRACES or self._batch_bytes >= BATCH_MAX_BYTES:
            self._produce_batch()

    def _send_batch(self) -> None:
        """Hand the batch being filled to the trace producer."""
        with self._lock:
            self._produce_batch()

    def _produce_batch(self, closing_mark: bytes | None = None) -> None:
        """Under the lock: one trace-topic record for the batch. A batch the producer refuses is counted, each of
        its traces, as queue-full (its local queue) or failed (a fatal producer error)."""
        batch, traces = self._batch, len(self._batch)
        if closing_mark is not None:
            batch.append(closing_mark)
        if not batch:
            return
        self._batch, self._batch_bytes = [], 0
        if self._needs_new_producer:
            self._replace_producer()
        try:
            # stamped by the emitter's clock, as a trace record written on its host is (Khipu's trace topic has the
            # broker stamp it again: LogAppendTime)
            self._producer.produce(
                self._topic,
                encode_batch(batch),
                self._record_key,
                on_delivery=functools.partial(self._on_batch_delivery, traces),
                timestamp=self._clock_ms(),
            )
        except BufferError:
            self._channel_healthy = False
            self._counts["dropped_queue_full"] += traces
            self._accepted -= traces
            self._warn("trace producer's queue full: dropping traces until the trace channel catches up")
            return
        except KafkaException as exc:
            self._counts["failed_delivery"] += traces
            self._warn("trace producer refused %d traces: %s", traces, exc.args[0] if exc.args else exc)
            return
        self._in_flight += traces

    def _new_producer(self) -> Producer:
        settings: dict[str, Any] = {
            **self.config.producer_config,
            "bootstrap.servers": self.config.bootstrap_servers,
            "client.id": self.emitter_id,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,  # the emitter batches already (batch_linger_ms)
            "queue.buffering.max.messages": max(1_000, self.config.queue_max_traces),
            "message.timeout.ms": self.config.delivery_timeout_ms,
            "error_cb": self._on_client_error,
            # librdkafka's own log repeats every failed connection attempt; errors reach us through
            # error_cb instead and are logged at most once a minute.
            "log_level": 2,
        }
        return Producer(settings)

    def _replace_producer(self) -> None:
        """Under the lock: a producer that failed fatally never delivers what it holds."""
        if not self._needs_new_producer:
            return
        old, self._producer = self._producer, self._new_producer()
        self._needs_new_producer = False
        lost, self._in_flight = self._in_flight, 0
        old.flush(0)
        self._counts["failed_delivery"] += lost
        log.warning("trace producer replaced after a fatal error; %d queued traces lost", lost)

    def _on_batch_delivery(self, traces: int, err: KafkaError | None, _msg: Any) -> None:
        with self._lock:
            self._in_flight = max(0, self._in_flight - traces)
            self._counts["delivered" if err is None else "failed_delivery"] += traces
        if err is not None:
            self._channel_healthy = False
            self._warn("a trace record (%d traces) not delivered: %s", traces, err.str())

    def _on_client_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._needs_new_producer = True
            log.error("trace producer fatal error: %s; it will be replaced", err.str())
        else:
            self._warn("trace channel error: %s", err.str())

    def _poll_loop(self) -> None:
        next_mark = time.monotonic() + self.config.mark_interval_s
        while not self._closed.is_set():
            self._producer.poll(min(_POLL_INTERVAL_S, self._linger_s))
            now = time.monotonic()
            if self._batch and now - self._batch_since >= self._linger_s:
                self._send_batch()
            if now >= next_mark:
                next_mark = now + self.config.mark_interval_s
                self._mark()

    def _mark(self) -> None:
        """Publish the emitter's next sequence number and where it received lately, when it traced since
        the last mark, or received within ``mark_memory_s`` (a lost mark is made good by the next). The mark
        closes the batch being filled, after its traces."""
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
                self._produce_batch()
                return
            self._marked_at_emitted = self._emitted
            received = tuple(entry for _, _, entry in recent[:MAX_MARK_ENTRIES])
            mark = EmitterMark(self.emitter_id, self._location, self._seq, self._clock_ms(), received)
            self._seq += 1
            self._produce_batch(encode_mark(mark))

    def _warn(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last_warning >= _WARN_INTERVAL_S:
            self._last_warning = now
            log.warning(message, *args)
