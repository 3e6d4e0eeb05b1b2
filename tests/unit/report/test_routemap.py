"""The route map's model: a hop's state against the stream's thresholds, consumer health per hop and group, and a
route's graph with fan-out and fan-in as the registry says."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from khipu.health.rules import PartitionStatus
from khipu.registry.loader import load_registry
from khipu.registry.model import AlertThresholds, HopKind, Stream
from khipu.report.overview import WindowFigures
from khipu.report.routemap import (
    EDGE_RULES,
    EdgeState,
    HealthBadge,
    NodeKind,
    PartitionState,
    edge_state,
    health_badge,
    route_map,
)
from tests import routemapdata as data

LIMITS = AlertThresholds(loss_rate=0.02, duplicate_rate=0.05)


@dataclass(frozen=True)
class Case:
    reason: str
    figures: WindowFigures
    expected: EdgeState
    limits: AlertThresholds = LIMITS


def figures(**counts: int) -> WindowFigures:
    return WindowFigures(0, **counts)


# Each case: why the expected state is right.
STATE_CASES = [
    Case("1. no verdict at all: nothing to judge", figures(), EdgeState.IDLE),
    Case("2. only ABORTED and SUPERSEDED: Kafka's own semantics, in no rate", figures(aborted=3, superseded=2),
         EdgeState.IDLE),
    Case("3. every message delivered", figures(delivered=100), EdgeState.OK),
    Case("4. pending and trace-lost are judged verdicts, neither a loss nor a duplicate",
         figures(delivered=8, pending=1, trace_lost=1), EdgeState.OK),
    Case("5. 3 lost of 100 is 3 %, above 2 %", figures(delivered=97, lost=3), EdgeState.LOSS),
    Case("6. 2 lost of 100 is 2 %, at the threshold: not above it, but messages were lost",
         figures(delivered=98, lost=2), EdgeState.LOSS_WITHIN),
    Case("7. confirmed losses are losses", figures(delivered=97, confirmed_lost=3), EdgeState.LOSS),
    Case("8. 1 lost of 100 is within 2 %", figures(delivered=99, confirmed_lost=1), EdgeState.LOSS_WITHIN),
    Case("9. 6 duplicates of 100 is above 5 %", figures(delivered=94, duplicate=6), EdgeState.DUPLICATES),
    Case("10. 5 duplicates of 100 is at 5 %: not above", figures(delivered=95, duplicate=5), EdgeState.OK),
    Case("11. losses above their threshold outrank duplicates above theirs",
         figures(delivered=84, lost=6, duplicate=10), EdgeState.LOSS),
    Case("12. duplicates above their threshold outrank losses within theirs",
         figures(delivered=88, lost=2, duplicate=10), EdgeState.DUPLICATES),
    Case("13. ABORTED is not in the denominator: 3 lost of 100 judged is 3 %, whatever aborted",
         figures(delivered=97, lost=3, aborted=1000), EdgeState.LOSS),
    Case("14. a threshold of 0 (the registry's default): any loss is above it",
         figures(delivered=9_999, lost=1), EdgeState.LOSS, AlertThresholds(loss_rate=0.0)),
    Case("15. retracted losses were found after all: judged, not lost", figures(delivered=9, retracted=1),
         EdgeState.OK),
]  # fmt: skip


@pytest.mark.parametrize("case", STATE_CASES, ids=[c.reason.split(".")[0] for c in STATE_CASES])
def test_a_hops_state_is_the_worst_rule_that_fires(case: Case) -> None:
    assert edge_state(case.figures, case.limits) is case.expected, case.reason


def test_the_rules_are_ordered_by_severity() -> None:
    states = [state for state, _ in EDGE_RULES]
    assert states == sorted(states, reverse=True) and EdgeState.IDLE not in states


def health(cluster: str, group: str, topic: str, partition: int, status: PartitionStatus) -> PartitionState:
    return PartitionState(cluster, group, topic, partition, status)


BADGE_CASES = [
    ("no partition: no badge", [], None),
    ("one OK partition", [PartitionStatus.OK], HealthBadge(PartitionStatus.OK, 1, 1)),
    ("the worst wins, counted", [PartitionStatus.OK, PartitionStatus.STALL, PartitionStatus.STALL],
     HealthBadge(PartitionStatus.STALL, 2, 3)),
    ("expiry risk is the most severe", [PartitionStatus.STOP, PartitionStatus.EXPIRY_RISK],
     HealthBadge(PartitionStatus.EXPIRY_RISK, 1, 2)),
]  # fmt: skip


@pytest.mark.parametrize(("reason", "statuses", "expected"), BADGE_CASES, ids=[c[0] for c in BADGE_CASES])
def test_a_health_badge_is_the_worst_status_and_how_many_are_in_it(
    reason: str, statuses: list[PartitionStatus], expected: HealthBadge | None
) -> None:
    states = [health("c", "g", "t", i, status) for i, status in enumerate(statuses)]
    assert health_badge(states) == expected, reason


def test_badge_labels_name_the_status_and_its_share() -> None:
    assert HealthBadge(PartitionStatus.STALL, 1, 3).label == "STALL 1/3"
    assert HealthBadge(PartitionStatus.EXPIRY_RISK, 1, 1).label == "EXPIRY RISK 1/1"
    assert HealthBadge(PartitionStatus.OK, 3, 3).label == "OK"


def payments(tmp_path: Path) -> Stream:
    return load_registry(data.write_registry(tmp_path / "registry.yaml")).stream(data.STREAM)


def test_the_map_draws_fan_out_and_fan_in_across_three_clusters(tmp_path: Path) -> None:
    stream = payments(tmp_path)
    drawn = route_map(stream, {}, [], since_ms=0)
    assert [e.hop for e in drawn.edges] == [hop.id for hop in stream.route.hops] and len(drawn.edges) == 15
    assert drawn.clusters == ("east", "west", "lake")
    kinds = {n.id: n.kind for n in drawn.nodes}
    assert [n for n, k in kinds.items() if k is NodeKind.PRODUCER] == [
        "producer:checkout-api",
        "producer:refunds-api",
        "producer:billing-api",
    ]
    assert {n for n, k in kinds.items() if k is NodeKind.PROCESSOR} == {
        "group:payments-enricher",
        "group:ledger-joiner",
        "group:mm2-lake",
    }
    assert {n for n, k in kinds.items() if k is NodeKind.GROUP} == {
        "group:fraud-scorer",
        "group:ledger-sink",
        "group:ledger-audit",
        "group:lake-archiver",
    }
    topics = {n.id: n.cluster for n in drawn.nodes if n.kind is NodeKind.TOPIC}
    assert topics == {
        "topic:east/orders": "east",
        "topic:east/refunds": "east",
        "topic:west/invoices": "west",
        "topic:west/payments": "west",
        "topic:lake/ledger": "lake",
        "topic:lake/west.payments": "lake",
    }
    into = {n.id: sorted(e.source for e in drawn.edges if e.target == n.id) for n in drawn.nodes}
    out_of = {n.id: sorted(e.target for e in drawn.edges if e.source == n.id) for n in drawn.nodes}
    assert into["group:payments-enricher"] == ["topic:east/orders", "topic:east/refunds"]  # fan-in
    assert out_of["topic:west/payments"] == ["group:fraud-scorer", "group:ledger-joiner", "group:mm2-lake"]  # fan-out
    assert out_of["group:payments-enricher"] == ["topic:west/payments"]  # a processor writes on, across clusters
    assert out_of["group:mm2-lake"] == ["topic:lake/west.payments"]  # its location is mm2: its write is its node's
    mirror = next(n for n in drawn.nodes if n.id == "group:mm2-lake")
    assert (mirror.location, mirror.cluster, mirror.watched) == ("mm2", "west", False)
    assert all(e.kind is (HopKind.READ if e.target.startswith("group:") else HopKind.WRITE) for e in drawn.edges)


def test_each_hop_carries_its_figures_and_state_and_a_hop_without_figures_is_idle(tmp_path: Path) -> None:
    stream = payments(tmp_path)
    shown = {
        data.ENRICH_ORDERS: figures(delivered=194, lost=6),
        data.JOIN_PAYMENTS: figures(delivered=230, duplicate=13),
        data.AUDIT: figures(delivered=200, lost=30),
    }
    drawn = {e.hop: e for e in route_map(stream, shown, [], since_ms=42).edges}
    assert drawn[data.ENRICH_ORDERS].figures == shown[data.ENRICH_ORDERS]
    assert drawn[data.ENRICH_ORDERS].state is EdgeState.LOSS  # 3 % > 2 %
    assert drawn[data.JOIN_PAYMENTS].state is EdgeState.DUPLICATES  # 5.35 % > 5 %
    assert drawn[data.BILLING].figures == WindowFigures(42) and drawn[data.BILLING].state is EdgeState.IDLE


def test_consumer_health_shows_on_each_read_hop_and_its_group_but_not_for_a_group_without_offsets(
    tmp_path: Path,
) -> None:
    stream = payments(tmp_path)
    states = [
        health("east", "payments-enricher", "orders", 0, PartitionStatus.OK),
        health("east", "payments-enricher", "refunds", 0, PartitionStatus.REWIND),
        health("west", "fraud-scorer", "payments", 0, PartitionStatus.OK),
        health("west", "fraud-scorer", "payments", 1, PartitionStatus.STALL),
        health("west", "mm2-lake", "payments", 0, PartitionStatus.STOP),  # it keeps no offsets in Kafka: not judged
        health("east", "fraud-scorer", "payments", 0, PartitionStatus.STOP),  # another cluster's topic of that name
        health("lake", "ledger-audit", "ledger", 0, PartitionStatus.EXPIRY_RISK),
    ]
    drawn = route_map(stream, {}, states, since_ms=0)
    edges = {e.hop: e.health for e in drawn.edges}
    nodes = {n.id: n.health for n in drawn.nodes}
    assert edges[data.ENRICH_ORDERS] == HealthBadge(PartitionStatus.OK, 1, 1)
    assert edges[data.ENRICH_REFUNDS] == HealthBadge(PartitionStatus.REWIND, 1, 1)
    assert nodes["group:payments-enricher"] == HealthBadge(PartitionStatus.REWIND, 1, 2)  # over all it reads
    assert edges[data.FRAUD] == nodes["group:fraud-scorer"] == HealthBadge(PartitionStatus.STALL, 1, 2)
    assert edges[data.MIRROR_READ] is None and nodes["group:mm2-lake"] is None
    assert edges[data.AUDIT] == HealthBadge(PartitionStatus.EXPIRY_RISK, 1, 1)
    assert edges[data.SINK] is None and nodes["group:ledger-sink"] is None  # none recorded yet
    assert all(e.health is None for e in drawn.edges if e.kind is HopKind.WRITE)
