"""The route map on the streams page, in Airflow's own api-server behind its login, in Debian's Chromium.

The api-server reads a registry holding the demo streams (``config/registry.yaml``) and ``payments``, a route of 15
hops over the clusters east, west and lake with fan-out and fan-in (``tests/routemapdata.py``); the store holds
what ``tests/viewdata.py`` and ``tests/routemapdata.py`` write. Every edge is checked against those writes: its
counts, its label, its colour against the stream's thresholds, where it links. Screenshots go where
``test_view_browser.py``'s do (``make screenshots``: ``docs/screenshots``).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Locator, Page

from khipu.localstack.processes import free_port
from khipu.registry.loader import load_registry
from khipu.report.routemap import EdgeState
from khipu.store import Store
from khipu_airflow.view.routemap import STATE_COLOUR
from tests import routemapdata as data
from tests.integration.view.conftest import api_server
from tests.viewdata import AUDIT_READ, Seeded, a_duplicate, judged, seed
from tests.viewdata import STREAM as DEMO

pytestmark = pytest.mark.integration

WINDOW_MS = {"15m": 15 * 60_000, "1h": 3_600_000, "1d": 86_400_000, "1w": 7 * 86_400_000}
CHOOSER = {"15m": "15 minutes", "1h": "hour", "1d": "day", "1w": "week"}
USER = "khipu-routemap-admin"  # an Airflow admin: sees every team's streams (docs/view.md)


@dataclass
class RouteServer:
    base: str
    password: str
    seeded: Seeded
    payments: list[dict[str, Any]]
    seeded_ms: int
    thresholds: dict[str, tuple[float, float]]  # stream -> (loss, duplicate) thresholds of the registry


@pytest.fixture(scope="module")
def route_server(airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouteServer]:
    """Airflow's api-server with this checkout's plugins and the 3-cluster registry, one admin."""
    work = tmp_path_factory.mktemp("routemap")
    password = secrets.token_urlsafe(12)
    passwords = work / "passwords.json"
    passwords.write_text(json.dumps({USER: password}))
    registry_path = data.write_registry(work / "registry.yaml")
    registry = load_registry(registry_path)
    store_url = f"sqlite:///{work / 'khipu.db'}"
    store = Store(store_url)
    store.migrate()
    now = time.time_ns() // 1_000_000
    seeded = seed(store, work / "state" / "archive", registry, now)
    payments = data.seed_payments(store, now)
    store.close()
    port = free_port()
    env = {
        **os.environ,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "KHIPU_STORE_URL": store_url,
        "KHIPU_STATE_DIR": str(work / "state"),
        "KHIPU_REGISTRY": str(registry_path),
    }
    log = work / "api-server.log"
    with api_server(env, port, log) as base:
        limits = {name: (s.alerts.loss_rate, s.alerts.duplicate_rate) for name, s in registry.streams.items()}
        yield RouteServer(base, password, seeded, payments, now, limits)


@pytest.fixture
def page(route_server: RouteServer, browser: Browser) -> Iterator[Page]:
    opened = browser.new_page(viewport={"width": 1500, "height": 950})
    try:
        target = f"{route_server.base}/khipu/"
        opened.goto(target)
        opened.wait_for_url("**/auth/login**")
        opened.get_by_label("Username").fill(USER)
        opened.get_by_label("Password").fill(route_server.password)
        opened.get_by_role("button", name="Sign in").click()
        opened.wait_for_url(target, timeout=30_000)
        yield opened
    finally:
        opened.close()


def expected_state(lost: int, duplicate: int, judged_count: int, limits: tuple[float, float]) -> EdgeState:
    """The state docs/view.md promises for these counts and thresholds (strictly above is a breach)."""
    if not judged_count:
        return EdgeState.IDLE
    if lost / judged_count > limits[0]:
        return EdgeState.LOSS
    if duplicate / judged_count > limits[1]:
        return EdgeState.DUPLICATES
    return EdgeState.LOSS_WITHIN if lost else EdgeState.OK


def edge(page: Page, stream: str, hop: str) -> Locator:
    return page.locator(f'svg.routemap[data-stream="{stream}"] g.edge[data-hop="{hop}"]')


def label_lines(page: Page, stream: str, hop: str) -> list[str]:
    lines = page.locator(f'svg.routemap[data-stream="{stream}"] g.edge-label[data-hop="{hop}"] text')
    return [str(line) for line in lines.evaluate_all("ts => ts.map(t => t.textContent)")]  # SVG: no innerText


def test_after_login_the_streams_page_opens_with_the_demo_streams_route_map(
    route_server: RouteServer, page: Page, shots: Path
) -> None:
    page.goto(f"{route_server.base}/khipu/")
    demo = page.locator(f'figure.routemap[data-stream="{DEMO}"]')
    demo.wait_for()
    assert demo.is_visible() and demo.bounding_box() is not None
    first_table = page.locator("table").first.bounding_box()
    assert first_table is not None and demo.bounding_box()["y"] < first_table["y"]  # type: ignore[index]
    hour_start = (time.time_ns() // 1_000_000 - 3_600_000) // 60_000 * 60_000
    registry_hops = [h.id for h in load_registry(data.ROOT / "config" / "registry.yaml").stream(DEMO).route.hops]
    assert sorted(page.locator(f'svg.routemap[data-stream="{DEMO}"] g.edge').evaluate_all(
        "gs => gs.map(g => g.dataset.hop)"
    )) == sorted(registry_hops)  # fmt: skip
    for hop in registry_hops:  # each edge against what the seed wrote in the last hour
        rows = judged(
            [
                r
                for r in route_server.seeded.verdicts
                if r["hop"] == hop and r["decided_ms"] // 60_000 * 60_000 >= hour_start
            ]
        )
        lost = sum(r["verdict"] in ("LOST", "CONFIRMED_LOST") for r in rows)
        duplicate = sum(map(a_duplicate, rows))
        shown = edge(page, DEMO, hop)
        assert int(shown.get_attribute("data-verdicts") or -1) == len(rows), hop
        assert (
            int(shown.get_attribute("data-lost") or -1) + int(shown.get_attribute("data-confirmed-lost") or -1) == lost
        )
        assert int(shown.get_attribute("data-duplicate") or -1) == duplicate, hop
        lines = label_lines(page, DEMO, hop)
        assert lines[:2] == [f"{len(rows):,} msgs", f"loss {100 * lost / len(rows):.2f} %"
                             + (f" · dup {100 * duplicate / len(rows):.2f} %" if duplicate else "")], hop  # fmt: skip
        state = expected_state(lost, duplicate, len(rows), route_server.thresholds[DEMO])
        assert shown.get_attribute("data-state") == state.name, hop
        assert shown.locator("path").get_attribute("stroke") == STATE_COLOUR[state], hop
    stalled = route_server.seeded.stalled
    assert stalled is not None
    node = page.locator(f'svg.routemap[data-stream="{DEMO}"] g.node[data-node="group:{stalled.group}"]')
    assert node.get_attribute("data-health") == "STALL" and "STALL 1/1" in (node.text_content() or "")
    page.screenshot(path=str(shots / "streams-route-map.png"))  # what a user sees first after logging in
    demo.screenshot(path=str(shots / "route-map-demo.png"))

    # an edge leads to its hop's lost messages, a group to its consumer health
    page.locator(f'svg.routemap[data-stream="{DEMO}"] g.edge-label[data-hop="{AUDIT_READ}"]').click()
    page.wait_for_url("**/khipu/lost?**")
    listed = page.locator("table[data-testid=verdicts] tr[data-message]").evaluate_all(
        "rs => rs.map(r => r.dataset.message)"
    )
    assert listed == [route_server.seeded.skipped]
    page.go_back()
    node.click()
    page.wait_for_url("**/khipu/consumers?**")
    status = page.locator(
        f'tr[data-partition="{stalled.group}/{stalled.topic}/{stalled.partition}"] [data-field="status"]'
    )
    assert status.inner_text() == "STALL"


def test_a_3_cluster_fan_out_and_fan_in_route_follows_the_window_chooser(
    route_server: RouteServer, page: Page, shots: Path
) -> None:
    page.goto(f"{route_server.base}/khipu/")
    payments = page.locator(f'svg.routemap[data-stream="{data.STREAM}"]')
    payments.wait_for()
    clusters = page.locator(f'svg.routemap[data-stream="{data.STREAM}"] g.cluster')
    assert clusters.evaluate_all("gs => gs.map(g => g.dataset.cluster)") == ["east", "west", "lake"]
    for window in ("15m", "1d", "1w", "1h"):
        page.locator(f'[data-testid=windows] a[data-window="{window}"]').click()
        page.wait_for_url(f"**/khipu/?window={window}")
        assert page.locator('[data-testid=windows] a[aria-current="true"]').inner_text() == CHOOSER[window]
        truth = data.expected(WINDOW_MS[window])
        drawn = page.locator(f'svg.routemap[data-stream="{data.STREAM}"] g.edge').evaluate_all(
            "gs => gs.map(g => ({...g.dataset, stroke: g.querySelector('path').getAttribute('stroke')}))"
        )
        assert len(drawn) == 15
        for shown in drawn:
            counts = truth.get(shown["hop"], data.HopCounts())
            lost = counts.lost + counts.confirmed_lost
            figures = [int(shown[k]) for k in ("verdicts", "lost", "confirmedLost", "duplicate")]
            wanted = [counts.judged, counts.lost, counts.confirmed_lost, counts.duplicate]
            assert figures == wanted, (window, shown["hop"])
            state = expected_state(
                lost, counts.duplicate, counts.judged, (data.LOSS_THRESHOLD, data.DUPLICATE_THRESHOLD)
            )
            assert (shown["state"], shown["stroke"]) == (state.name, STATE_COLOUR[state]), (window, shown["hop"])
            lines = label_lines(page, data.STREAM, shown["hop"])
            if counts.judged:
                assert lines[0] == f"{counts.judged:,} msgs" and lines[1].startswith(
                    f"loss {100 * lost / counts.judged:.2f} %"
                )
                assert lines[2] == f"p95 {counts.latency_ms} ms"  # every seeded latency is under 10 s: in ms
            else:
                assert lines[0] == "no verdicts"
            row = page.locator(f'table[data-stream="{data.STREAM}"] tr[data-hop="{shown["hop"]}"]')
            assert row.get_attribute("data-window") == window
            assert int(row.locator('[data-field="lost"]').inner_text()) == counts.lost, (window, shown["hop"])
            assert int(row.locator('[data-field="delivered"]').inner_text()) == counts.delivered, (window, shown["hop"])

    # consumer health, as the seed stored it, on each read hop and its group
    for cluster, group, topic, _ in data.HEALTH:
        node = page.locator(f'svg.routemap[data-stream="{data.STREAM}"] g.node[data-node="group:{group}"]')
        worst = max(s for (c, g, _, _), s in data.HEALTH.items() if g == group)
        assert node.get_attribute("data-health") == worst.name, group
        hop = f"{cluster}/{topic} -> {group}"
        worst_on_hop = max(s for (c, g, t, _), s in data.HEALTH.items() if (c, g, t) == (cluster, group, topic))
        assert edge(page, data.STREAM, hop).get_attribute("data-health") == worst_on_hop.name, hop
    mirror = page.locator(f'svg.routemap[data-stream="{data.STREAM}"] g.node[data-node="group:mm2-lake"]')
    assert "offsets outside Kafka" in (mirror.text_content() or "") and mirror.get_attribute("data-health") == ""

    # readable as Chromium draws it: no node over another, every text inside its box, no label over a node
    boxes = page.locator(f'svg.routemap[data-stream="{data.STREAM}"] g.node').evaluate_all(
        """gs => gs.map(g => {
            const r = g.querySelector('rect').getBBox();
            const texts = [...g.querySelectorAll('text')].map(t => t.getBBox());
            return {id: g.dataset.node, x: r.x, y: r.y, w: r.width, h: r.height,
                    fits: texts.every(t => t.x >= r.x - 0.5 && t.x + t.width <= r.x + r.width + 0.5
                                           && t.y >= r.y - 0.5 && t.y + t.height <= r.y + r.height + 0.5)};
        })"""
    )
    labels = page.locator(f'svg.routemap[data-stream="{data.STREAM}"] g.edge-label').evaluate_all(
        "gs => gs.map(g => { const b = g.getBBox(); "
        "return {hop: g.dataset.hop, x: b.x, y: b.y, w: b.width, h: b.height}; })"
    )
    assert len(boxes) == 16 and len(labels) == 15
    for box in boxes:
        assert box["fits"], f"a text of {box['id']} spills out of its box"
        for other in boxes + labels:
            if other is not box:
                assert not _overlap(box, other), (box.get("id"), other.get("id") or other.get("hop"))
    payments.scroll_into_view_if_needed()
    page.locator(f'figure.routemap[data-stream="{data.STREAM}"]').screenshot(
        path=str(shots / "route-map-3-clusters.png")
    )

    # an edge's lost messages; a group's consumer health on its own cluster
    page.locator(f'svg.routemap[data-stream="{data.STREAM}"] g.edge-label[data-hop="{data.AUDIT}"]').click()
    page.wait_for_url("**/khipu/lost?**")
    listed = page.locator("table[data-testid=verdicts] tr[data-message]").evaluate_all(
        "rs => rs.map(r => r.dataset.message)"
    )
    assert sorted(listed) == sorted(data.lost_ids(data.AUDIT)) and len(listed) == 30
    page.go_back()
    page.locator(f'svg.routemap[data-stream="{data.STREAM}"] g.node[data-node="group:fraud-scorer"]').click()
    page.wait_for_url("**/khipu/consumers?cluster=west&group=fraud-scorer")
    shown = page.locator("tr[data-partition]").evaluate_all(
        "rs => rs.map(r => [r.dataset.partition, r.querySelector('[data-field=status]').textContent])"
    )
    assert shown == [
        [f"fraud-scorer/payments/{p}", s.name] for (c, g, _, p), s in data.HEALTH.items() if g == "fraud-scorer"
    ]


def _overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (
        a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"] and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"]
    )


def test_a_window_not_offered_is_refused_in_the_page_naming_those_that_are(
    route_server: RouteServer, page: Page
) -> None:
    answer = page.goto(f"{route_server.base}/khipu/?window=2h")
    assert answer is not None and answer.status == 400
    assert "expected one of 15m, 1h, 1d, 1w" in page.get_by_test_id("problem").inner_text()
