"""Traced producer and consumer against the real broker: what is traced, when, and what is not."""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from khipu.kafka.trace_topic import read_trace_topic
from khipu.localstack.broker import BrokerProcess
from khipu.localstack.processes import free_port
from khipu.trace import TraceType
from khipu.trace.codec import BATCH_MAX_TRACES, decode_record, split_record
from khipu.trace.model import EmitterMark
from khipu.tracing import (
    HEADER_MESSAGE_ID,
    HEADER_TRACE,
    TracedConsumer,
    TracedProducer,
    TraceEmitter,
    TraceEmitterConfig,
    trace_context,
)
from khipu.tracing.emitter import BACK_POINTERS
from khipu.tracing.headers import ResendMark, TraceContext
from tests.integration.helpers import consume_all, consumer_config, traces_of

pytestmark = pytest.mark.integration


@pytest.fixture
def topics(broker: BrokerProcess) -> tuple[str, str]:
    """A fresh data topic (3 partitions) and trace topic for each test."""
    suffix = secrets.token_hex(3)
    data, traces = f"orders-{suffix}", f"traces-{suffix}"
    broker.admin().ensure_topics({data: 3, traces: 2})
    return data, traces


@pytest.fixture
def emitter(broker: BrokerProcess, topics: tuple[str, str]) -> Iterator[TraceEmitter]:
    with TraceEmitter(
        TraceEmitterConfig(
            bootstrap_servers=broker.bootstrap_servers, location="orders-api", cluster="local", topic=topics[1]
        )
    ) as built:
        yield built


def test_sampled_writes_carry_the_id_and_get_one_sent_trace_at_the_acknowledged_offset(
    broker: BrokerProcess, topics: tuple[str, str], emitter: TraceEmitter
) -> None:
    data, trace_topic = topics
    errors: list[Any] = []
    producer = TracedProducer(
        {"bootstrap.servers": broker.bootstrap_servers}, emitter=emitter, stream="orders", sampling_percent=30
    )
    returned = [
        producer.produce(
            data, value=b"v", on_delivery=lambda err, msg: errors.append(err), attributes={"row_id": str(n)}
        )
        for n in range(400)
    ]
    producer.flush(10)
    emitter.flush(10)

    reader = Consumer(consumer_config(broker, "check"))
    reader.subscribe([data])
    on_topic = consume_all(reader, 400)
    reader.close()
    carried = {ctx.message_id: (m.partition(), m.offset()) for m in on_topic if (ctx := trace_context(m.headers()))}
    sent = traces_of(broker, trace_topic)

    traced_ids = [i for i in returned if i is not None]  # unsampled messages need no id and get none
    assert len(errors) == 400 and not any(errors)
    assert len(set(traced_ids)) == len(traced_ids)
    assert set(traced_ids) == set(carried)
    assert {t.message_id: (t.partition, t.offset) for t in sent} == carried
    assert len(sent) == len(carried)
    assert 0.2 < len(sent) / 400 < 0.4
    assert {(t.type, t.stream, t.location, t.topic, t.sampling_percent) for t in sent} == {
        (TraceType.SENT, "orders", "orders-api", data, 30.0)
    }
    numbers = sorted(
        r.emitter_seq for r in read_trace_topic(broker.bootstrap_servers, trace_topic) if not isinstance(r, Exception)
    )
    assert numbers == list(range(len(numbers)))  # traces and emitter marks share one gap-free sequence
    assert len(numbers) >= len(sent)
    assert {t.attributes["row_id"] for t in sent} <= {str(n) for n in range(400)}


