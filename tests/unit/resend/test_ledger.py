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
    BUSY,
    INTENDED,
    LEASE_MS,
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
        (INTENDED, False, (0, 7), Step.RECORD_LANDED),  # planned unrecoverable now, but a killed run produced it
        (PRODUCED, True, (0, 7), Step.DONE),
        (PRODUCED, True, None, Step.DONE),  # the ledger's word is final once it says produced
        (UNRECOVERABLE, False, None, Step.DONE),
        ("failed", True, None, Step.DONE),  # a failed attempt stays failed: the next attempt has its own id
    ],
)
def test_next_step(state: str | None, recoverable: bool, landed: Landed | None, step: Step) -> None:
    assert next_step(state, recoverable, landed) is step


def test_an_intent_written_without_a_placement_is_placed_before_anything_is_produced() -> None:
    assert next_step(INTENDED, True, None, placed=False) is Step.PLACE


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

        def claim(self, rid: str, owner: str, now_ms: int, lease_ms: int) -> bool:
            return store.resends.claim(rid, owner, now_ms, lease_ms)

        def set_placement(self, rid: str, entry: dict[str, object], at_ms: int) -> None:
            store.resends.set_placement(rid, entry, at_ms)

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
    later: Callable[[], int] = lambda: next(clock) + LEASE_MS  # noqa: E731  # the killed run's claim has lapsed
    attempt = plan("m1")
    if kill != "never":
        with pytest.raises(Killed):
            run_attempt(attempt, Ledger(), place, find, produce, now, "first-run")
    kill = "never"  # the restarted task runs to the end
    outcome = run_attempt(attempt, Ledger(), place, find, produce, later, "restarted-run")
    again = run_attempt(attempt, Ledger(), place, find, produce, later, "a-retry")  # a finished attempt: nothing
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

    outcome = run_attempt(gone, store.resends, lambda _: (0, 0), lambda *_: None, produce, lambda: 5, "run")
    assert outcome.state == UNRECOVERABLE and produced == []
    (entry,) = store.resends.attempts("m2", gone.hop)
    assert (entry["state"], entry["error"], entry["source_kind"]) == (UNRECOVERABLE, "UNRECOVERABLE: gone", "none")
    assert store.resends.record_intent(ledger_entry(gone), 6) is False  # an attempt is recorded once


def test_two_runs_at_once_never_both_work_on_one_attempt(tmp_path: Path) -> None:
    """The auto DAG, the manual DAG and a retry whose first try still runs: the one holding the attempt produces."""
    store = Store(f"sqlite:///{tmp_path / 'khipu.db'}")
    store.migrate()
    topic: list[str] = []
    attempt = plan("m3")
    second: list[str] = []

    def produce(p: ResendPlan, partition: int) -> Landed:
        # while the first run produces, a second one starts on the same attempt
        second.append(run_attempt(p, store.resends, lambda _: (0, 0), find, produce, lambda: 1_500, "run-b").state)
        topic.append(p.resend_id)
        return partition, len(topic) - 1

    def find(rid: str, partition: int, from_offset: int) -> Landed | None:
        return next(((partition, at) for at in range(from_offset, len(topic)) if topic[at] == rid), None)

    first = run_attempt(attempt, store.resends, lambda _: (0, 0), find, produce, lambda: 1_000, "run-a")
    assert (first.state, second, topic) == (PRODUCED, [BUSY], [attempt.resend_id])
    entry = store.resends.entry(attempt.resend_id)
    assert entry is not None and entry["claimed_by"] == "run-a"
    assert store.resends.claim(attempt.resend_id, "run-b", 1_000 + LEASE_MS + 1, LEASE_MS) is False  # produced: done


def test_an_attempt_planned_unrecoverable_is_placed_when_the_next_run_finds_an_original(tmp_path: Path) -> None:
    """A killed run wrote the intent of an unrecoverable plan; a hook named since makes it recoverable."""
    store = Store(f"sqlite:///{tmp_path / 'khipu.db'}")
    store.migrate()
    gone, found = plan("m4", recoverable=False), plan("m4")
    store.resends.record_intent(ledger_entry(gone), 1_000)  # killed before recording it unrecoverable
    topic: list[str] = []

    def produce(p: ResendPlan, partition: int) -> Landed:
        topic.append(p.resend_id)
        return partition, 0

    outcome = run_attempt(found, store.resends, lambda _: (2, 0), lambda *_: None, produce, lambda: 2_000, "run")
    assert (outcome.state, outcome.landed, topic) == (PRODUCED, (2, 0), [found.resend_id])
    entry = store.resends.entry(found.resend_id)
    assert entry is not None and (entry["source_kind"], entry["destination"]) == ("topic", "local/demo.orders-enriched")
