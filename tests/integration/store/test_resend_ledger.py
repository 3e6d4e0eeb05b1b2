"""The resend ledger on SQLite and PostgreSQL: an attempt is recorded once, then its outcome."""

from __future__ import annotations

import pytest

from khipu.registry.model import TopicRef
from khipu.resend.ledger import INTENDED, PRODUCED, UNRECOVERABLE, ledger_entry
from khipu.resend.plan import Position, ResendPlan, SourceKind, resend_id
from khipu.store import Store

pytestmark = pytest.mark.integration
HOP = "local/demo.orders-enriched -> demo-sink-audit"


def attempt(n: int) -> ResendPlan:
    return ResendPlan(
        "m1", "demo.orders", HOP, n, resend_id("m1", HOP, n), SourceKind.TOPIC,
        Position("local", "demo.orders-enriched", 1, 40), TopicRef("local", "demo.orders-enriched"),
        "demo-sink-audit", "the skipped record",
    )  # fmt: skip


def test_an_attempt_is_recorded_once_then_its_outcome(store: Store) -> None:
    first, second = attempt(1), attempt(2)
    assert store.resends.record_intent(ledger_entry(first), 100) is True
    assert store.resends.record_intent(ledger_entry(first), 101) is False  # a retried task: no second row
    assert store.resends.record_intent(ledger_entry(second), 102) is True
    assert [e["resend_id"] for e in store.resends.in_state(INTENDED)] == [first.resend_id, second.resend_id]
    store.resends.mark_produced(first.resend_id, 1, 977, 200)
    store.resends.mark(second.resend_id, UNRECOVERABLE, 300, "max_attempts passed")
    by_attempt = {e["attempt"]: e for e in store.resends.attempts("m1", HOP)}
    assert (by_attempt[1]["state"], by_attempt[1]["produced_partition"], by_attempt[1]["produced_offset"]) == (
        PRODUCED,
        1,
        977,
    )
    assert by_attempt[1]["source_position"] == "local/demo.orders-enriched[1]@40"
    assert (by_attempt[2]["state"], by_attempt[2]["error"], by_attempt[2]["updated_ms"]) == (
        UNRECOVERABLE,
        "max_attempts passed",
        300,
    )
    assert store.resends.in_state(INTENDED) == []
