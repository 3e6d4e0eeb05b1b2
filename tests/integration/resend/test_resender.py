"""A resend run against the real broker and a real store: what is resent, from where, to whom, once.

The pipeline and its route: tests/integration/resend/pipeline.py.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from sqlalchemy import select

from khipu.kafka.records import end_offset
from khipu.kafka.trace_topic import read_trace_topic
from khipu.registry.model import ResendMode
from khipu.resend.run import ResendRequestError, ResendSelection
from khipu.store import schema
from khipu.tracing import TracedConsumer, TraceEmitter, TraceEmitterConfig
from khipu.tracing.headers import (
    ATTRIBUTE_RESEND_ID,
    HEADER_RESEND_HOP,
    HEADER_RESEND_ID,
    HEADER_RESEND_TARGET,
    TraceContext,
    trace_context,
)
from khipu.verdicts.model import Cause, VerdictKind
from tests.integration.helpers import consumer_config
from tests.integration.resend.pipeline import Pipeline, message_id_of, registry, resent_copies

pytestmark = pytest.mark.integration


def test_a_run_resends_each_confirmed_loss_once_to_those_who_missed_it_and_gives_up_on_what_is_gone(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    hops = pipeline.hops
    # m-drop: proc read it (at in[0]) and wrote nothing on; m-skip: s1 committed past out[1]; m-gone: truncated
    at_in = pipeline.write(pipeline.inp, 0, "m-drop", b"order-1")
    pipeline.verdict("m-drop", hops["read_in"], VerdictKind.DELIVERED, partition=0, offset=at_in)
    pipeline.verdict("m-drop", hops["write_out"], VerdictKind.CONFIRMED_LOST, cause=Cause.DROPPED_IN_PROCESSOR)
    at_out = pipeline.write(pipeline.out, 1, "m-skip", b"order-2")
    pipeline.verdict(
        "m-skip", hops["s1"], VerdictKind.CONFIRMED_LOST, cause=Cause.SKIPPED_BY_CONSUMER, partition=1, offset=at_out
    )
    pipeline.verdict("m-skip", hops["s2"], VerdictKind.DELIVERED, partition=1, offset=at_out)
    gone_at = pipeline.write(pipeline.out, 0, "m-gone", b"order-3")
    pipeline.broker.admin().delete_records({(pipeline.out, 0): gone_at + 1})
    pipeline.verdict(
        "m-gone", hops["s2"], VerdictKind.CONFIRMED_LOST, cause=Cause.TRUNCATED, partition=0, offset=gone_at
    )
    pipeline.verdict("m-fine", hops["s2"], VerdictKind.DELIVERED, partition=0, offset=0)

    dry = pipeline.resender().run(ResendSelection(dry_run=True))
    assert dry.counts() == {"would_give_up": 1, "would_resend": 2}, dry.as_dict()
    assert pipeline.store.resends.attempts("m-skip", hops["s1"]) == [] and resent_copies(pipeline) == []
    said = {o.message_id: o for o in dry.outcomes}
    assert said["m-skip"].destination == f"local/{pipeline.out} for s1 only"
    assert said["m-drop"].source == f"local/{pipeline.inp}[0]@{at_in}"

    run = pipeline.resender().run(ResendSelection())
    assert run.counts() == {"produced": 2, "unrecoverable": 1}, run.as_dict()
    copies = resent_copies(pipeline)
    assert len(copies) == 2
    by_id = {message_id_of(m): m for m in copies}
    skip_copy, drop_copy = by_id["m-skip"], by_id["m-drop"]
    assert (skip_copy.partition(), skip_copy.value()) == (1, b"order-2")  # the skipped record's partition and payload
    assert dict(skip_copy.headers())[HEADER_RESEND_TARGET] == b"s1"
    assert dict(skip_copy.headers())[HEADER_RESEND_HOP] == hops["s1"].encode()
    assert drop_copy.value() == b"order-1" and HEADER_RESEND_TARGET not in dict(drop_copy.headers())  # every reader
    ledger = pipeline.store.resends.attempts("m-skip", hops["s1"])
    assert [(e["state"], e["produced_partition"], e["produced_offset"]) for e in ledger] == [
        ("produced", 1, skip_copy.offset())
    ]
    gone = {r["hop"]: r for r in pipeline.store.verdicts.read_messages(["m-gone"])}[hops["s2"]]
    assert gone["verdict"] == "UNRECOVERABLE" and "has left the log" in gone["detail"], gone
    history = pipeline.store.verdicts.history("m-gone")
    assert [(h["from_verdict"], h["to_verdict"], h["decided_by"]) for h in history] == [
        ("CONFIRMED_LOST", "UNRECOVERABLE", "resend")
    ]

    again = pipeline.resender().run(ResendSelection())  # within the wait: nothing produced again
    assert again.counts() == {"waiting": 2}, again.as_dict()
    unread = pipeline.resender(wait_ms=0).run(ResendSelection())  # past it, but no group has read the copies
    assert unread.counts() == {"waiting": 2} and all("has not read past it" in o.detail for o in unread.outcomes)
    assert len(resent_copies(pipeline)) == 2

    # the groups: s1 gets both copies, s2 only the write-hop one (it passes over s1's silently, untraced)
    trace_topic = f"traces-{secrets.token_hex(3)}"
    pipeline.broker.admin().ensure_topics({trace_topic: 1})
    seen: dict[str, list[bytes]] = {}
    config = TraceEmitterConfig(
        bootstrap_servers=pipeline.broker.bootstrap_servers, location="sinks", cluster="local", topic=trace_topic
    )
    expected = {"s1": [b"m-drop", b"m-skip", b"m-skip"], "s2": [b"m-drop", b"m-skip"]}  # the originals and copies
    ends_of_out = [TopicPartition(pipeline.out, p) for p in (0, 1)]
    ends = {
        tp.partition: consumer_end
        for tp in ends_of_out
        if (consumer_end := end_offset(pipeline.broker.connection(), tp.topic, tp.partition))
    }
    committed: dict[str, dict[int, int]] = {}
    with TraceEmitter(config) as emitter:
        for group, wanted in expected.items():
            consumer = TracedConsumer(consumer_config(pipeline.broker, group), emitter=emitter)
            consumer.subscribe([pipeline.out])
            got: list[bytes] = []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # until the wanted arrived, then 2 s more: nothing else comes
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    got.append(message_id_of(msg).encode())
                    consumer.commit(message=msg, asynchronous=False)  # as an application commits what it did
                if len(got) >= len(wanted):
                    deadline = min(deadline, time.monotonic() + 2)
            committed[group] = {tp.partition: tp.offset for tp in consumer.committed(ends_of_out, timeout=10)}
            consumer.close()
            seen[group] = sorted(got)
    assert seen == expected
    # read past and still not RESENT (no detector here): the wait is over, the next attempt goes out
    next_attempt = pipeline.resender(wait_ms=0).run(ResendSelection())
    assert next_attempt.counts() == {"produced": 2} and {o.attempt for o in next_attempt.outcomes} == {2}
    # s2's last record on out[1] is the copy it passed over: its commit of the record before goes past it too
    assert committed == {"s1": ends, "s2": ends}
    traces = [t for t in read_trace_topic(pipeline.broker.bootstrap_servers, trace_topic) if hasattr(t, "group")]
    marked = sorted((t.group, t.message_id) for t in traces if ATTRIBUTE_RESEND_ID in t.attributes)
    assert marked == [("s1", "m-drop"), ("s1", "m-skip"), ("s2", "m-drop")]


def ledger_rows(pipeline: Pipeline) -> list[dict[str, Any]]:
    with pipeline.store.engine.begin() as tx:
        return [dict(row._mapping) for row in tx.execute(select(schema.resend_ledger))]


def test_a_resend_asked_for_what_cannot_be_resent_is_refused_and_writes_nothing(pipeline: Pipeline) -> None:
    hops = pipeline.hops
    pipeline.verdict("m-fine", hops["s2"], VerdictKind.DELIVERED, partition=0, offset=0)
    resender = pipeline.resender()
    manual = frozenset({ResendMode.AUTO, ResendMode.MANUAL})
    refusals = {
        "unknown stream": ResendSelection(manual, streams=("payments",)),
        "unknown hop": ResendSelection(manual, hop="local/nowhere -> s9"),
        "not confirmed lost": ResendSelection(manual, message_ids=("m-fine",)),
        "no verdict": ResendSelection(manual, message_ids=("m-none",)),
    }
    said = {}
    for name, selection in refusals.items():
        with pytest.raises(ResendRequestError) as refused:
            resender.run(selection)
        said[name] = str(refused.value)
    assert "payments" in said["unknown stream"] and "orders" in said["unknown stream"]
    assert "local/nowhere -> s9" in said["unknown hop"] and hops["s1"] in said["unknown hop"]
    assert "not confirmed lost" in said["not confirmed lost"] and "DELIVERED" in said["not confirmed lost"]
    assert "m-none" in said["no verdict"]
    assert ledger_rows(pipeline) == [] and resent_copies(pipeline) == []
    assert [r["verdict"] for r in pipeline.store.verdicts.rows()] == ["DELIVERED"]  # no verdict changed


def test_the_recovery_hook_gives_the_payload_when_the_log_has_lost_it_and_a_failing_hook_fails_only_its_loss(
    pipeline: Pipeline,
) -> None:
    hops = pipeline.hops
    for message_id in ("m-a", "m-b"):
        at = pipeline.write(pipeline.out, 0, message_id, message_id.encode())
        pipeline.broker.admin().delete_records({(pipeline.out, 0): at + 1})
        pipeline.verdict(
            message_id, hops["s2"], VerdictKind.CONFIRMED_LOST, cause=Cause.TRUNCATED, partition=0, offset=at
        )

    pipeline.registry = registry(pipeline.inp, pipeline.out, hook="tests.integration.resend.hooks:row_is_gone")
    failed = pipeline.resender(wait_ms=0).run(ResendSelection())
    assert failed.counts() == {"failed": 2}
    assert all("row_is_gone raised LookupError: no row for" in o.detail for o in failed.outcomes)
    kinds = {r["message_id"]: r["verdict"] for r in pipeline.store.verdicts.read_messages(["m-a", "m-b"])}
    assert kinds == {"m-a": "CONFIRMED_LOST", "m-b": "CONFIRMED_LOST"}  # the loss stays, the error is recorded
    assert [e["state"] for e in pipeline.store.resends.attempts("m-a", hops["s2"])] == ["failed"]

    pipeline.registry = registry(pipeline.inp, pipeline.out, hook="tests.integration.resend.no_such_module:f")
    assert pipeline.resender().run(ResendSelection()).counts() == {"waiting": 2}  # a failed attempt waits to retry
    missing = pipeline.resender(wait_ms=0).run(ResendSelection())
    assert {o.state for o in missing.outcomes} == {"failed"}
    assert "cannot be imported: ModuleNotFoundError" in missing.outcomes[0].detail

    pipeline.registry = registry(pipeline.inp, pipeline.out, hook="tests.integration.resend.hooks:order_from_database")
    fixed = pipeline.resender(wait_ms=0).run(ResendSelection())  # failures produced nothing: not counted
    assert fixed.counts() == {"produced": 2} and {o.attempt for o in fixed.outcomes} == {3}
    assert [e["state"] for e in pipeline.store.resends.attempts("m-a", hops["s2"])] == ["failed", "failed", "produced"]


def test_the_recovery_hook_payload_is_resent_with_the_messages_trace_headers(pipeline: Pipeline) -> None:
    hops = pipeline.hops
    at = pipeline.write(pipeline.out, 1, "m-h", b"m-h")
    pipeline.broker.admin().delete_records({(pipeline.out, 1): at + 1})
    pipeline.verdict("m-h", hops["s1"], VerdictKind.CONFIRMED_LOST, cause=Cause.TRUNCATED, partition=1, offset=at)
    pipeline.registry = registry(pipeline.inp, pipeline.out, hook="tests.integration.resend.hooks:order_from_database")
    run = pipeline.resender().run(ResendSelection())
    assert run.counts() == {"produced": 1}, run.as_dict()
    (copy,) = resent_copies(pipeline)
    headers = dict(copy.headers())
    assert copy.value() == b'{"order_id": null, "rebuilt_for": "m-h"}'
    assert trace_context(copy.headers()) == TraceContext("m-h", "orders", 100.0)
    assert headers[HEADER_RESEND_TARGET] == b"s1"
    assert headers[HEADER_RESEND_ID] == run.outcomes[0].resend_id.encode()
