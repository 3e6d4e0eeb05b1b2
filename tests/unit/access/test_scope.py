"""Who sees which streams, and what goes with a stream, as numbered tables of cases with the reason each answer is
right. The registry: stream ``orders`` of team-orders and ``refunds`` of team-refunds, on clusters a and b; the
group ``shared`` reads a topic of each (one group in two teams' routes)."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

from khipu.access import (
    MANUAL_DAG,
    Reach,
    SeenRegistry,
    Viewer,
    alert_in_reach,
    reach_limit,
    reach_of,
    resend_dag_for,
    resend_dag_of,
    resend_refusal,
    seen_registry,
    sees_stream,
)
from khipu.registry import parse_registry

REGISTRY = parse_registry(
    """
version: 1
clusters: {a: {}, b: {}, c: {}}
streams:
  orders:
    owner: team-orders
    route:
      producers: [{location: orders-api, writes: [a/orders]}]
      consumers:
        - {group: enricher, reads: [a/orders], writes: [b/orders-enriched]}
        - {group: shared, location: audit, reads: [b/orders-enriched]}
  refunds:
    owner: team-refunds
    resend: {mode: "off"}
    route:
      producers: [{location: refunds-api, writes: [a/refunds]}]
      consumers:
        - {group: shared, location: audit, reads: [a/refunds]}