def test_consumer_emits_received_with_group_and_offset_for_traced_records_only(
    broker: BrokerProcess, topics: tuple[str, str], emitter: TraceEmitter
) -> None:
    data, trace_topic = topics
    producer = TracedProducer(
        {"bootstrap.servers": broker.bootstrap_servers}, emitter=emitter, stream="orders", sampling_percent=50
    )
    for n in range(100):
        producer.produce(data, value=str(n).encode())
    plain = TracedProducer({"bootstrap.servers": broker.bootstrap_servers}, emitter=emitter)  # no stream: untraced
    plain.produce(data, value=b"untraced", headers=[("x", b"y")])
    plain.flush(10)
    producer.flush(10)

    consumer = TracedConsumer(
        consumer_config(broker, "enricher"),
        emitter=emitter,
    )
    consumer.subscribe([data])
    records = consume_all(consumer, 101)
    consumer.close()
    emitter.flush(10)

    traced_positions = {(m.partition(), m.offset()) for m in records if trace_context(m.headers())}
    received = [t for t in traces_of(broker, trace_topic) if t.type is TraceType.RECEIVED]
    assert len(records) == 101
    assert {(t.partition, t.offset) for t in received} == traced_positions
    assert len(received) == len(traced_positions)
    assert {(t.group, t.location, t.topic) for t in received} == {("enricher", "orders-api", data)}
    # each RECEIVED points back to the previous (up to 3) traced offsets of its partition, newest first
    by_partition: dict[int, list[int]] = {}
    for partition, offset in sorted(traced_positions):
        by_partition.setdefault(partition, []).append(offset)
    expected_back = {
        (partition, offset): tuple(reversed(offsets[max(0, i - BACK_POINTERS) : i]))
        for partition, offsets in by_partition.items()
        for i, offset in enumerate(offsets)
    }
    assert {(t.partition, t.offset): t.prev_offsets for t in received} == expected_back
    emitter.close()  # its last mark lists the newest offsets received per partition
    marks = [r for r in read_trace_topic(broker.bootstrap_servers, trace_topic) if isinstance(r, EmitterMark)]
    assert marks and set(max(marks, key=lambda m: m.emitter_seq).received) == {
        ("local", data, partition, offset)
        for partition, offsets in by_partition.items()
        for offset in offsets[-BACK_POINTERS:]
    }


def test_processor_output_carries_the_input_id_and_gets_its_own_sent_trace(
    broker: BrokerProcess, topics: tuple[str, str], emitter: TraceEmitter
) -> None:
    data, trace_topic = topics
    source = TracedProducer({"bootstrap.servers": broker.bootstrap_servers}, emitter=emitter, stream="orders")
    ids = {source.produce(data, value=b"in", partition=0) for _ in range(5)}
    source.flush(10)
    output = f"{data}-out"
    broker.admin().ensure_topics({output: 1})
    consumer = TracedConsumer(
        consumer_config(broker, "proc"),
        emitter=emitter,
    )
    consumer.subscribe([data])
    processor_out = TracedProducer({"bootstrap.servers": broker.bootstrap_servers}, emitter=emitter)
    from khipu.tracing import carry_trace_headers

    for msg in consume_all(consumer, 5):
        processor_out.produce(output, value=b"out", headers=carry_trace_headers(msg.headers()))
    processor_out.flush(10)
    consumer.close()

    out_sent = [t for t in traces_of(broker, trace_topic) if t.type is TraceType.SENT and t.topic == output]
    assert {t.message_id for t in out_sent} == ids
    assert len(out_sent) == 5


def test_failed_delivery_emits_no_sent_trace_and_the_apps_callback_still_fires(
    broker: BrokerProcess, topics: tuple[str, str], emitter: TraceEmitter
) -> None:
    data, trace_topic = topics
    failures: list[Any] = []
    # The application's cluster is unreachable (nothing listens on this port): every write times out.
    producer = TracedProducer(
        {"bootstrap.servers": f"127.0.0.1:{free_port()}", "message.timeout.ms": 1500}, emitter=emitter, stream="orders"
    )
    for _ in range(20):
        producer.produce(data, value=b"v", on_delivery=lambda err, msg: failures.append(err))
    producer.flush(10)
    emitter.flush(10)

    assert len(failures) == 20 and all(err is not None for err in failures)
    assert emitter.stats().emitted == 0
    assert traces_of(broker, trace_topic) == []


