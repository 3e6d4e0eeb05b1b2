"""Reading the trace topic on the real broker: every line of a batch record is read and tallied, so ``khipu traces
count`` counts traces, not records."""

from __future__ import annotations

import json
import secrets
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
