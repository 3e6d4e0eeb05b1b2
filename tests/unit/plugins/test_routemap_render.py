"""The route map drawn: laid out by Debian's Graphviz ``dot`` (a real subprocess) and rendered as SVG; every edge where
its hop goes, with its figures and links; nothing overlapping on a route of 15 hops over 3 clusters; names escaped;
a clear paragraph when ``dot`` is missing, fails or hangs.

``scripts/ensure-graphviz`` installs ``dot`` (``make test`` runs it).
"""

from __future__ import annotations

import re
import shutil
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from khipu.health.rules import PartitionStatus
from khipu.registry.loader import load_registry
from khipu.registry.model import AlertThresholds, HopKind
from khipu.report.overview import WindowFigures
from khipu.report.routemap import EdgeState, MapEdge, MapNode, NodeKind, PartitionState, RouteMap, route_map
from khipu_airflow.view.routemap import STATE_COLOUR, route_map_svg
from tests import routemapdata as data

SVG = "{http://www.w3.org/2000/svg}"
DOT = shutil.which("dot")
needs_dot = pytest.mark.skipif(DOT is None, reason="Graphviz's dot is missing: run scripts/ensure-graphviz")


def payments_map(tmp_path: Path) -> RouteMap:
    """The 15-hop route over east, west and lake with the seed's recent counts and health."""
    stream = load_registry(data.write_registry(tmp_path / "registry.yaml")).stream(data.STREAM)
    figures = {
        hop: WindowFigures(
            1_000,
            delivered=c.delivered,
            lost=c.lost,
            confirmed_lost=c.confirmed_lost,
            duplicate=c.duplicate,
            latency_p95_ms=c.latency_ms,
        )
        for hop, c in data.RECENT.items()
    }
    health = [PartitionState(*key, status) for key, status in data.HEALTH.items()]
    return route_map(stream, figures, health, since_ms=1_000)


def svg_of(fragment: str) -> ET.Element:
    found = re.search(r"<svg\b.*?</svg>", fragment, re.S)  # the map (the legend's keys come after)
    assert found is not None, fragment[:500]
    return ET.fromstring(found.group(0))  # well-formed XML: every name and figure escaped


def boxes(svg: ET.Element, cls: str) -> dict[str, tuple[float, float, float, float]]:
    """(left, top, right, bottom) of each ``g.<cls>``'s rect, by its data-node / data-hop."""
    found = {}
    for group in svg.iter(f"{SVG}g"):
        if group.get("class") == cls:
            rect = group.find(f"{SVG}rect")
            assert rect is not None
            x, y, w, h = (float(rect.get(k, "0")) for k in ("x", "y", "width", "height"))
            found[group.get("data-node") or group.get("data-hop") or ""] = (x, y, x + w, y + h)
    return found


def overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def near(point: tuple[float, float], box: tuple[float, float, float, float], slack: float = 3.0) -> bool:
    return box[0] - slack <= point[0] <= box[2] + slack and box[1] - slack <= point[1] <= box[3] + slack


@needs_dot
def test_every_hop_is_an_edge_from_its_source_to_its_target_with_its_figures(tmp_path: Path) -> None:
    route = payments_map(tmp_path)
    svg = svg_of(route_map_svg(route, "/khipu"))
    nodes = boxes(svg, "node")
    assert set(nodes) == {n.id for n in route.nodes} and len(nodes) == 16
    clusters = [g.get("data-cluster") for g in svg.iter(f"{SVG}g") if g.get("class") == "cluster"]
    assert clusters == ["east", "west", "lake"]
    drawn = {g.get("data-hop"): g for g in svg.iter(f"{SVG}g") if g.get("class") == "edge"}
    assert sorted(drawn) == sorted(e.hop for e in route.edges) and len(drawn) == 15
    for hop, group in drawn.items():
        counts = data.RECENT.get(str(hop), data.HopCounts())
        judged = counts.delivered + counts.lost + counts.confirmed_lost + counts.duplicate
        assert int(group.get("data-verdicts", "")) == judged, hop
        assert int(group.get("data-lost", "")) == counts.lost, hop
        assert int(group.get("data-confirmed-lost", "")) == counts.confirmed_lost, hop
        assert int(group.get("data-duplicate", "")) == counts.duplicate, hop
        # the edge is drawn where its hop goes: its spline starts at the source's box, its arrow ends at the target's
        path = group.find(f"{SVG}path")
        arrow = group.find(f"{SVG}polygon")
        assert path is not None and arrow is not None
        start = tuple(float(v) for v in re.findall(r"-?[\d.]+", path.get("d", ""))[:2])
        tip = tuple(float(v) for v in arrow.get("points", "").split()[0].split(","))
        source, target = group.get("data-source", ""), group.get("data-target", "")
        assert near((start[0], start[1]), nodes[source]), (hop, start, source)
        assert near((tip[0], tip[1]), nodes[target]), (hop, tip, target)
        assert path.get("stroke") == STATE_COLOUR[EdgeState[group.get("data-state", "")]]


