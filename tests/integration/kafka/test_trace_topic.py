"""Reading the trace topic on the real broker: every line of a batch record is read and tallied, so ``khipu traces
count`` counts traces, not records."""

from __future__ import annotations

import json
import secrets
import threading
import time
from typing import Any

import pytest
from confluent_kafka import Producer

from khipu.cli import main
from khipu.kafka.trace_topic import read_trace_topic, tally_traces
from khipu.localstack.broker import BrokerProcess
from khipu.registry.model import Hop
from khipu.trace.codec import TraceDecodeError, encode_batch, encode_mark, encode_trace
from khipu.trace.model import EmitterMark, Trace, TraceType

pytestmark = pytest.mark.integration


def trace(n: int, **changes: Any) -> Trace:
    fields: dict[str, Any] = dict(
        message_id=f"m{n}", stream="orders", location="api", cluster="local", type=TraceType.SENT, timestamp_ms=1_000,
        topic="orders", partition=0, offset=n, group=None, emitter_id="api-e1", emitter_seq=n, sampling_percent=100.0,
    )  # fmt: skip
    return Trace(**{**fields, **changes})


def test_each_line_of_a_batch_record_is_read_in_order_and_tallied(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = f"traces-{secrets.token_hex(3)}"
    broker.admin().ensure_trace_topic(topic, 1)
    received = trace(2, type=TraceType.RECEIVED, group="sink", location="sink", emitter_id="sink-e1", emitter_seq=0)
    mark = EmitterMark("api-e1", "api", 4, 1_004)
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    for value in (
        encode_batch([encode_trace(trace(0)), encode_trace(trace(1)), encode_trace(received)]),
        encode_batch([encode_trace(trace(3)), json.dumps({"v": 3}).encode(), encode_mark(mark)]),
        encode_trace(trace(5)),  # a record of one trace
        json.dumps({**json.loads(encode_trace(trace(6))), "offset": -1}, indent=2).encode(),  # pretty, malformed
    ):
        producer.produce(topic, value=value, partition=0)
    assert producer.flush(10) == 0

    read = read_trace_topic(broker.bootstrap_servers, topic)
    assert [r.message_id if isinstance(r, Trace) else type(r).__name__ for r in read] == [
        "m0", "m1", "m2", "m3", "TraceDecodeError", "EmitterMark", "m5", "TraceDecodeError",
    ]  # fmt: skip
    assert read[2] == received and read[5] == mark
    assert [e.field for e in read if isinstance(e, TraceDecodeError)] == ["message_id", "offset"]
    tally = tally_traces(read)
    sent, read_hop = Hop.of_trace(trace(0)).id, Hop.of_trace(received).id
    assert tally.by_hop == {(sent, "SENT"): 4, (read_hop, "RECEIVED"): 1}
    assert (tally.total, tally.marks, dict(tally.malformed)) == (5, 1, {"message_id": 1, "offset": 1})

    monkeypatch.setenv("KHIPU_BOOTSTRAP_SERVERS", broker.bootstrap_servers)
    monkeypatch.setenv("KHIPU_TRACE_TOPIC", topic)
    capsys.readouterr()
    assert main(["traces", "count", "--timeout", "30"]) == 0
    printed = capsys.readouterr().out
    assert f"{topic} on {broker.bootstrap_servers}: 5 traces" in printed  # 4 records, 5 traces
    assert "emitter marks: 1" in printed and "malformed (field offset): 1" in printed


def test_a_partition_written_all_the_while_is_read_to_where_it_ended_when_asked(broker: BrokerProcess) -> None:
    """A fetch that finds records never reports end-of-partition, so a partition written more often than a fetch
    waits (500 ms) may never report it: the reader stops at the stable end it asked for before reading."""
    topic = f"traces-{secrets.token_hex(3)}"
    broker.admin().ensure_trace_topic(topic, 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0, "enable.idempotence": True})
    delivered: list[int] = []  # emitter_seq of each record the broker acknowledged, in order

    def on_delivery(error: Any, msg: Any) -> None:
        if error is None:
            delivered.append(json.loads(msg.value())["emitter_seq"])

    seq = 0
    stop = threading.Event()

    def write(until: threading.Event | None) -> None:
        nonlocal seq
        while until is None or not until.is_set():
            producer.produce(topic, value=encode_trace(trace(seq)), partition=0, on_delivery=on_delivery)
            producer.flush(10)
            seq += 1
            if until is None and seq == 20:
                return
            time.sleep(0.02)

    write(None)
    writer = threading.Thread(target=write, args=(stop,), daemon=True)
    writer.start()
    time.sleep(1.0)  # a record every ~20 ms by now
    before = len(delivered)
    try:
        read = read_trace_topic(broker.bootstrap_servers, topic, timeout_s=20)
        after = len(delivered)
    finally:
        stop.set()
        writer.join(10)
    seqs = [r.emitter_seq for r in read if isinstance(r, Trace)]
    assert seqs == delivered[: len(seqs)]  # in order, none skipped
    assert before <= len(seqs) <= after, (before, len(seqs), after)
    assert after > before  # the partition was written all the while the read ran


def test_an_open_transaction_ends_the_read_where_it_began(broker: BrokerProcess) -> None:
    """Records at and after an undecided transaction's first record are past the last stable offset: the reader
    (read_committed) returns the ones before it and does not wait for the transaction."""
    topic = f"traces-{secrets.token_hex(3)}"
    broker.admin().ensure_trace_topic(topic, 1)
    plain = Producer({"bootstrap.servers": broker.bootstrap_servers})
    for n in range(3):
        plain.produce(topic, value=encode_trace(trace(n)), partition=0)
    assert plain.flush(10) == 0
    open_txn = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"t-{topic}"})
    open_txn.init_transactions(30)
    open_txn.begin_transaction()
    open_txn.produce(topic, value=encode_trace(trace(3)), partition=0)
    assert open_txn.flush(10) == 0
    for n in (4, 5):
        plain.produce(topic, value=encode_trace(trace(n)), partition=0)
    assert plain.flush(10) == 0
    try:
        read = read_trace_topic(broker.bootstrap_servers, topic, timeout_s=20)
        assert [r.message_id for r in read if isinstance(r, Trace)] == ["m0", "m1", "m2"]
    finally:
        open_txn.abort_transaction(30)


def test_a_partition_ending_in_a_transaction_marker_is_read_to_its_end(broker: BrokerProcess) -> None:
    """A committed transaction leaves its marker last in the log: no record reaches the end, end-of-partition does."""
    topic = f"traces-{secrets.token_hex(3)}"
    broker.admin().ensure_trace_topic(topic, 1)
    plain = Producer({"bootstrap.servers": broker.bootstrap_servers})
    plain.produce(topic, value=encode_trace(trace(0)), partition=0)
    assert plain.flush(10) == 0
    committed = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"c-{topic}"})
    committed.init_transactions(30)
    committed.begin_transaction()
    committed.produce(topic, value=encode_trace(trace(1)), partition=0)
    committed.commit_transaction(30)
    read = read_trace_topic(broker.bootstrap_servers, topic, timeout_s=20)
    assert [r.message_id for r in read if isinstance(r, Trace)] == ["m0", "m1"]
