"""Run the demo pipeline against a broker: source -> processor -> fan-out sinks, all traced.

Every component is an ordinary traced confluent-kafka application running in its own thread,
with its own trace emitter (its own location). Faults are injected where the plan says and
written to the ground-truth ledger as they happen (see :mod:`khipu.demo.ledger`).

Fault placement: producer_retry at the source; processor_drop, rebalance_drop and delay in the
processor; consumer_skip in the first sink group; offset_rewind in the last sink group;
trace_loss in every component's trace channel. A record Khipu resent for a confirmed loss is handled
without faults (the demo's faults pick messages by id: the same id must not be struck twice), and its
receipt is recorded with its resend id (the ground truth of what the resend delivered, and to whom).

``count=0`` produces nothing and runs the consumers until they have read their topics to the end: how
resent records are delivered after a finished run.
"""

from __future__ import annotations

import heapq
import json
import logging
import secrets
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from khipu.demo.control import DemoControl
from khipu.demo.faults import DemoConfigError, Fault, FaultPlan, FaultRates
from khipu.demo.ledger import LedgerWriter, build_truth, read_ledger
from khipu.demo.topology import DemoTopology
from khipu.kafka import KafkaAdmin, KafkaConnection, KafkaUnavailable
from khipu.registry.model import ConsumerSpec, Hop, TopicRef
from khipu.trace.model import Trace
from khipu.trace.sampling import is_sampled
from khipu.tracing.clients import TracedConsumer, TracedProducer
from khipu.tracing.config import DEFAULT_TRACE_TOPIC, TraceEmitterConfig
from khipu.tracing.emitter import EmitterStats, TraceEmitter
from khipu.tracing.headers import ATTRIBUTE_RESEND_ID, carry_trace_headers, resend_mark

log = logging.getLogger(__name__)

_POLL_S = 0.05
_COMMIT_INTERVAL_S = 0.2
_BATCH_MAX_AGE_S = 0.1
# the demo's writes are never given up by the client (librdkafka's message.timeout.ms 0: no limit): through an
# outage of the broker they wait, as the applications do, and the ledger records each once it is acknowledged
_NEVER_GIVE_UP = {"message.timeout.ms": 0}
_AFTER_STOP_S = 30.0  # once the demo is stopping, how long it still waits for the broker to acknowledge writes
# what a call to the cluster answers while a broker is away or just back (the group coordinator not yet known, a
# partition's leader moving): a well-written application waits and asks again
_TRANSIENT = frozenset(
    {
        KafkaError._WAIT_COORD,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.REBALANCE_IN_PROGRESS,
    }
)
_RETRY_FIRST_S, _RETRY_MAX_S = 0.5, 5.0
_FAULT_COMMIT_S = 30.0  # how long the injected rebalance drop waits to know its commit over the buffer landed
_CLOSE_COMMIT_S = 10.0  # how long a stopping consumer waits to know its last commit landed
_FAULT_ANSWER_S = 30.0  # how long a sink asks for what an injected fault needs before leaving the fault out


class DemoError(RuntimeError):
    """The demo could not run or did not settle."""