@needs_dot
def test_labels_say_the_volume_loss_rate_p95_and_health_and_links_go_to_lost_messages_and_health(
    tmp_path: Path,
) -> None:
    route = payments_map(tmp_path)
    svg = svg_of(route_map_svg(route, "/khipu"))
    labels = {
        g.get("data-hop"): [t.text for t in g.iter(f"{SVG}text")]
        for g in svg.iter(f"{SVG}g")
        if g.get("class") == "edge-label"
    }
    assert labels[data.ENRICH_ORDERS] == ["200 msgs", "loss 3.00 %", "p95 120 ms"]
    assert labels[data.JOIN_PAYMENTS] == ["243 msgs", "loss 0.00 % \N{MIDDLE DOT} dup 5.35 %", "p95 900 ms"]
    assert labels[data.FRAUD] == ["243 msgs", "loss 0.00 %", "p95 300 ms", "STALL 1/3"]
    assert labels[data.ARCHIVE][-1] == "EXPIRY RISK 1/1" and labels[data.ARCHIVE][2] == "p95 4200 ms"
    assert labels[data.BILLING] == ["no verdicts"]
    links = {
        a.find(f"{SVG}g").get("data-hop"): a.get("href")  # type: ignore[union-attr]
        for a in svg.iter(f"{SVG}a")
        if a.get("class") == "edge-link"
    }
    audit = urlsplit(links[data.AUDIT] or "")
    assert audit.path == "/khipu/lost"
    assert parse_qs(audit.query) == {"stream": [data.STREAM], "hop": [data.AUDIT], "since": ["1970-01-01T00:00:01Z"]}
    health_links = {
        a.find(f"{SVG}g").get("data-node"): a.get("href")  # type: ignore[union-attr]
        for a in svg.iter(f"{SVG}a")
        if a.get("class") == "node-link"
    }
    assert parse_qs(urlsplit(health_links["group:fraud-scorer"] or "").query) == {
        "cluster": ["west"],
        "group": ["fraud-scorer"],
    }
    assert "group:mm2-lake" not in health_links  # its offsets are outside Kafka: no consumer health
    assert not any(node.startswith(("producer:", "topic:")) for node in health_links)
    badges = {g.get("data-node"): g.get("data-health") for g in svg.iter(f"{SVG}g") if g.get("class") == "node"}
    assert badges["group:ledger-audit"] == "STOP" and badges["group:payments-enricher"] == "REWIND"


@needs_dot
def test_a_route_of_15_hops_over_3_clusters_is_readable_and_quick(tmp_path: Path) -> None:
    route = payments_map(tmp_path)
    started = time.perf_counter()
    fragment = route_map_svg(route, "/khipu", dot=DOT, timeout_s=10.5)  # a cache key of its own: dot runs
    took_s = time.perf_counter() - started
    svg = svg_of(fragment)
    nodes, labels = boxes(svg, "node"), boxes(svg, "edge-label")
    assert len(labels) == 15
    for first, a in nodes.items():  # no node over another, no label over a node
        assert not [second for second, b in nodes.items() if second != first and overlap(a, b)], first
        assert not [hop for hop, b in labels.items() if overlap(a, b)], first
    width = float(svg.get("width", "0"))
    assert width < 1600, f"{width} px wide"  # fits a laptop's screen without zooming out
    assert took_s < 2.0, f"laid out and drawn in {took_s:.3f} s"


def hostile_map() -> RouteMap:
    name = 'x"<script>alert(1)</script>\\N&amp;'
    nodes = (
        MapNode("producer:p", NodeKind.PRODUCER, name),
        MapNode("topic:c/t", NodeKind.TOPIC, name, cluster=name),
        MapNode("group:g", NodeKind.GROUP, name, cluster=name),
    )
    f = WindowFigures(0, delivered=1)
    edges = (
        MapEdge(f"{name} -> w", HopKind.WRITE, "producer:p", "topic:c/t", f, EdgeState.OK),
        MapEdge(f"r -> {name}", HopKind.READ, "topic:c/t", "group:g", f, EdgeState.OK),
    )
    return RouteMap(name, 0, AlertThresholds(), (name,), nodes, edges)


