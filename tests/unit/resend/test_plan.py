"""What to resend for a confirmed loss, from where and to where: the rules as a case table on the demo's route."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from khipu.registry.loader import load_registry
from khipu.registry.model import TopicRef
from khipu.resend.plan import NotConfirmedLost, Position, SourceKind, plan_resend, resend_id

ROOT = Path(__file__).resolve().parents[3]
STREAM = load_registry(ROOT / "config" / "registry.yaml").stream("demo.orders")  # max_attempts 3
ENRICHED = TopicRef("local", "demo.orders-enriched")
SOURCE = TopicRef("local", "demo.orders")
AUDIT_READ = "local/demo.orders-enriched -> demo-sink-audit"
ENRICH_READ = "local/demo.orders -> demo-enricher"
ENRICH_WRITE = "demo-enricher -> local/demo.orders-enriched"
PRODUCE = "demo-producer -> local/demo.orders"


def row(hop: str, verdict: str, partition: int | None = None, offset: int | None = None) -> dict[str, Any]:
    topic = hop.split(" -> ")[0] if hop.split(" -> ")[0].startswith("local/") else hop.split(" -> ")[1]
    return {
        "message_id": "m1",
        "hop": hop,
        "verdict": verdict,
        "topic": topic.split("/", 1)[1],
        "partition": partition,
        "offset": offset,
    }


@dataclass(frozen=True)
class Case:
    name: str
    loss: dict[str, Any]
    others: list[dict[str, Any]]
    log_starts: dict[tuple[str, int], int]  # (topic, partition) -> first offset held; absent: unknown
    hook: str | None
    attempt: int
    source: SourceKind
    position: Position | None
    destination: TopicRef | None
    target: str | None
    reason: str  # a part of the plan's reason


SKIPPED = row(AUDIT_READ, "CONFIRMED_LOST", 1, 40)
DROPPED = row(ENRICH_WRITE, "CONFIRMED_LOST")
READ_BY_ENRICHER = row(ENRICH_READ, "DELIVERED", 2, 17)
CASES = [
    Case("a skipped record still in the log goes back to its topic for the group that skipped it only",
         SKIPPED, [], {("demo.orders-enriched", 1): 0}, None, 1,
         SourceKind.TOPIC, Position("local", "demo.orders-enriched", 1, 40), ENRICHED, "demo-sink-audit",
         "for demo-sink-audit only"),
    Case("a skipped record retention removed comes from the recovery hook",
         SKIPPED, [], {("demo.orders-enriched", 1): 41}, "shop.orders:reload", 1,
         SourceKind.HOOK, None, ENRICHED, "demo-sink-audit", "has left the log (it starts at 41)"),
    Case("a skipped record gone and no hook: UNRECOVERABLE, saying why",
         SKIPPED, [], {("demo.orders-enriched", 1): 41}, None, 1,
         SourceKind.NONE, None, None, None, "names no recovery hook"),
    Case("a skipped record whose partition is unknown to the log: the hook",
         SKIPPED, [], {}, "shop.orders:reload", 1,
         SourceKind.HOOK, None, ENRICHED, "demo-sink-audit", "has left the log"),
    Case("a processor drop resends the processor's input record to its output topic, for every reader",
         DROPPED, [READ_BY_ENRICHER], {("demo.orders", 2): 10}, None, 2,
         SourceKind.TOPIC, Position("local", "demo.orders", 2, 17), ENRICHED, None, "for every reader"),
    Case("a processor drop whose input record left the log: the hook",
         DROPPED, [READ_BY_ENRICHER], {("demo.orders", 2): 18}, "shop.orders:reload", 1,
         SourceKind.HOOK, None, ENRICHED, None, "input record local/demo.orders[2]@17 has left the log"),
    Case("a processor drop without the processor's read verdict: nothing upstream, no hook",
         DROPPED, [], {}, None, 1,
         SourceKind.NONE, None, None, None, "no upstream record"),
    Case("a source's own write has nothing upstream: the hook",
         row(PRODUCE, "CONFIRMED_LOST"), [], {}, "shop.orders:reload", 1,
         SourceKind.HOOK, None, SOURCE, None, "recovery hook shop.orders:reload"),
    Case("past max_attempts: UNRECOVERABLE, however available the original",
         SKIPPED, [], {("demo.orders-enriched", 1): 0}, "shop.orders:reload", 4,
         SourceKind.NONE, None, None, None, "3 copies produced without arriving, max_attempts is 3"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_plan(case: Case) -> None:
    plan = plan_resend(
        case.loss,
        [case.loss, *case.others],
        STREAM,
        lambda cluster, topic, partition: case.log_starts.get((topic, partition)),
        case.attempt,
        case.hook,
    )
    assert (plan.source, plan.source_position, plan.destination, plan.target_group) == (
        case.source,
        case.position,
        case.destination,
        case.target,
    )
    assert case.reason in plan.reason and plan.recoverable == (case.source is not SourceKind.NONE)
    assert plan.resend_id == resend_id("m1", case.loss["hop"], case.attempt)
    if not plan.recoverable:
        assert plan.reason.startswith("UNRECOVERABLE: ")


def test_only_a_confirmed_loss_is_resent() -> None:
    for verdict in ("LOST", "DELIVERED", "RETRACTED"):
        with pytest.raises(NotConfirmedLost, match=f"is {verdict}, not CONFIRMED_LOST"):
            plan_resend(replace_verdict(SKIPPED, verdict), [], STREAM, lambda *_: 0, 1)


def test_a_resend_id_is_stable_per_attempt_and_differs_between_attempts() -> None:
    assert resend_id("m1", AUDIT_READ, 1) == resend_id("m1", AUDIT_READ, 1)
    assert len({resend_id("m1", AUDIT_READ, 1), resend_id("m1", AUDIT_READ, 2), resend_id("m2", AUDIT_READ, 1)}) == 3


def replace_verdict(loss: dict[str, Any], verdict: str) -> dict[str, Any]:
    return {**loss, "verdict": verdict}


def test_a_hop_that_left_the_route_is_unrecoverable() -> None:
    gone = replace(STREAM, name="demo.orders")  # same stream; the loss names a hop it no longer has
    plan = plan_resend({**SKIPPED, "hop": "local/x -> old-group"}, [], gone, lambda *_: 0, 1)
    assert not plan.recoverable and "not on demo.orders's route" in plan.reason


def test_only_attempts_that_produced_a_copy_count_toward_max_attempts() -> None:
    def log_start(cluster: str, topic: str, partition: int) -> int | None:
        return 0

    after_failures = plan_resend(SKIPPED, [SKIPPED], STREAM, log_start, 5, None, produced_before=2)
    assert after_failures.recoverable and after_failures.source is SourceKind.TOPIC  # two hook failures, two copies
    spent = plan_resend(SKIPPED, [SKIPPED], STREAM, log_start, 5, None, produced_before=3)
    assert not spent.recoverable and "3 copies produced without arriving" in spent.reason