"""
)
ORDERS_USER = Viewer("olga", frozenset({"team-orders"}))
REFUNDS_USER = Viewer("rita", frozenset({"team-refunds"}), resend_dags=frozenset({resend_dag_of("team-refunds")}))
BOTH = Viewer("bea", frozenset({"team-orders", "team-refunds"}))
EVERY_TEAMS_DAG = frozenset({MANUAL_DAG, resend_dag_of("team-orders"), resend_dag_of("team-refunds")})
ADMIN = Viewer("admin", every_stream=True, resend_dags=EVERY_TEAMS_DAG)
OPERATOR = Viewer("ops", every_stream=True, resend_dags=frozenset({MANUAL_DAG}))  # khipu-every-stream, no team's
ORDERS_TRIGGERS_OPERATORS = Viewer("olaf", frozenset({"team-orders"}), resend_dags=frozenset({MANUAL_DAG}))
NOBODY = Viewer("nobody")
OTHER_TEAMS = Viewer("otto", frozenset({"team-payments"}))


class SeenCase(NamedTuple):
    number: int
    viewer: Viewer
    streams: set[str]
    clusters: set[str]
    limited: bool  # its reports are limited to its reach
    reason: str


SEEN = [
    SeenCase(1, ORDERS_USER, {"orders"}, {"a", "b"}, True, "the owner's team sees its stream and the clusters it uses"),
    SeenCase(2, REFUNDS_USER, {"refunds"}, {"a"}, True, "refunds uses cluster a only: b is not shown to its team"),
    SeenCase(3, BOTH, {"orders", "refunds"}, {"a", "b"}, True,
             "in both teams: both streams, still limited (data of no registry stream is no team's)"),
    SeenCase(4, ADMIN, {"orders", "refunds"}, {"a", "b", "c"}, False,
             "every stream: the whole registry, c included, and no limit (a stream the registry dropped too)"),
    SeenCase(5, NOBODY, set(), set(), True, "in no team: nothing, not even a cluster name"),
    SeenCase(6, OTHER_TEAMS, set(), set(), True, "in a team that owns no stream here: nothing"),
]  # fmt: skip


@pytest.mark.parametrize("case", SEEN, ids=[f"{c.number}" for c in SEEN])
def test_the_registry_as_each_person_sees_it(case: SeenCase) -> None:
    seen = seen_registry(case.viewer, REGISTRY)
    assert isinstance(seen, SeenRegistry) and seen.viewer == case.viewer.name
    assert set(seen.streams) == case.streams, case.reason
    assert set(seen.clusters) == case.clusters, case.reason
    assert (reach_limit(seen) is not None) == case.limited, case.reason
    assert {name for name, s in REGISTRY.streams.items() if sees_stream(case.viewer, s)} == case.streams


def test_the_registry_itself_is_not_limited() -> None:
    """The CLI and the exporter pass the registry itself: nothing is limited."""
    assert reach_limit(REGISTRY) is None


def test_a_stream_another_team_owns_is_unknown_in_the_seen_registry() -> None:
    seen = seen_registry(ORDERS_USER, REGISTRY)
    with pytest.raises(KeyError, match="unknown stream 'refunds'; the registry defines: orders"):
        seen.stream("refunds")


def test_what_goes_with_a_registrys_streams() -> None:
    reach = reach_of(seen_registry(ORDERS_USER, REGISTRY))
    assert reach == Reach(
        streams=frozenset({"orders"}),
        hops=frozenset(
            {
                ("orders", "orders-api -> a/orders"),
                ("orders", "a/orders -> enricher"),
                ("orders", "enricher -> b/orders-enriched"),
                ("orders", "b/orders-enriched -> shared"),
            }
        ),
        reads=frozenset({("a", "enricher", "orders"), ("b", "shared", "orders-enriched")}),
        locations=frozenset({"orders-api", "enricher", "audit"}),
    )
    assert reach.groups == {("a", "enricher"), ("b", "shared")}


class AlertCase(NamedTuple):
    number: int
    details: dict[str, Any]
    orders_team: bool  # shown to team-orders
    refunds_team: bool
    reason: str


ALERTS = [
    AlertCase(1, {"stream": "orders", "hop": "a/orders -> enricher"}, True, False, "a threshold alert: its stream's"),
    AlertCase(2, {"cluster": "a", "group": "enricher"}, True, False, "a group's status: the team whose route reads"),
    AlertCase(3, {"cluster": "a", "group": "shared"}, False, True,
              "shared reads a/refunds (refunds) and b/orders-enriched (orders): on cluster a it is refunds' read"),
    AlertCase(4, {"cluster": "b", "group": "shared"}, True, False, "on cluster b, shared reads for orders"),
    AlertCase(5, {"cluster": "c", "group": "enricher"}, False, False, "that group name on a cluster no route reads"),
    AlertCase(6, {"state": "stale", "reason": "no heartbeat"}, True, True, "the detector's: Khipu's own, everyone's"),
    AlertCase(7, {"run_id": "r1", "counts": {"produced": 2}}, True, True, "a resend run's counts: Khipu's own"),
    AlertCase(8, {"stream": "gone", "hop": "x"}, False, False, "a stream the registry no longer names: no team's"),
    AlertCase(9, {"stream": "orders", "cluster": "a", "group": "shared"}, False, False,
              "naming orders and a read of refunds: shown only to whoever sees both"),
]  # fmt: skip


@pytest.mark.parametrize("case", ALERTS, ids=[f"{c.number}" for c in ALERTS])
def test_an_alert_goes_with_the_stream_or_group_it_names(case: AlertCase) -> None:
    orders, refunds = (reach_of(seen_registry(v, REGISTRY)) for v in (ORDERS_USER, REFUNDS_USER))
    assert (alert_in_reach(case.details, orders), alert_in_reach(case.details, refunds)) == (
        case.orders_team,
        case.refunds_team,
    ), case.reason


class ResendCase(NamedTuple):
    number: int
    viewer: Viewer
    stream: str
    refusal: str | None
    reason: str


RESENDS = [
    ResendCase(1, ADMIN, "orders", None, "sees it, may trigger the DAG, the stream's mode allows it"),
    ResendCase(2, ORDERS_USER, "orders", "you may not trigger the DAG khipu_resend_manual__team-orders",
               "sees it, but Airflow does not let them trigger their team's DAG"),
    ResendCase(3, REFUNDS_USER, "orders", "stream 'orders' is not one of yours", "may trigger, but not their stream"),
    ResendCase(4, REFUNDS_USER, "refunds", "stream 'refunds' is never resent (its resend mode is off)",
               "their stream, but its registry entry says never"),
    ResendCase(5, OPERATOR, "orders", None, "sees every stream: the operators' DAG of every stream is theirs"),
    ResendCase(6, ORDERS_TRIGGERS_OPERATORS, "orders", "you may not trigger the DAG khipu_resend_manual__team-orders",
               "may trigger the operators' DAG, yet sees only their team's streams: its runs would show every "
               "team's resends to whoever reads it, so only a team's own DAG is offered"),
]  # fmt: skip


@pytest.mark.parametrize("case", RESENDS, ids=[f"{c.number}" for c in RESENDS])
def test_who_may_resend_a_loss_from_the_view(case: ResendCase) -> None:
    assert resend_refusal(case.viewer, seen_registry(case.viewer, REGISTRY), case.stream) == case.refusal, case.reason


class DagCase(NamedTuple):
    number: int
    viewer: Viewer
    owner: str
    dag: str | None
    reason: str


DAGS = [
    DagCase(1, ADMIN, "team-orders", "khipu_resend_manual__team-orders",
            "the team's own DAG first: its run is the team's to read"),
    DagCase(2, OPERATOR, "team-orders", MANUAL_DAG, "no team's DAG, but every stream's, and sees every stream"),
    DagCase(3, ORDERS_TRIGGERS_OPERATORS, "team-orders", None, "every stream's DAG, yet sees one team's streams"),
    DagCase(4, REFUNDS_USER, "team-orders", None, "another team's DAG is not theirs to trigger"),
]  # fmt: skip


@pytest.mark.parametrize("case", DAGS, ids=[f"{c.number}" for c in DAGS])
def test_which_resend_dag_the_view_triggers_for_a_loss(case: DagCase) -> None:
    assert resend_dag_for(case.viewer, case.owner) == case.dag, case.reason