@needs_dot
def test_names_from_the_registry_are_escaped_on_the_way_to_dot_and_into_the_page() -> None:
    name = 'x"<script>alert(1)</script>\\N&amp;'
    fragment = route_map_svg(hostile_map(), "/khipu")
    assert "<script" not in fragment
    svg = svg_of(fragment)
    names = {g.get("data-name") for g in svg.iter(f"{SVG}g") if g.get("class") == "node"}
    assert names == {name}  # the whole name, as written: DOT's \N was not expanded
    shown = [t.text for t in svg.iter(f"{SVG}text") if t.get("data-field") == "name"]
    assert shown == [name, name, name]
    assert {g.get("data-cluster") for g in svg.iter(f"{SVG}g") if g.get("class") == "cluster"} == {name}


def test_without_dot_the_map_says_what_to_install(tmp_path: Path) -> None:
    fragment = route_map_svg(hostile_map(), "/khipu", dot=str(tmp_path / "no-dot-here"))
    assert 'data-testid="routemap-problem"' in fragment and "<svg" not in fragment
    assert "Graphviz&#x27;s dot was not found" in fragment and "scripts/ensure-graphviz" in fragment
    assert "<script" not in fragment  # the stream's name, escaped here too


def test_a_dot_that_hangs_or_fails_is_named_and_the_map_left_out(tmp_path: Path) -> None:
    hangs = tmp_path / "dot-hangs"
    hangs.write_text("#!/bin/sh\nexec sleep 30\n")
    hangs.chmod(0o755)
    started = time.monotonic()
    fragment = route_map_svg(hostile_map(), "/khipu", dot=str(hangs), timeout_s=0.5)
    assert time.monotonic() - started < 10
    assert "did not lay the route out within 0.5 s" in fragment
    fails = tmp_path / "dot-fails"
    fails.write_text("#!/bin/sh\necho 'Error: syntax error in line 1' >&2\nexit 1\n")
    fails.chmod(0o755)
    assert "failed: Error: syntax error in line 1" in route_map_svg(hostile_map(), "/khipu", dot=str(fails))


@needs_dot
def test_the_demo_route_draws_its_processor_between_its_two_topics(tmp_path: Path) -> None:
    stream = load_registry(data.ROOT / "config" / "registry.yaml").stream("demo.orders")
    health = [PartitionState("local", "demo-sink-audit", "demo.orders-enriched", 0, PartitionStatus.STALL)]
    svg = svg_of(route_map_svg(route_map(stream, {}, health, since_ms=0), ""))
    nodes = boxes(svg, "node")
    order = [
        "producer:demo-producer",
        "topic:local/demo.orders",
        "group:demo-enricher",
        "topic:local/demo.orders-enriched",
    ]
    lefts = [nodes[n][0] for n in order]
    assert lefts == sorted(lefts), "left to right in the order a message goes"
    assert {g.get("data-health") for g in svg.iter(f"{SVG}g") if g.get("data-node") == "group:demo-sink-audit"} == {
        "STALL"
    }


@needs_dot
def test_an_edge_without_a_latency_says_why_a_producers_write_has_none(tmp_path: Path) -> None:
    """Issue 38: producer edges showed a bare "p95" and a dash. A producer's write is a message's first trace:
    nothing before it to measure a latency from (khipu.detector.decide._write_latency); a read's latency runs from
    the write, a processor's write's from its read, and a window of such a hop can still have none (a processor
    that carries its input's timestamp, a window of losses only)."""
    stream = load_registry(data.ROOT / "config" / "registry.yaml").stream("demo.orders")
    produce, enrich_read, enrich_write = (hop.id for hop in stream.route.hops[:3])
    figures = {
        produce: WindowFigures(0, delivered=40),  # as the detector judges a producer's write: no latency
        enrich_read: WindowFigures(0, delivered=40, latency_p95_ms=120),
        enrich_write: WindowFigures(0, delivered=40),
    }
    svg = svg_of(route_map_svg(route_map(stream, figures, [], since_ms=0), ""))
    labels = {
        g.get("data-hop"): (
            [t.text for t in g.iter(f"{SVG}text")],
            next(t.text for t in g.iter(f"{SVG}title")),
        )
        for g in svg.iter(f"{SVG}g")
        if g.get("class") == "edge-label"
    }
    lines, title = labels[produce]
    assert lines == ["40 msgs", "loss 0.00 %", "first write: no latency"]
    assert "the message's first trace: there is no earlier one to measure a latency from" in (title or "")
    assert labels[enrich_read][0][2] == "p95 120 ms"
    lines, title = labels[enrich_write]
    assert lines[2] == "p95 \N{EN DASH}: none measured"
    assert "no latency was measured in the window" in (title or "")
