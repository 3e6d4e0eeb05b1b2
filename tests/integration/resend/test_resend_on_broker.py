"""A resend attempt against the real broker: the original read back from its log, produced with its resend id,
found again by that id after a run killed between producing and recording it, never produced twice.

The kill here is an exception at a chosen point inside the same process; issue 10's kill-at-random test
(a separate process killed by signal over 100+ trials) builds on these same pieces.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from khipu.kafka.records import StoredRecord, end_offset, find_by_header, produce_record, read_record
from khipu.localstack.broker import BrokerProcess
from khipu.registry.model import TopicRef
from khipu.resend.ledger import LEASE_MS, PRODUCED, Landed, run_attempt
from khipu.resend.plan import Position, ResendPlan, SourceKind, resend_id
from khipu.store import Store
from khipu.tracing.headers import HEADER_RESEND_ID as RESEND_ID_HEADER
from khipu.tracing.headers import HEADER_RESEND_TARGET as RESEND_TARGET_HEADER

pytestmark = pytest.mark.integration


class Killed(Exception):
    pass


@pytest.mark.parametrize("kill", ["after_produce", "while_recording", "never"])
def test_a_killed_attempt_run_again_leaves_one_copy_in_the_topic(
    broker: BrokerProcess, tmp_path: Path, kill: str
) -> None:
    connection = broker.connection()
    topic = f"resend-{secrets.token_hex(4)}"
    broker.admin().ensure_topics({topic: 2})
    original = StoredRecord(b"order-7", b'{"order_id": "7"}', [("khipu-id", b"m7")])
    source_offset = produce_record(connection, topic, 1, original)
    hop = f"local/{topic} -> sink"
    plan = ResendPlan(
        "m7", "orders", hop, 1, resend_id("m7", hop, 1), SourceKind.TOPIC,
        Position("local", topic, 1, source_offset), TopicRef("local", topic), "sink", "the skipped record",
    )  # fmt: skip
    store = Store(f"sqlite:///{tmp_path / 'khipu.db'}")
    store.migrate()
    armed = {"on": kill}

    def place(p: ResendPlan) -> tuple[int, int]:  # the skipped record's partition, from its end now
        assert p.source_position is not None
        return p.source_position.partition, end_offset(connection, topic, p.source_position.partition)

    def produce(p: ResendPlan, partition: int) -> Landed:
        assert p.source_position is not None
        record, why = read_record(
            connection, p.source_position.topic, p.source_position.partition, p.source_position.offset
        )
        assert record is not None, why
        headers = [*record.headers, (RESEND_ID_HEADER, p.resend_id.encode()), (RESEND_TARGET_HEADER, b"sink")]
        offset = produce_record(connection, topic, partition, StoredRecord(record.key, record.value, headers))
        if armed["on"] == "after_produce":
            raise Killed("after producing, before recording")
        return partition, offset

    def find(rid: str, partition: int, from_offset: int) -> Landed | None:
        offset = find_by_header(connection, topic, partition, from_offset, RESEND_ID_HEADER, rid.encode())
        return None if offset is None else (partition, offset)

    class Ledger:
        record_intent = staticmethod(store.resends.record_intent)
        claim = staticmethod(store.resends.claim)
        set_placement = staticmethod(store.resends.set_placement)
        mark = staticmethod(store.resends.mark)
        entry = staticmethod(store.resends.entry)

        @staticmethod
        def mark_produced(rid: str, partition: int, offset: int, at_ms: int) -> None:
            if armed["on"] == "while_recording":
                raise Killed("while recording")
            store.resends.mark_produced(rid, partition, offset, at_ms)

    if kill != "never":
        with pytest.raises(Killed):
            run_attempt(plan, Ledger(), place, find, produce, lambda: 1, "killed-run")
    armed["on"] = "never"
    outcome = run_attempt(plan, Ledger(), place, find, produce, lambda: 2 + LEASE_MS, "restarted-run")
    assert outcome.state == PRODUCED and outcome.produced_now == (kill == "never")

    copies = []
    for offset in range(source_offset + 1, end_offset(connection, topic, 1)):
        record, _ = read_record(connection, topic, 1, offset)
        if record is not None and (RESEND_ID_HEADER, plan.resend_id.encode()) in record.headers:
            copies.append((offset, record))
    assert outcome.landed is not None and [offset for offset, _ in copies] == [outcome.landed[1]]
    ((_, copy),) = copies
    assert (copy.key, copy.value) == (original.key, original.value) and ("khipu-id", b"m7") in copy.headers
    assert (RESEND_TARGET_HEADER, b"sink") in copy.headers