def test_with_the_trace_channel_down_the_app_delivers_everything_and_dropped_traces_are_counted(
    broker: BrokerProcess, topics: tuple[str, str]
) -> None:
    data, _ = topics
    dead = TraceEmitter(
        TraceEmitterConfig(
            bootstrap_servers=f"127.0.0.1:{free_port()}",
            location="orders-api",
            cluster="local",
            queue_max_traces=500,
            delivery_timeout_ms=2000,
            commit_flush_timeout_s=0.5,
            close_timeout_s=1.0,
        )
    )
    delivered: list[Any] = []
    producer = TracedProducer(
        {"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5},
        emitter=dead,
        stream="orders",
        sampling_percent=100,
    )
    for n in range(5000):
        producer.produce(data, value=b"v", on_delivery=lambda err, msg: delivered.append(err))
        if n % 500 == 0:
            producer.poll(0)
    remaining = producer.flush(20)
    stats = dead.close()

    assert remaining == 0
    assert len(delivered) == 5000 and not any(delivered)  # the application lost nothing
    assert stats.emitted == 5000
    assert stats.accepted <= 500  # never more than the bounded queue
    assert stats.dropped_queue_full >= 4500
    assert stats.delivered == 0
    assert stats.dropped == stats.emitted  # every trace accounted for: none silently vanished


def test_commit_delivers_pending_traces_before_the_offsets(broker: BrokerProcess, topics: tuple[str, str]) -> None:
    data, trace_topic = topics
    slow = TraceEmitter(
        TraceEmitterConfig(
            bootstrap_servers=broker.bootstrap_servers,
            location="sink",
            cluster="local",
            topic=trace_topic,
            producer_config={"linger.ms": "3000"},
        )
    )  # traces would wait 3 s
    producer = TracedProducer({"bootstrap.servers": broker.bootstrap_servers}, emitter=slow, stream="orders")
    for _ in range(10):
        producer.produce(data, value=b"v")
    producer.flush(10)
    consumer = TracedConsumer(
        consumer_config(broker, "sink"),
        emitter=slow,
    )
    consumer.subscribe([data])
    records = consume_all(consumer, 10)
    consumer.commit(asynchronous=False)

    received_now = [t for t in traces_of(broker, trace_topic) if t.type is TraceType.RECEIVED]
    consumer.close()
    slow.close()
    assert len(records) == 10
    assert len(received_now) == 10


def test_consumer_without_group_id_is_refused_with_a_clear_error(emitter: TraceEmitter) -> None:
    from khipu.tracing import TracingConfigError

    with pytest.raises(TracingConfigError, match=r"group\.id"):
        TracedConsumer({"bootstrap.servers": "127.0.0.1:1"}, emitter=emitter)
    assert (HEADER_TRACE, HEADER_MESSAGE_ID) == ("khipu", "khipu-id")


def test_a_transactional_producer_works_unchanged_and_its_traces_say_what_compaction_and_transactions_need(
    broker: BrokerProcess, topics: tuple[str, str], emitter: TraceEmitter
) -> None:
    """init/begin/produce/send_offsets/commit and abort through TracedProducer as through Producer: every delivered
    record gets one SENT trace with the record's own timestamp (as a consumer reads it back), its key's hash and
    whether it was a tombstone, marked transactional; read_committed and read_uncommitted consumers see what Kafka
    says they see, and their RECEIVED traces say which they were."""
    data, trace_topic = topics
    producer = TracedProducer(
        {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"tx-{data}"},
        emitter=emitter,
        stream="orders",
    )
    producer.init_transactions(30)
    outcomes: dict[str, str] = {}
    tombstones: set[str] = set()
    for outcome in ("commit", "abort", "commit"):
        producer.begin_transaction()
        for n in range(5):
            value = None if n == 4 else f"{outcome}-{n}".encode()  # the last of each a tombstone
            message_id = producer.produce(data, value=value, key=f"k{n}".encode(), partition=n % 3)
            assert message_id is not None
            outcomes[message_id] = outcome
            if value is None:
                tombstones.add(message_id)
        producer.flush(10)
        producer.commit_transaction(30) if outcome == "commit" else producer.abort_transaction(30)
    group = consumer_config(broker, f"tx-check-{data}")
    seen: dict[str, dict[str, tuple[int, bytes | None]]] = {}
    for isolation in ("read_committed", "read_uncommitted"):
        consumer = TracedConsumer({**group, "group.id": f"{isolation}-{data}", "isolation.level": isolation},
                                  emitter=emitter)  # fmt: skip
        consumer.subscribe([data])
        got = consume_all(consumer, 15 if isolation == "read_uncommitted" else 10)
        consumer.close()
        seen[isolation] = {
            ctx.message_id: (m.timestamp()[1], m.key()) for m in got if (ctx := trace_context(m.headers()))
        }
    emitter.flush(10)
    committed = {m for m, outcome in outcomes.items() if outcome == "commit"}
    assert set(seen["read_committed"]) == committed and set(seen["read_uncommitted"]) == set(outcomes)
    traces = traces_of(broker, trace_topic)
    sent = {t.message_id: t for t in traces if t.type is TraceType.SENT}
    assert set(sent) == set(outcomes) and all(t.transactional for t in sent.values())
    for message_id, (timestamp, key) in seen["read_uncommitted"].items():
        assert sent[message_id].timestamp_ms == timestamp  # the record's own time, not when the report came
        assert sent[message_id].key_hash == hashlib.sha256(key or b"").hexdigest()[:16]
    assert {m for m, t in sent.items() if t.tombstone} == tombstones
    received = [t for t in traces if t.type is TraceType.RECEIVED]
    assert {t.group: t.read_uncommitted for t in received} == {
        f"read_committed-{data}": False,
        f"read_uncommitted-{data}": True,
    }


def test_the_emitter_packs_traces_several_to_a_record_numbered_in_order_and_counts_each_delivered(
    broker: BrokerProcess, topics: tuple[str, str], emitter: TraceEmitter
) -> None:
    data, trace_topic = topics
    producer = TracedProducer({"bootstrap.servers": broker.bootstrap_servers}, emitter=emitter, stream="orders")
    written = [producer.produce(data, value=str(n).encode(), key=str(n % 7).encode()) for n in range(1200)]
    assert producer.flush(20) == 0
    stats = emitter.close()

    reader = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": f"raw-{secrets.token_hex(3)}",
                       "auto.offset.reset": "earliest", "enable.partition.eof": True})  # fmt: skip
    reader.subscribe([trace_topic])
    records, ends = [], set()
    while len(ends) < 2:
        msg = reader.poll(1.0)
        assert msg is not None, "the trace topic was not read to its end"
        if msg.error() is not None:
            ends.add(msg.partition())
            continue
        records.append(msg)
    reader.close()

    # One emitter's records all sit on one partition (keyed by its id), so its lines are read in the order written.
    assert {msg.key() for msg in records} == {emitter.emitter_id.encode()}
    lines = [decode_record(line) for msg in records for line in split_record(msg.value())]
    traces = [line for line in lines if not isinstance(line, EmitterMark)]
    assert sorted(t.message_id for t in traces) == sorted(written)  # each write traced once, none lost
    assert len(records) < len(traces) / 10  # several hundred traces to a record, not one
    assert all(len(split_record(msg.value())) <= BATCH_MAX_TRACES + 1 for msg in records)  # a mark may close one
    numbers = [line.emitter_seq for line in lines]
    assert numbers == list(range(len(lines)))  # numbered in the order they travel: no gap, none out of order
    assert (stats.emitted, stats.delivered, stats.dropped, stats.pending) == (1200, 1200, 0, 0)