@dataclass(frozen=True, slots=True)
class DemoConfig:
    bootstrap_servers: str
    ledger_path: Path
    trace_topic: str = DEFAULT_TRACE_TOPIC
    count: int | None = 1000  # messages to produce; None with duration_s None runs until stopped
    duration_s: float | None = None
    rate_per_s: float = 100.0
    sampling_percent: float | None = None  # None: the stream's rate from the registry
    faults: FaultRates = field(default_factory=FaultRates)
    delay_ms: int = 3000
    skip_length: int = 2
    rewind_length: int = 3
    batch_size: int = 20
    seed: int = 0
    run_id: str = field(default_factory=lambda: secrets.token_hex(4))
    partitions: int = 3
    trace_partitions: int = 4
    session_timeout_ms: int = 6000
    max_poll_interval_ms: int = 3_600_000  # a paused (stalled) demo consumer stays in its group for an hour
    trace_producer_config: Mapping[str, str] = field(default_factory=dict)  # extra librdkafka settings for emitters
    trace_bootstrap_servers: str | None = None  # the trace topic's cluster when not the demo's own
    # the emitters keep a trace this long through an outage of the trace cluster before counting it failed (the
    # ledger takes every trace not dropped on purpose to reach the channel)
    trace_delivery_timeout_ms: int = 900_000
    settle_timeout_s: float = 120.0
    progress_interval_s: float = 5.0

    def __post_init__(self) -> None:
        if self.count is not None and (isinstance(self.count, bool) or self.count < 0):
            raise DemoConfigError(
                "count", self.count, "an integer >= 0 (0: only consume what is there), or none to run until stopped"
            )
        if self.duration_s is not None and self.duration_s <= 0:
            raise DemoConfigError("duration_s", self.duration_s, "a number of seconds > 0")
        if not 0 < self.rate_per_s <= 1_000_000:
            raise DemoConfigError("rate_per_s", self.rate_per_s, "messages per second in (0, 1000000]")
        if self.sampling_percent is not None and not 0 < self.sampling_percent <= 100:
            raise DemoConfigError("sampling_percent", self.sampling_percent, "a number in (0, 100]")
        for name in ("delay_ms", "skip_length", "rewind_length", "batch_size", "partitions", "trace_partitions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "delay_ms" else 1):
                raise DemoConfigError(name, value, "a positive integer")
        if not self.run_id.replace("-", "").isalnum():
            raise DemoConfigError("run_id", self.run_id, "letters, digits and '-'")

    @property
    def runs_forever(self) -> bool:
        return self.count is None and self.duration_s is None


@dataclass(frozen=True, slots=True)
class DemoReport:
    run_id: str
    ledger_path: Path
    produced: int
    hop_summary: dict[str, dict[str, int]]
    fault_counts: dict[str, int]
    emitters: dict[str, EmitterStats]


def message_id_for(run_id: str, number: int) -> str:
    return f"{run_id}-{number:08d}"


def business_id(msg: Message) -> str | None:
    """The demo's own record of which message this is, from the payload (not the trace headers).

    ``None`` for a record the demo did not write (someone else's data on the demo topics).
    """
    try:
        return str(json.loads(msg.value() or b"")["message_id"])
    except (TypeError, ValueError, KeyError):
        return None


class _Record(NamedTuple):
    """A fetched record with its position checked once, and the demo's id for it."""

    msg: Message
    topic: str
    partition: int
    offset: int
    message_id: str | None  # None: a record the demo did not write
    resend_id: str | None = None  # a record Khipu resent: never struck by a fault


def _position(msg: Message) -> tuple[str, int, int]:
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    if topic is None or partition is None or offset is None:
        raise DemoError(f"record without a position from the client: {topic}[{partition}]@{offset}")
    return topic, partition, offset


class _FaultyTraceEmitter(TraceEmitter):
    """A trace emitter whose channel loses the traces the plan picks (the trace_loss fault)."""

    def __init__(self, config: TraceEmitterConfig, plan: SteeredPlan, ledger: LedgerWriter) -> None:
        super().__init__(config)
        self._plan = plan
        self._ledger = ledger

    def _add(self, trace: Trace) -> None:
        resent = ATTRIBUTE_RESEND_ID in trace.attributes
        if not resent and self._plan.injects(Fault.TRACE_LOSS, f"{trace.emitter_id}:{trace.emitter_seq}"):
            self._ledger.append(
                "trace_dropped",
                message_id=trace.message_id,
                hop=Hop.of_trace(trace).id,
                trace_type=trace.type.value,
                partition=trace.partition,
                offset=trace.offset,
                fault=Fault.TRACE_LOSS.value,
            )
            self._accepted += 1  # lost after the hand-over, where the emitter cannot see it: "delivered"
            self._counts["delivered"] += 1
            return
        super()._add(trace)


class _WriteLog:
    """One component's acknowledged writes: counted, end offsets tracked, each recorded in the ledger."""

    def __init__(self, ledger: LedgerWriter, hop: Hop, who: str) -> None:
        self._ledger, self._hop, self._who = ledger, hop, who
        self._lock = threading.Lock()
        self._count = 0
        self._end_offsets: dict[int, int] = {}
        self.failures: list[str] = []  # writes the broker refused for good (never a timeout: writes never time out)

    def recorder(self, message_id: str, **ledger_fields: Any) -> Callable[[KafkaError | None, Message], None]:
        """A delivery callback recording the write of ``message_id`` once the broker acknowledged it."""

        def record(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                log.warning("%s: write of %s failed: %s", self._who, message_id, err.str())
                with self._lock:
                    self.failures.append(f"write of {message_id} failed: {err.str()}")
                return
            topic, partition, offset = _position(msg)
            with self._lock:
                self._count += 1
                self._end_offsets[partition] = max(self._end_offsets.get(partition, 0), offset + 1)
            self._ledger.append(
                "written",
                message_id=message_id,
                hop=self._hop.id,
                topic=topic,
                partition=partition,
                offset=offset,
                **ledger_fields,
            )

        return record

    def snapshot(self) -> tuple[int, dict[int, int]]:
        """(acknowledged writes, end offset + 1 per partition written)."""
        with self._lock:
            return self._count, dict(self._end_offsets)


def await_acknowledgements(producer: Any, who: str, stop: threading.Event, after_stop_s: float = _AFTER_STOP_S) -> None:
    """Wait until the broker acknowledged every record ``producer`` holds. Through an outage of the broker this
    waits as long as the outage lasts while the demo runs (logged after 5 s, then each time the wait doubles, at
    least once a minute); once the demo is stopping, at most ``after_stop_s`` more, then it fails naming what
    is left (those records are not in the ledger: nothing acknowledged them)."""
    started = time.monotonic()
    note_at, stopping_since = 5.0, None
    while True:
        remaining = int(producer.flush(1.0))
        waited = time.monotonic() - started
        if not remaining:
            if waited >= 5.0:
                log.warning("%s: the broker acknowledged every write after %.0f s of waiting", who, waited)
            return
        if waited >= note_at:
            log.warning("%s: %d writes not acknowledged for %.0f s: waiting for the broker", who, remaining, waited)
            note_at = min(2 * note_at, waited + 60.0)
        if stop.is_set():
            stopping_since = stopping_since if stopping_since is not None else time.monotonic()
            if time.monotonic() - stopping_since >= after_stop_s:
                raise DemoError(f"{who}: {remaining} writes unacknowledged after {waited:.0f}s, and the demo stops")


class _GaveUp(Exception):
    """A call to the cluster was not answered before the demo stopped, or was refused for good."""


def until_answered(
    call: Callable[[], Any],
    who: str,
    what: str,
    stop: threading.Event,
    limit_s: float | None = None,
    refresh: Callable[[], Any] | None = None,
) -> Any:
    """``call()``, asked again with back-off while the cluster answers a transient error (an outage, a coordinator
    or leader not yet known), after ``refresh()`` (a client's metadata: after a freeze the broker is fenced and
    unfenced, and a consumer that asked for a partition's end without polling meanwhile was answered "Not leader for
    partition"; librdkafka's periodic refresh comes every 5 minutes); :class:`_GaveUp` once the demo stops
    meanwhile, past ``limit_s``, or on an error asking again cannot fix (the caller then leaves out what needed the
    answer)."""
    wait, started = _RETRY_FIRST_S, time.monotonic()
    while True:
        try:
            return call()
        except KafkaException as exc:
            error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if error is None or not (error.retriable() or error.code() in _TRANSIENT):
                raise _GaveUp(f"{who}: {what} refused: {exc}") from exc
            spent = time.monotonic() - started
            if limit_s is not None and spent + wait > limit_s:
                raise _GaveUp(f"{who}: {what} not answered within {limit_s:.0f} s ({error.str()})") from exc
            log.warning("%s: %s not answered (%s) after %.0f s; asking again", who, what, error.str(), spent)
        if stop.wait(wait):
            raise _GaveUp(f"{who}: {what} not answered before the demo stopped")
        if refresh is not None:
            try:
                refresh()
            except KafkaException as exc:  # asked again anyway: the call says what is wrong
                log.warning("%s: metadata not refreshed before asking again: %s", who, exc)
        wait = min(2 * wait, _RETRY_MAX_S)


class _Component(threading.Thread):
    """A demo application in a thread, with its own trace emitter."""

    def __init__(self, demo: _Demo, location: str) -> None:
        super().__init__(name=f"demo-{location}", daemon=True)
        self.demo = demo
        self.location = location
        self.emitter = demo.new_emitter(location)
        self.failure: BaseException | None = None
        self._lock = threading.Lock()

    def run(self) -> None:
        try:
            self.work()
        except BaseException as exc:  # reported by the orchestrator, which stops the demo
            self.failure = exc
            log.exception("demo component %s failed", self.location)
            self.demo.stop.set()

    def work(self) -> None:
        raise NotImplementedError


class _Source(_Component):
    """The producing application: writes orders at a steady rate, ids assigned by the demo."""

    def __init__(self, demo: _Demo) -> None:
        topology = demo.topology
        super().__init__(demo, topology.source.location)
        self.hop = topology.source_hop
        self.topic = topology.source_topic.topic
        self.sampling = demo.sampling_percent
        self.writes = _WriteLog(demo.ledger, self.hop, "source")
        self.finished = threading.Event()
        self.producer = TracedProducer(
            demo.client_config({"enable.idempotence": True, "linger.ms": 5, **_NEVER_GIVE_UP}),
            emitter=self.emitter,
            stream=topology.stream.name,
            sampling_percent=self.sampling,
        )

    def work(self) -> None:
        config, plan = self.demo.config, self.demo.plan
        started = time.monotonic()
        number = 0
        while not self.demo.stop.is_set():
            if config.count is not None and number >= config.count:
                break
            if config.duration_s is not None and time.monotonic() - started >= config.duration_s:
                break
            wait = started + number / config.rate_per_s - time.monotonic()
            if wait > 0:
                self.demo.stop.wait(min(wait, 0.5))
                if wait > 0.5:
                    continue
            message_id = message_id_for(config.run_id, number)
            self._send(message_id, number, fault=None)
            if plan.injects(Fault.PRODUCER_RETRY, message_id):
                self._send(message_id, number, fault=Fault.PRODUCER_RETRY.value)
            number += 1
            self.producer.poll(0)
        await_acknowledgements(self.producer, "source", self.demo.stop)
        self.finished.set()

    def _send(self, message_id: str, number: int, fault: str | None) -> None:
        value = json.dumps({"message_id": message_id, "order_id": number, "amount_cents": 100 + number % 900})
        sampled = is_sampled(message_id, self.sampling)
        while True:
            try:
                self.producer.produce(
                    self.topic,
                    value=value.encode(),
                    key=str(number).encode(),
                    message_id=message_id,
                    attributes={"order_id": str(number)},
                    on_delivery=self.writes.recorder(message_id, sampled=sampled, source=True, fault=fault),
                )
                return
            except BufferError:  # the application's own queue is full: wait for the broker, as apps do
                self.producer.poll(0.1)

    def progress(self) -> tuple[int, dict[int, int]]:
        return self.writes.snapshot()


class _ConsumerComponent(_Component):
    """Shared by processor and sinks: a traced group consumer that tracks its position."""

    def __init__(self, demo: _Demo, spec: ConsumerSpec, topic: TopicRef) -> None:
        super().__init__(demo, spec.location)
        self.spec = spec
        self.topic = topic.topic
        self.read_hop = Hop.read(topic, spec.group)
        self.next_offsets: dict[int, int] = {}
        self.received = 0
        self._last_commit = 0.0
        self._committed: dict[int, int] = {}
        self.consumer = TracedConsumer(
            demo.client_config(
                {
                    "group.id": spec.group,
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                    "session.timeout.ms": demo.config.session_timeout_ms,
                    "heartbeat.interval.ms": max(100, demo.config.session_timeout_ms // 10),
                    "max.poll.interval.ms": demo.config.max_poll_interval_ms,
                    "on_commit": self.on_commit,
                }
            ),
            emitter=self.emitter,
        )

    def subscribe(self) -> None:
        self.consumer.subscribe([self.topic], on_revoke=self.on_revoke)

    def on_revoke(self, _consumer: Any, _partitions: list[TopicPartition]) -> None:
        """Nothing buffered by default."""

    def record_received(self, msg: Message) -> _Record:
        topic, partition, offset = _position(msg)
        mark = resend_mark(msg.headers())
        record = _Record(msg, topic, partition, offset, business_id(msg), mark.resend_id if mark else None)
        with self._lock:
            self.received += 1
            self.next_offsets[partition] = offset + 1
        if record.message_id is None:
            log.warning(
                "%s: skipping a record the demo did not write at %s[%d]@%d", self.spec.group, topic, partition, offset
            )
        else:
            self.demo.ledger.append(
                "received",
                message_id=record.message_id,
                hop=self.read_hop.id,
                topic=topic,
                partition=partition,
                offset=offset,
                **({"resend_id": record.resend_id} if record.resend_id else {}),
            )
        return record

    def set_position(self, partition: int, offset: int) -> None:
        with self._lock:
            self.next_offsets[partition] = offset

    def committable(self) -> dict[int, int]:
        with self._lock:
            return dict(self.next_offsets)

    def commit(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and (now - self._last_commit < _COMMIT_INTERVAL_S or self.demo.control.is_paused(self.spec.group)):
            return
        self._last_commit = now
        offsets = self.committable()
        if offsets != self._committed:
            self.send_commit(offsets)

    def send_commit(self, offsets: dict[int, int]) -> None:
        """Commit ``offsets`` without waiting: librdkafka's synchronous commit has no time limit, and after a broker
        outage one can wait for a group coordinator for ever (seen here: confluent-kafka-python issue 1801). The
        broker's answer comes to :meth:`on_commit`, and :meth:`confirm_committed` asks for it with a time limit."""
        try:
            self.consumer.commit(
                offsets=[TopicPartition(self.topic, p, o) for p, o in sorted(offsets.items())], asynchronous=True
            )
            self._committed = offsets
        except KafkaException as exc:
            log.warning("%s: commit failed: %s", self.spec.group, exc.args[0].str() if exc.args else exc)

    def on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """The broker's answer to a commit (served by ``poll``): a failed one is sent again by the next commit."""
        failed = error or next((tp.error for tp in partitions if tp.error is not None), None)
        if failed is not None:
            log.warning("%s: commit failed: %s; it is sent again", self.spec.group, failed.str())
            self._committed = {}

    def confirm_committed(self, offsets: dict[int, int], limit_s: float, stopping: bool = False) -> bool:
        """Whether the group's committed offsets reached ``offsets`` within ``limit_s`` (or before the demo stops,
        unless it is ``stopping`` already), asked of the coordinator with a time limit each time."""
        deadline = time.monotonic() + limit_s
        asked = [TopicPartition(self.topic, p) for p in sorted(offsets)]
        while True:
            try:
                found = {tp.partition: tp.offset for tp in self.consumer.committed(asked, timeout=5)}
                if all(found.get(p, -1) >= o for p, o in offsets.items()):
                    return True
            except KafkaException as exc:
                log.warning("%s: committed offsets not known: %s", self.spec.group, exc)
            if time.monotonic() >= deadline:
                return False
            if stopping:
                time.sleep(0.5)
            elif self.demo.stop.wait(0.5):
                return False

    def poll_one(self) -> _Record | None:
        """The next record (recorded as received), or ``None`` after a poll timeout, a consume error, or
        while the group is paused (``khipu demo pause``: it stays a member but neither reads nor commits)."""
        if self.demo.control.is_paused(self.spec.group):
            self.demo.stop.wait(_POLL_S)
            return None
        msg = self.consumer.poll(_POLL_S)
        if msg is None:
            return None
        error = msg.error()
        if error is not None:
            log.warning("%s: consume error: %s", self.spec.group, error.str())
            return None
        return self.record_received(msg)

    def close(self) -> None:
        offsets = self.committable()
        if offsets != self._committed:
            self.send_commit(offsets)
        if offsets and not self.confirm_committed(offsets, _CLOSE_COMMIT_S, stopping=True):
            log.warning("%s: its last commit was not confirmed within %.0f s of stopping", self.spec.group,
                        _CLOSE_COMMIT_S)  # fmt: skip
        self.consumer.close()

    def progress(self) -> tuple[int, dict[int, int]]:
        with self._lock:
            return self.received, dict(self.next_offsets)


@dataclass(order=True)
class _Held:
    due: float
    record: _Record = field(compare=False)


class _Processor(_ConsumerComponent):
    """Consume, enrich, write on in batches, commit what is safely written: an at-least-once processor."""

    def __init__(self, demo: _Demo) -> None:
        topology = demo.topology
        super().__init__(demo, topology.processor, topology.source_topic)
        self.write_hop = topology.processor_write_hop
        self.output_topic = topology.output_topic.topic
        self.producer = TracedProducer(
            demo.client_config({"enable.idempotence": True, "linger.ms": 5, **_NEVER_GIVE_UP}), emitter=self.emitter
        )
        self.batch: list[_Record] = []
        self.held: list[_Held] = []
        self.batch_started = 0.0
        self.writes = _WriteLog(demo.ledger, self.write_hop, "processor")
        self._triggered: set[tuple[int, int]] = set()
        # (nothing in memory, how far it has read) as of the end of its last turn, when no polled record is half
        # handled: the settle loop reads this, never a lock the worker takes again at once (a lock it waited for
        # was starved under load: the worker re-took it first every turn, and the demo never settled)
        self._turn_end: tuple[bool, dict[int, int]] = (False, {})

    def work(self) -> None:
        self.subscribe()
        while not self.demo.stop.is_set():
            record = self.poll_one()
            if record is not None:
                self.handle(record)
            self.release_due()
            if self.batch and (
                len(self.batch) >= self.demo.config.batch_size
                or time.monotonic() - self.batch_started >= _BATCH_MAX_AGE_S
            ):
                self.write_batch()
            self._turn_end = (not self.batch and not self.held, self.progress()[1])
            self.commit()
        self.write_batch()
        self.close()
        await_acknowledgements(self.producer, "processor", self.demo.stop)

    def handle(self, record: _Record) -> None:
        plan, config, message_id = self.demo.plan, self.demo.config, record.message_id
        if message_id is None:
            return
        position = (record.partition, record.offset)
        if record.resend_id is not None:
            self.buffer(record)
        elif plan.injects(Fault.REBALANCE_DROP, message_id) and position not in self._triggered:
            self._triggered.add(position)
            self.buffer(record)
            self.rebalance_and_drop()
        elif plan.injects(Fault.PROCESSOR_DROP, message_id):
            self.demo.ledger.append(
                "dropped", message_id=message_id, hop=self.write_hop.id, fault=Fault.PROCESSOR_DROP.value
            )
        elif plan.injects(Fault.DELAY, message_id):
            heapq.heappush(self.held, _Held(time.monotonic() + config.delay_ms / 1000, record))
            self.demo.ledger.append(
                "delayed",
                message_id=message_id,
                hop=self.write_hop.id,
                delay_ms=config.delay_ms,
                fault=Fault.DELAY.value,
            )
        else:
            self.buffer(record)

    def buffer(self, record: _Record) -> None:
        if not self.batch:
            self.batch_started = time.monotonic()
        self.batch.append(record)

    def release_due(self) -> None:
        now = time.monotonic()
        while self.held and self.held[0].due <= now:
            self.buffer(heapq.heappop(self.held).record)

    def write_batch(self) -> None:
        if not self.batch:
            return
        for record in self.batch:
            assert record.message_id is not None  # only the demo's own records are buffered
            order = json.loads(record.msg.value() or b"")
            order["enriched_by"] = self.location
            self.producer.produce(
                self.output_topic,
                value=json.dumps(order).encode(),
                key=record.msg.key(),
                headers=carry_trace_headers(record.msg.headers()),
                on_delivery=self.writes.recorder(record.message_id, source=False),
            )
        # an at-least-once processor: its input is committed only past what the broker acknowledged, so it waits
        await_acknowledgements(self.producer, "processor", self.demo.stop)
        if self.writes.failures:  # refused for good: stop before committing past it (the ledger has no write)
            raise DemoError(f"processor: {len(self.writes.failures)} writes refused: {self.writes.failures[0]}")
        self.batch = []

    def committable(self) -> dict[int, int]:
        """Up to the oldest record not yet written on, per partition (delayed records hold the commit)."""
        offsets = super().committable()
        for record in [*self.batch, *(held.record for held in self.held)]:
            offsets[record.partition] = min(offsets.get(record.partition, record.offset), record.offset)
        return offsets

    def rebalance_and_drop(self) -> None:
        """The seed-001 bug: offsets committed while records sit in memory; a rebalance discards them."""
        with self._lock:
            position = dict(self.next_offsets)
        self.send_commit(position)
        if not self.confirm_committed(position, _FAULT_COMMIT_S):
            # not known to be committed over the buffer: the buffer is written now, as usual, and nothing is dropped
            # (if the commit lands later it is past records written once: the ledger stays true either way)
            log.warning("processor: the commit over its buffer was not confirmed within %.0f s; the injected "
                        "rebalance drop is left out", _FAULT_COMMIT_S)  # fmt: skip
            self.write_batch()
            return
        self.discard_unwritten(Fault.REBALANCE_DROP)
        log.info("processor: rebalance (unsubscribe + subscribe) after committing over its buffer")
        self.consumer.unsubscribe()
        self.subscribe()

    def on_revoke(self, _consumer: Any, _partitions: list[TopicPartition]) -> None:
        """A real rebalance (the injected one has emptied the buffer already): nothing in memory was committed (the
        commit stops at the oldest record not written on), so the group reads it again and nothing is dropped. A
        broker outage longer than the session timeout ends in one."""
        unwritten = [*self.batch, *(held.record for held in self.held)]
        if unwritten:
            log.warning("processor: partitions revoked with %d records in memory; they are read again",
                        len(unwritten))  # fmt: skip
        with self._lock:  # its position goes back to them: nothing commits past a record it never wrote on
            for record in unwritten:
                self.next_offsets[record.partition] = min(self.next_offsets[record.partition], record.offset)
        self.batch, self.held = [], []

    def discard_unwritten(self, fault: Fault) -> None:
        for record in [*self.batch, *(held.record for held in self.held)]:
            self.demo.ledger.append("dropped", message_id=record.message_id, hop=self.write_hop.id, fault=fault.value)
        self.batch, self.held = [], []

    def turn_end(self) -> tuple[bool, dict[int, int]]:
        """(nothing in memory, its read position per partition) as of the end of its last turn: both from the same
        moment, so a record polled but not yet written on is never taken for settled. A write that waits for the
        broker ends no turn: the settle loop sees the last one and its deadline still counts."""
        return self._turn_end

    def output_end(self) -> dict[int, int]:
        return self.writes.snapshot()[1]


class _Sink(_ConsumerComponent):
    """A sink group. The first one skips records on consumer_skip; the last rewinds on offset_rewind."""

    def __init__(self, demo: _Demo, spec: ConsumerSpec) -> None:
        super().__init__(demo, spec, demo.topology.output_topic)
        topology = demo.topology
        self.skips = spec.group == topology.skip_group
        self.rewinds = spec.group == topology.rewind_group
        self._triggered: set[tuple[int, int]] = set()

    def work(self) -> None:
        self.subscribe()
        while not self.demo.stop.is_set():
            record = self.poll_one()
            if record is not None:
                self.handle(record)
            self.commit()
        self.close()

    def handle(self, record: _Record) -> None:
        plan, config = self.demo.plan, self.demo.config
        position = (record.partition, record.offset)
        if record.message_id is None or record.resend_id is not None or position in self._triggered:
            return
        if self.skips and plan.injects(Fault.CONSUMER_SKIP, record.message_id):
            self._triggered.add(position)
            partition = TopicPartition(self.topic, record.partition)
            try:
                _, high = until_answered(
                    lambda: self.consumer.get_watermark_offsets(partition, timeout=10),
                    self.spec.group,
                    f"the end of {self.topic}[{record.partition}] (for the injected skip)",
                    self.demo.stop,
                    limit_s=_FAULT_ANSWER_S,  # the sink does not read meanwhile: a fault is not worth a stall
                    refresh=lambda: self.consumer.list_topics(self.topic, timeout=5),
                )
            except _GaveUp as exc:  # not skipped: it reads on, and the ledger records no skip
                log.warning("%s; the skip is left out", exc)
                return
            target = min(record.offset + 1 + config.skip_length, max(high, record.offset + 1))
            self.jump(record, target, "skipped", Fault.CONSUMER_SKIP)
        elif self.rewinds and plan.injects(Fault.OFFSET_REWIND, record.message_id):
            self._triggered.add(position)
            self.jump(record, max(0, record.offset + 1 - config.rewind_length), "rewound", Fault.OFFSET_REWIND)

    def jump(self, record: _Record, target: int, event: str, fault: Fault) -> None:
        """Seek to ``target`` and commit it at once, as a buggy offset manager would."""
        low, high = sorted((record.offset + 1, target))
        if low == high:
            return
        try:
            self.consumer.seek(TopicPartition(self.topic, record.partition, target))
        except KafkaException as exc:  # the partition was revoked meanwhile: not moved, and the ledger says nothing
            log.warning("%s: the injected %s on %s[%d] is left out: %s", self.spec.group, event, self.topic,
                        record.partition, exc)  # fmt: skip
            return
        self.set_position(record.partition, target)
        self.demo.ledger.append(
            event,
            hop=self.read_hop.id,
            topic=self.topic,
            partition=record.partition,
            from_offset=low,
            to_offset=high,
            fault=fault.value,
        )
        self.commit(force=True)


class SteeredPlan:
    """The fault plan, with the rates changed while the demo runs (``khipu demo faults``) taking precedence."""

    def __init__(self, plan: FaultPlan, control: DemoControl) -> None:
        self.plan, self.control = plan, control

    def injects(self, fault: Fault, key: str) -> bool:
        return self.plan.injects(fault, key, self.control.fault_overrides().get(fault.value))


class _Demo:
    """Owns the shared pieces: config, plan, ledger, stop signal, and the emitters it created."""

    def __init__(self, config: DemoConfig, topology: DemoTopology) -> None:
        self.config = config
        self.topology = topology
        self.sampling_percent = config.sampling_percent or topology.stream.sampling_percent
        self.ledger = LedgerWriter(config.ledger_path)
        self.control = DemoControl(config.ledger_path.parent / "control.json")
        self.plan = SteeredPlan(FaultPlan(config.faults, config.seed), self.control)
        self.stop = threading.Event()
        self.emitters: dict[str, TraceEmitter] = {}

    def client_config(self, extra: dict[str, Any]) -> dict[str, Any]:
        return {"bootstrap.servers": self.config.bootstrap_servers, **extra}

    def new_emitter(self, location: str) -> TraceEmitter:
        emitter_config = TraceEmitterConfig(
            bootstrap_servers=self.config.trace_bootstrap_servers or self.config.bootstrap_servers,
            delivery_timeout_ms=self.config.trace_delivery_timeout_ms,
            location=location,
            cluster=self.topology.source_topic.cluster,
            topic=self.config.trace_topic,
            producer_config=dict(self.config.trace_producer_config),
        )
        emitter: TraceEmitter
        if self.config.faults.trace_loss > 0:
            emitter = _FaultyTraceEmitter(emitter_config, self.plan, self.ledger)
        else:
            emitter = TraceEmitter(emitter_config)
        self.emitters[location] = emitter
        return emitter


def prepare_topics(config: DemoConfig, topology: DemoTopology, timeout_s: float = 10.0) -> list[str]:
    """Fail fast, and clearly, when the broker cannot be reached; create the demo's topics if missing."""
    admin = KafkaAdmin(KafkaConnection(config.bootstrap_servers, cluster=topology.source_topic.cluster), timeout_s)
    traces = admin
    if config.trace_bootstrap_servers:
        traces = KafkaAdmin(KafkaConnection(config.trace_bootstrap_servers, cluster="traces"), timeout_s)
    try:
        traces.ensure_trace_topic(config.trace_topic, config.trace_partitions)
        return admin.ensure_topics(
            {topology.source_topic.topic: config.partitions, topology.output_topic.topic: config.partitions}
        )
    except KafkaUnavailable as exc:
        raise DemoError(f"{exc}; is the stack up (`make up`)?") from None


def run_demo(
    config: DemoConfig,
    topology: DemoTopology,
    *,
    stop: threading.Event | None = None,
    progress: Callable[[str], None] = print,
) -> DemoReport:
    """Run the demo until its count/duration is produced and every component has settled (or ``stop`` is set)."""
    prepare_topics(config, topology)
    demo = _Demo(config, topology)
    if stop is not None:

        def relay_stop() -> None:
            stop.wait()
            demo.stop.set()

        threading.Thread(target=relay_stop, name="demo-stop-relay", daemon=True).start()
    demo.ledger.append(
        "run",
        run_id=config.run_id,
        stream=topology.stream.name,
        seed=config.seed,
        sampling_percent=demo.sampling_percent,
        faults=dict(config.faults.as_dict()),
        started_ms=time.time_ns() // 1_000_000,
    )
    processor = _Processor(demo)
    sinks = [_Sink(demo, spec) for spec in topology.sinks]
    source = _Source(demo)
    components: list[_Component] = [processor, *sinks, source]
    if config.runs_forever:
        amount = "until stopped"
    elif config.count is not None:
        amount = f"{config.count} messages"
    else:
        amount = f"for {config.duration_s:g}s"
    progress(
        f"demo run {config.run_id}: stream {topology.stream.name}, sampling {demo.sampling_percent:g}%, {amount} "
        f"at {config.rate_per_s:g}/s; ledger {config.ledger_path}"
    )
    for component in components:
        component.start()
    try:
        _wait_until_settled(demo, source, processor, sinks, progress)
    finally:
        demo.stop.set()
        for component in components:
            component.join(timeout=60)
        stats = {location: emitter.close() for location, emitter in demo.emitters.items()}
        demo.ledger.close()
    failures = [c for c in components if c.failure is not None]
    if failures:
        raise DemoError(f"demo component {failures[0].location} failed: {failures[0].failure!r}")
    truth = build_truth(read_ledger(config.ledger_path, run_id=config.run_id))
    return DemoReport(
        run_id=config.run_id,
        ledger_path=config.ledger_path,
        produced=source.progress()[0],
        hop_summary=truth.hop_summary(),
        fault_counts=dict(truth.fault_counts()),
        emitters=stats,
    )


def _wait_until_settled(
    demo: _Demo, source: _Source, processor: _Processor, sinks: list[_Sink], progress: Callable[[str], None]
) -> None:
    config = demo.config
    last_report = time.monotonic()
    settle_deadline: float | None = None
    while not demo.stop.is_set():
        time.sleep(0.1)
        if time.monotonic() - last_report >= config.progress_interval_s:
            last_report = time.monotonic()
            demo.ledger.flush()
            progress(_progress_line(source, processor, sinks))
        if not source.finished.is_set():
            continue
        if settle_deadline is None:
            settle_deadline = time.monotonic() + config.settle_timeout_s + config.delay_ms / 1000
        _, produced_end = source.progress()
        processor_idle, processor_position = processor.turn_end()
        processor_done = processor_idle and _caught_up(processor_position, produced_end)
        sinks_done = processor_done and all(_caught_up(s.progress()[1], processor.output_end()) for s in sinks)
        if config.count == 0:  # nothing produced: every group has committed to its topic's end (resends among it)
            processor_done = processor_idle and committed_to_end(demo, processor.spec.group, output=False)
            sinks_done = processor_done and all(committed_to_end(demo, s.spec.group, output=True) for s in sinks)
        if sinks_done:
            progress(_progress_line(source, processor, sinks) + " — settled")
            return
        if time.monotonic() > settle_deadline:
            if not processor_done:
                busy = "" if processor_idle else "; records in memory or a write waiting for the broker"
                behind = (f"{processor.location} is behind: {_read_to(processor_position, produced_end)}{busy}; "
                          f"{_where(processor)}")  # fmt: skip
            else:
                end = processor.output_end()
                sink = next(s for s in sinks if not _caught_up(s.progress()[1], end))
                behind = f"{sink.spec.group} is behind: {_read_to(sink.progress()[1], end)}; {_where(sink)}"
            raise DemoError(f"demo did not settle within {config.settle_timeout_s:.0f}s: {behind}")


def committed_to_end(demo: _Demo, group: str, output: bool) -> bool:
    """Whether ``group`` has committed the source (or output) topic up to its end, as the broker says now."""
    topic = (demo.topology.output_topic if output else demo.topology.source_topic).topic
    admin = KafkaAdmin(KafkaConnection(demo.config.bootstrap_servers, cluster=demo.topology.source_topic.cluster))
    answer = admin.watermarks((topic, partition) for partition in range(demo.config.partitions))
    if answer.errors:
        raise DemoError(f"the end of {topic} is not known: {'; '.join(answer.errors)}")
    committed = admin.committed_offsets(group, answer.found)
    return all(committed.get(position, 0) >= end for position, (_, end) in answer.found.items())


def _where(component: _Component) -> str:
    """Where ``component``'s thread is now, as its innermost calls: what a component that stopped reading waits on
    (a client call that does not return, or a poll loop that gets nothing)."""
    frame = sys._current_frames().get(component.ident or -1)
    if frame is None:
        return "its thread has ended"
    calls: list[str] = []
    while frame is not None and len(calls) < 4:
        calls.append(f"{frame.f_code.co_name} ({Path(frame.f_code.co_filename).name}:{frame.f_lineno})")
        frame = frame.f_back
    return "its thread is in " + " <- ".join(calls)


def _read_to(position: dict[int, int], end: dict[int, int]) -> str:
    """Where a group has read to against the end it must reach: "read to 12/14 of partition 0, ..."."""
    parts = (f"{position.get(p, 0)}/{offset} of partition {p}" for p, offset in sorted(end.items()))
    return "read to " + ", ".join(parts)


def _caught_up(position: dict[int, int], end: dict[int, int]) -> bool:
    return all(position.get(partition, 0) >= offset for partition, offset in end.items())


def _progress_line(source: _Source, processor: _Processor, sinks: list[_Sink]) -> str:
    parts = [
        f"produced {source.progress()[0]}",
        f"{processor.spec.group} received {processor.progress()[0]}",
        f"wrote {processor.writes.snapshot()[0]}",
    ]
    parts += [f"{s.spec.group} received {s.progress()[0]}" for s in sinks]
    return "demo: " + ", ".join(parts)
