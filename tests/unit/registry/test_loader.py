"""Registry loading: valid files become typed routes; every invalid value is named exactly."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest

from khipu.offsets.collect import groups_to_watch
from khipu.registry import (
    Hop,
    HopKind,
    RegistryError,
    ResendMode,
    TopicRef,
    UnknownStreamError,
    load_registry,
    parse_registry,
)

ROOT = Path(__file__).resolve().parents[3]

VALID = dedent("""
    version: 1
    clusters:
      a: {connection_id: kafka_a}
      b: {}
    streams:
      orders:
        owner: team-orders
        sampling_percent: 10
        recovery_attributes: [row_id]
        resend: {mode: auto, max_attempts: 5, hook: "orders_db.recovery:order_row"}
        alerts: {loss_rate: 0.001, duplicate_rate: 0.02, latency_p99_ms: 60000}
        route:
          producers:
            - {location: orders-api, writes: [a/orders]}
            - {location: refunds-api, writes: [a/refunds]}
          consumers:
            - {group: enricher, reads: [a/orders, a/refunds], writes: [b/orders-enriched]}
            - {group: sink-s3, reads: [b/orders-enriched]}
            - {group: sink-search, location: search-indexer, reads: [b/orders-enriched]}
""")


def test_valid_registry_becomes_typed_streams_with_defaults() -> None:
    registry = parse_registry(VALID)
    stream = registry.stream("orders")
    assert stream.owner == "team-orders"
    assert stream.sampling_percent == 10.0
    assert stream.recovery_attributes == ("row_id",)
    assert stream.resend.mode is ResendMode.AUTO and stream.resend.max_attempts == 5
    assert stream.resend.hook == "orders_db.recovery:order_row"
    assert stream.alerts.latency_p99_ms == 60000
    assert registry.clusters["a"].connection_id == "kafka_a"
    assert registry.clusters["b"].connection_id == "khipu_kafka_b"  # default connection id per cluster
    assert stream.route.consumers[1].location == "sink-s3"  # location defaults to the group


def test_a_group_that_keeps_its_offsets_outside_kafka_is_named_and_not_watched_for_commits() -> None:
    registry = parse_registry(
        dedent("""
        version: 1
        clusters: {east: {}, west: {}}
        streams:
          mirrored:
            owner: team-t
            route:
              producers: [{location: api, writes: [east/orders]}]
              consumers:
                - {group: mm2, reads: [east/orders], writes: [west/east.orders], commits_offsets: false}
                - {group: sink, reads: [west/east.orders]}
    """)
    )
    route = registry.stream("mirrored").route
    assert [c.commits_offsets for c in route.consumers] == [False, True]
    assert not route.commits_offsets(Hop.read(TopicRef("east", "orders"), "mm2"))
    assert route.commits_offsets(Hop.read(TopicRef("west", "east.orders"), "sink"))
    assert route.commits_offsets(Hop.write("mm2", TopicRef("west", "east.orders")))
    assert groups_to_watch(registry, "east") == {} and groups_to_watch(registry, "west") == {"sink": {"east.orders"}}


def test_fan_in_and_fan_out_are_expressed_as_hops() -> None:
    route = parse_registry(VALID).stream("orders").route
    assert [h.id for h in route.hops] == [
        "orders-api -> a/orders",
        "refunds-api -> a/refunds",
        "a/orders -> enricher",
        "a/refunds -> enricher",
        "enricher -> b/orders-enriched",
        "b/orders-enriched -> sink-s3",
        "b/orders-enriched -> sink-search",
    ]
    assert [c.group for c in route.readers_of(TopicRef("b", "orders-enriched"))] == ["sink-s3", "sink-search"]


def test_hops_after_a_write_follow_the_route_through_the_processor() -> None:
    route = parse_registry(VALID).stream("orders").route
    after = route.hops_after(Hop.write("refunds-api", TopicRef("a", "refunds")))
    assert [h.id for h in after] == [
        "a/refunds -> enricher",
        "enricher -> b/orders-enriched",
        "b/orders-enriched -> sink-s3",
        "b/orders-enriched -> sink-search",
    ]
    assert [h.kind for h in after] == [HopKind.READ, HopKind.WRITE, HopKind.READ, HopKind.READ]


def test_hops_before_a_hop_are_its_feeders_and_theirs_up_to_the_producers() -> None:
    route = parse_registry(VALID).stream("orders").route
    by_id = {hop.id: hop for hop in route.hops}
    before = route.hops_before(by_id["b/orders-enriched -> sink-s3"])
    assert sorted(h.id for h in before) == [
        "a/orders -> enricher",
        "a/refunds -> enricher",
        "enricher -> b/orders-enriched",
        "orders-api -> a/orders",
        "refunds-api -> a/refunds",
    ]  # not its sibling sink-search: fan-out is not upstream
    assert sorted(h.id for h in route.hops_before(by_id["a/refunds -> enricher"])) == ["refunds-api -> a/refunds"]
    assert route.hops_before(by_id["orders-api -> a/orders"]) == frozenset()  # a source's write: nothing before it
    assert route.hops_before(Hop.read(TopicRef("a", "orders"), "not-on-the-route")) == frozenset(
        {by_id["orders-api -> a/orders"]}
    )  # a read of a route topic by another group: that topic's writers, as feeders_of says


def test_the_registrys_owners_are_its_streams_teams_each_once() -> None:
    text = VALID + (
        "  refunds:\n    owner: team-refunds\n    route: {producers: [{location: refunds-api, writes: [a/refunds]}]}\n"
        "  returns:\n    owner: team-orders\n    route: {producers: [{location: returns-api, writes: [a/returns]}]}\n"
    )
    assert parse_registry(text).owners == frozenset({"team-orders", "team-refunds"})


def test_unknown_stream_names_the_known_ones() -> None:
    with pytest.raises(UnknownStreamError, match=r"unknown stream 'payments'; the registry defines: orders"):
        parse_registry(VALID).stream("payments")


def test_the_shipped_registry_is_valid() -> None:
    registry = load_registry(ROOT / "config" / "registry.yaml")
    assert "demo.orders" in registry.streams


def stream_doc(body: str) -> str:
    """A registry with cluster ``a`` and one stream ``s1`` whose body is ``body``."""
    indented = "\n".join("    " + line for line in body.splitlines())
    return f"version: 1\nclusters: {{a: {{}}}}\nstreams:\n  s1:\n{indented}"


OK_ROUTE = "route:\n  producers: [{location: p, writes: [a/t]}]"

OWNER = "an Airflow team name: 3-50 letters, digits, '-' or '_' (a team's DAG id and DAG bundle name hold it)"

# Each case: the registry text, and the exact problem line the error must contain.
BAD_REGISTRIES = [
    # 1. wrong format version
    ("version: 2\nclusters: {a: {}}\nstreams: {}", "registry: field 'version': got 2; expected 1"),
    # 2. no clusters declared
    (
        "version: 1\nstreams: {}",
        "registry: field 'clusters': got None; expected a non-empty mapping of cluster name to {connection_id}",
    ),
    # 3. a key the format does not have, at top level
    (
        "version: 1\nclusters: {a: {}}\nstreams: {}\nstream: {}",
        "registry: field 'stream': got {}; expected no such key; allowed keys: version, clusters, streams",
    ),
    # 4. a stream name with a space
    (
        "version: 1\nclusters: {a: {}}\nstreams:\n  'bad name': {}",
        "stream 'bad name': field '<name>': got 'bad name'; "
        "expected 1-249 characters of letters, digits, '.', '_' or '-'",
    ),
    # 5. sampling above 100
    (
        stream_doc(f"owner: team-t\nsampling_percent: 150\n{OK_ROUTE}"),
        "stream 's1': field 'sampling_percent': got 150; expected a number in (0, 100]",
    ),
    # 6. sampling zero traces nothing: not allowed
    (
        stream_doc(f"owner: team-t\nsampling_percent: 0\n{OK_ROUTE}"),
        "stream 's1': field 'sampling_percent': got 0; expected a number in (0, 100]",
    ),
    # 7. owner missing
    (stream_doc(OK_ROUTE), f"stream 's1': field 'owner': got None; expected {OWNER}"),
    # 7b. an owner Airflow cannot name a team (nor a DAG id or a bundle hold): refused here, not later at `make up`
    (stream_doc(f"owner: t\n{OK_ROUTE}"), f"stream 's1': field 'owner': got 't'; expected {OWNER}"),
    (stream_doc(f"owner: team orders\n{OK_ROUTE}"), f"stream 's1': field 'owner': got 'team orders'; expected {OWNER}"),
    (stream_doc(f"owner: team.orders\n{OK_ROUTE}"), f"stream 's1': field 'owner': got 'team.orders'; expected {OWNER}"),
    (stream_doc(f"owner: {'x' * 51}\n{OK_ROUTE}"), f"stream 's1': field 'owner': got '{'x' * 51}'; expected {OWNER}"),
    (stream_doc(f"owner: 42\n{OK_ROUTE}"), f"stream 's1': field 'owner': got 42; expected {OWNER}"),
    # 8. unknown resend mode
    (
        stream_doc(f"owner: team-t\nresend: {{mode: sometimes}}\n{OK_ROUTE}"),
        "stream 's1': field 'resend.mode': got 'sometimes'; expected one of: auto, manual, off",
    ),
    # 9. zero resend attempts
    (
        stream_doc(f"owner: team-t\nresend: {{max_attempts: 0}}\n{OK_ROUTE}"),
        "stream 's1': field 'resend.max_attempts': got 0; expected an integer >= 1",
    ),
    # 9b. a recovery hook that is not module:function
    (
        stream_doc(f"owner: team-t\nresend: {{hook: orders_db.recovery.order_row}}\n{OK_ROUTE}"),
        "stream 's1': field 'resend.hook': got 'orders_db.recovery.order_row'; expected 'module:function', "
        "a Python callable importable by the resend task",
    ),
    # 10. a loss-rate threshold above 1
    (
        stream_doc(f"owner: team-t\nalerts: {{loss_rate: 5}}\n{OK_ROUTE}"),
        "stream 's1': field 'alerts.loss_rate': got 5; expected a number in [0, 1]",
    ),
    # 11. a misspelt key inside a stream
    (
        stream_doc(f"owner: team-t\nsampling: 10\n{OK_ROUTE}"),
        "stream 's1': field 'sampling': got 10; expected no such key; allowed keys: owner, sampling_percent, "
        "recovery_attributes, resend, alerts, route",
    ),
    # 12. a route with no producer
    (
        stream_doc("owner: team-t\nroute:\n  producers: []"),
        "stream 's1': field 'route.producers': got []; expected a non-empty list of {location, writes}",
    ),
    # 13. a topic on an undeclared cluster
    (
        stream_doc("owner: team-t\nroute:\n  producers: [{location: p, writes: [zz/t]}]"),
        "stream 's1': field 'route.producers[0].writes[0]': got 'zz/t'; expected a cluster declared under "
        "'clusters' (a)",
    ),
    # 14. a topic without its cluster
    (
        stream_doc("owner: team-t\nroute:\n  producers: [{location: p, writes: [t]}]"),
        "stream 's1': field 'route.producers[0].writes[0]': got 't'; expected 'cluster/topic'",
    ),
    # 15. a group reading a topic nothing in the route writes
    (
        stream_doc(f"owner: team-t\n{OK_ROUTE}\n  consumers: [{{group: g, reads: [a/other]}}]"),
        "stream 's1': field 'route.consumers[0].reads[0]': got 'a/other'; expected a topic that a producer or "
        "processor of this route writes",
    ),
    # 16. the same group listed twice
    (
        stream_doc(f"owner: team-t\n{OK_ROUTE}\n  consumers: [{{group: g, reads: [a/t]}}, {{group: g, reads: [a/t]}}]"),
        "stream 's1': field 'route.consumers[1].group': got 'g'; expected a group listed once per route "
        "(merge its reads and writes)",
    ),
    # 17. a processor feeding its own input
    (
        stream_doc(
            "owner: team-t\nroute:\n  producers: [{location: p, writes: [a/t]}]\n"
            "  consumers: [{group: g, reads: [a/t, a/u], writes: [a/u]}]"
        ),
        "stream 's1': field 'route': got 'a/u -> a/u'; expected a route without cycles (a processor must not feed "
        "its own input)",
    ),
    # 18. a consumer without reads
    (
        stream_doc(f"owner: team-t\n{OK_ROUTE}\n  consumers: [{{group: g}}]"),
        "stream 's1': field 'route.consumers[0].reads': got None; expected a non-empty list of 'cluster/topic'",
    ),
    # 19. not YAML
    ("version: [1\n", "registry: field '<file>':"),
    # 20. commits_offsets not a boolean
    (
        stream_doc(f"owner: team-t\n{OK_ROUTE}\n  consumers: [{{group: g, reads: [local/a], commits_offsets: 'no'}}]"),
        "stream 's1': field 'route.consumers[0].commits_offsets': got 'no'; expected true or false",
    ),
]


@pytest.mark.parametrize(("text", "problem"), BAD_REGISTRIES)
def test_invalid_registry_names_stream_field_value_and_expectation(text: str, problem: str) -> None:
    with pytest.raises(RegistryError) as caught:
        parse_registry(text)
    assert any(str(p).startswith(problem) for p in caught.value.problems), caught.value


def test_every_problem_is_reported_not_only_the_first() -> None:
    text = stream_doc("owner: ''\nsampling_percent: 101\nresend: {mode: x}\n" + OK_ROUTE)
    with pytest.raises(RegistryError) as caught:
        parse_registry(text)
    assert [p.field for p in caught.value.problems] == ["owner", "sampling_percent", "resend.mode"]


def test_unreadable_file_is_a_registry_error_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(RegistryError, match=r"nope\.yaml"):
        load_registry(missing)
