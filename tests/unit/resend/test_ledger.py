"""One copy per resend attempt, whatever point a run was killed at: the steps as a table, then every kill point
walked against the real ledger (SQLite store).

The destination here is a list standing in for the topic, searched by resend id as the real one is by
header: it lets each kill point be hit exactly. The kill-at-random test against a real broker (100+
trials, counting records in the destination topic) is issue 10's next step.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from khipu.registry.model import TopicRef
from khipu.resend.ledger import (
    INTENDED,
    PRODUCED,
    UNRECOVERABLE,
    Landed,
    Step,
    ledger_entry,
    next_step,
    run_attempt,
)
from khipu.resend.plan import Position, ResendPlan, SourceKind, resend_id
from khipu.store import Store


@pytest.mark.parametrize(
    ("state", "recoverable", "landed", "step"),
    [
        (None, True, None, Step.RECORD_INTENT),
        (None, False, None, Step.RECORD_INTENT),  # an unrecoverable loss is recorded too, with its reason
        (INTENDED, True, None, Step.PRODUCE),
        (INTENDED, True, (0, 7), Step.RECORD_LANDED),  # killed after producing, before recording
        (INTENDED, False, None, Step.RECORD_UNRECOVERABLE),
        (PRODUCED, True, (0, 7), Step.DONE),
        (PRODUCED, True, None, Step.DONE),  # the ledger's word is final once it says produced
        (UNRECOVERABLE, False, None, Step.DONE),
        ("failed", True, None, Step.DONE),  # a failed attempt stays failed: the next attempt has its own id
    ],
)
def test_next_step(state: str | None, recoverable: bool, landed: Landed | None, step: Step) -> None:
    assert next_step(state, recoverable, landed) is step


class Killed(Exception):
    """The task was killed here."""


def plan(message_id: str, recoverable: bool = True) -> ResendPlan:
    hop = "local/demo.orders-enriched -> demo-sink-audit"
    return ResendPlan(
        message_id=message_id,
        stream="demo.orders",
        hop=hop,
        attempt=1,
        resend_id=resend_id(message_id, hop, 1),
        source=SourceKind.TOPIC if recoverable else SourceKind.NONE,
        source_position=Position("local", "demo.orders-enriched", 0, 5) if recoverable else None,
        destination=TopicRef("local", "demo.orders-enriched") if recoverable else None,
        target_group="demo-sink-audit" if recoverable else None,
        reason="the skipped record" if recoverable else "UNRECOVERABLE: gone",
    )


KILL_POINTS = ("before_intent", "after_intent", "before_produce", "after_produce", "while_recording", "never")


@pytest.mark.parametrize("kill", KILL_POINTS)
def test_a_run_killed_anywhere_and_run_again_leaves_exactly_one_copy(tmp_path: Path, kill: str) -> None:
    store = Store(f"sqlite:///{tmp_path / 'khipu.db'}")
    store.migrate()
    topic: list[str] = []  # resend ids of the records in the destination, in offset order
    clock = iter(range(1_000, 2_000))

    def hit(point: str) -> None:
        if point == kill:
            raise Killed(point)

    class Ledger:
        def record_intent(self, entry: dict[str, object], at_ms: int) -> bool:
            hit("before_intent")
            written = store.resends.record_intent(entry, at_ms)
            hit("after_intent")
            return written

        def mark_produced(self, rid: str, partition: int, offset: int, at_ms: int) -> None:
            hit("while_recording")
            store.resends.mark_produced(rid, partition, offset, at_ms)

        def mark(self, rid: str, state: str, at_ms: int, error: str | None = None) -> None:
            store.resends.mark(rid, state, at_ms, error)

        def entry(self, rid: str) -> dict[str, object] | None:
            return store.resends.entry(rid)

    topic.append("an earlier record")  # the copy lands after the partition's end at intent time
    places: list[int] = []

    def place(p: ResendPlan) -> tuple[int, int]:
        places.append(len(topic))
        return 0, len(topic)

    def produce(p: ResendPlan, partition: int) -> Landed:
        hit("before_produce")
        topic.append(p.resend_id)
        hit("after_produce")
        return partition, len(topic) - 1

    def find(rid: str, partition: int, from_offset: int) -> Landed | None:
        return next(((partition, at) for at in range(from_offset, len(topic)) if topic[at] == rid), None)

    now: Callable[[], int] = lambda: next(clock)  # noqa: E731
    attempt = plan("m1")
    if kill != "never":
        with pytest.raises(Killed):
            run_attempt(attempt, Ledger(), place, find, produce, now)
    kill = "never"  # the restarted task runs to the end
    outcome = run_attempt(attempt, Ledger(), place, find, produce, now)
    again = run_attempt(attempt, Ledger(), place, find, produce, now)  # a retry of a finished attempt: nothing
    assert topic == ["an earlier record", attempt.resend_id]
    assert (outcome.state, outcome.landed) == (PRODUCED, (0, 1)) and (again.state, again.landed) == (PRODUCED, (0, 1))
    assert not again.produced_now and set(places) == {1}  # placed before the intent, never after it
    entry = store.resends.entry(attempt.resend_id)
    assert entry is not None
    assert (entry["destination_partition"], entry["scan_from_offset"]) == (0, 1)
    assert (entry["produced_partition"], entry["produced_offset"]) == (0, 1)


def test_an_unrecoverable_loss_is_recorded_with_its_reason_and_produces_nothing(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'khipu.db'}")
    store.migrate()
    produced: list[str] = []
    gone = plan("m2", recoverable=False)

    def produce(p: ResendPlan, partition: int) -> Landed:
        produced.append(p.resend_id)
        return partition, 0

    outcome = run_attempt(gone, store.resends, lambda _: (0, 0), lambda *_: None, produce, lambda: 5)
    assert outcome.state == UNRECOVERABLE and produced == []
    (entry,) = store.resends.attempts("m2", gone.hop)
    assert (entry["state"], entry["error"], entry["source_kind"]) == (UNRECOVERABLE, "UNRECOVERABLE: gone", "none")
    assert store.resends.record_intent(ledger_entry(gone), 6) is False  # an attempt is recorded once