def test_consume_hands_over_every_record_but_a_resend_for_another_group_and_traces_the_traced_ones(
    broker: BrokerProcess, topics: tuple[str, str], emitter: TraceEmitter
) -> None:
    """``consume`` finds the records with headers in C and runs Python only for those; a resend for another group
    among them sends the rest of the batch the careful way. What was written is the truth."""
    _, trace_topic = topics
    data = f"one-{secrets.token_hex(3)}"
    broker.admin().ensure_topics({data: 1})
    traced = [TraceContext(f"m-{n}", "orders", 100.0) for n in range(3)]
    for_other = ResendMark("r-1", "orders/hop", "other")
    written: list[tuple[bytes, list[tuple[str, bytes]] | None]] = [
        (b"plain-0", None),
        (b"traced-0", traced[0].as_headers()),
        (b"resent-for-other", traced[1].as_headers() + for_other.as_headers()),
        (b"plain-1", [("app-header", b"x")]),  # headers, none of them Khipu's
        (b"traced-2", traced[2].as_headers()),
        (b"plain-2", None),
    ]
    plain = Producer({"bootstrap.servers": broker.bootstrap_servers})
    for value, headers in written:
        plain.produce(data, value=value, headers=headers)
    assert plain.flush(10) == 0

    got: dict[str, list[bytes]] = {}
    for group, expected in (("mine", 5), ("other", 6)):
        consumer = TracedConsumer(consumer_config(broker, group), emitter=emitter)
        consumer.subscribe([data])
        records: list[Any] = []
        deadline = time.monotonic() + 30
        while len(records) < expected and time.monotonic() < deadline:
            records.extend(msg for msg in consumer.consume(100, 0.5) if msg.error() is None)
        consumer.commit(asynchronous=False)
        consumer.close()
        got[group] = [msg.value() for msg in records]
    emitter.flush(10)

    assert got["mine"] == [value for value, _ in written if value != b"resent-for-other"]
    assert got["other"] == [value for value, _ in written]
    received = sorted(
        (t.group, t.message_id, t.offset, bool(t.attributes)) for t in traces_of(broker, trace_topic) if t.topic == data
    )
    assert received == [
        ("mine", "m-0", 1, False), ("mine", "m-2", 4, False),
        ("other", "m-0", 1, False), ("other", "m-1", 2, True), ("other", "m-2", 4, False),
    ]  # fmt: skip


def test_records_one_poll_returned_that_the_queue_cannot_take_are_numbered_counted_and_leave_a_gap(
    broker: BrokerProcess, topics: tuple[str, str]
) -> None:
    """The consumer hands a poll's traced records to the emitter in one call. With room for 2 traces, 2 of 4 are
    refused: each still takes its number (the detector sees the gap), is counted as dropped, and still moves the
    partition's back-pointers on (the next trace points at the refused ones' offsets: they were received)."""
    _, trace_topic = topics
    config = TraceEmitterConfig(broker.bootstrap_servers, "reader", "local", trace_topic, queue_max_traces=2)
    emitter = TraceEmitter(config)
    context = TraceContext("m-0", "orders", 100.0)
    records = [(context._replace(message_id=f"m-{offset}"), "orders", 0, offset, None) for offset in range(4)]
    emitter.received("local", "g", False, None, records)
    refused = emitter.stats()
    emitter.flush(10)  # room again: the next trace is taken
    emitter.received("local", "g", False, None, [(context._replace(message_id="m-4"), "orders", 0, 4, None)])
    stats = emitter.close()

    traces = traces_of(broker, trace_topic)
    assert [(t.message_id, t.emitter_seq, t.prev_offsets) for t in traces] == [
        ("m-0", 0, ()),
        ("m-1", 1, (0,)),
        ("m-4", 4, (3, 2, 1)),
    ]
    assert (refused.emitted, refused.accepted, refused.dropped_queue_full) == (4, 2, 2)
    assert (stats.emitted, stats.delivered, stats.dropped_queue_full, stats.pending) == (5, 3, 2, 0)


def test_a_stream_name_the_trace_header_cannot_carry_is_refused_with_a_clear_error(emitter: TraceEmitter) -> None:
    from khipu.tracing import TracingConfigError

    with pytest.raises(TracingConfigError, match=r"stream.*'my orders'.*letters, digits"):
        TracedProducer({"bootstrap.servers": "127.0.0.1:1"}, emitter=emitter, stream="my orders")
