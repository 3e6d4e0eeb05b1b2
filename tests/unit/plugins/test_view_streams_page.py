"""The streams page: each stream's route map and its hops' table over the chosen window (15m, 1h, 1d, 1w), served by
the view's FastAPI app over a real SQLite store holding the demo stream's seed and the 3-cluster ``payments`` route.

Every figure is checked against what the seed wrote (``tests/viewdata.py``, ``tests/routemapdata.py``). Airflow's
login is replaced by the token check of ``test_view_app.py``; the real login is the browser tests'.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from khipu.registry.loader import load_registry
from khipu.store import Store
from khipu_airflow.view.app import ViewSources, create_app
from tests import routemapdata as data
from tests.unit.plugins.test_view_app import TOKEN, token_check
from tests.viewdata import STREAM as DEMO
from tests.viewdata import a_duplicate, seed

NOW_MS = 1_795_000_000_000
WINDOW_MS = {"15m": 15 * 60_000, "1h": 3_600_000, "1d": 86_400_000, "1w": 7 * 86_400_000}


@dataclass
class Page(HTMLParser):
    """What the streams page shows: each route map edge's attributes, each table row's cells, the chosen window."""

    edges: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)  # (stream, hop) -> data-*
    nodes: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)  # (stream, node id) -> data-*
    cells: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)  # (stream, hop) -> field -> text
    windows: dict[str, str] = field(default_factory=dict)  # table stream -> data-window
    current: list[str] = field(default_factory=list)  # the chooser's current window
    maps: list[str] = field(default_factory=list)  # streams with a route map, in page order
    _svg_stream: str = ""
    _table: str = ""
    _row: str = ""
    _field: str = ""

    def __post_init__(self) -> None:
        HTMLParser.__init__(self)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "svg" and a.get("class") == "routemap":
            self._svg_stream = a["data-stream"]
            self.maps.append(a["data-stream"])
        elif tag == "g" and a.get("class") == "edge":
            self.edges[(self._svg_stream, a["data-hop"])] = a
        elif tag == "g" and a.get("class") == "node":
            self.nodes[(self._svg_stream, a["data-node"])] = a
        elif tag == "table" and "data-stream" in a:
            self._table = a["data-stream"]
            self.windows[self._table] = a.get("data-window", "")
        elif tag == "tr" and "data-hop" in a:
            self._row = a["data-hop"]
            self.cells[(self._table, self._row)] = {}
        elif tag == "td" and self._row and "data-field" in a:
            self._field = a["data-field"]
            self.cells[(self._table, self._row)][self._field] = ""
        elif tag == "a" and a.get("aria-current") == "true":
            self.current.append(a.get("data-window", ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._field = ""
        elif tag == "svg":
            self._svg_stream = ""

    def handle_data(self, text: str) -> None:
        if self._field and self._row:
            self.cells[(self._table, self._row)][self._field] += text.strip()


def read_page(text: str) -> Page:
    page = Page()
    page.feed(text)
    return page


@pytest.fixture
def client(tmp_path: Path) -> tuple[TestClient, list[dict[str, Any]], list[dict[str, Any]]]:
    url = f"sqlite:///{tmp_path / 'khipu.db'}"
    store = Store(url)
    store.migrate()
    registry = load_registry(data.write_registry(tmp_path / "registry.yaml"))
    demo_rows = seed(store, tmp_path / "archive", registry, NOW_MS).verdicts
    payments_rows = data.seed_payments(store, NOW_MS)
    sources = ViewSources(lambda: store, lambda: registry, tmp_path / "archive", "local", lambda: NOW_MS)
    app = create_app(sources, token_check, lambda next_url: f"/auth/login?next={next_url}")
    return TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}), demo_rows, payments_rows


def in_window(rows: list[dict[str, Any]], window_ms: int) -> list[dict[str, Any]]:
    start = (NOW_MS - window_ms) // 60_000 * 60_000  # a window sums whole minutes from the one holding its start
    return [r for r in rows if r["decided_ms"] // 60_000 * 60_000 >= start]


def test_the_streams_page_opens_with_every_streams_route_map_over_the_last_hour(
    client: tuple[TestClient, list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    web, _, _ = client
    answer = web.get("/")
    assert answer.status_code == 200
    page = read_page(answer.text)
    assert sorted(page.maps) == ["demo.bursts", "demo.orders", "payments"]
    assert page.current == ["1h"] and set(page.windows.values()) == {"1h"}
    assert answer.text.index('class="routemap"') < answer.text.index("<table")  # the map first
    assert len([k for k in page.edges if k[0] == data.STREAM]) == 15


@pytest.mark.parametrize("window", list(WINDOW_MS))
def test_the_window_applies_to_the_map_and_the_tables(
    client: tuple[TestClient, list[dict[str, Any]], list[dict[str, Any]]], window: str
) -> None:
    web, demo_rows, _ = client
    page = read_page(web.get("/", params={"window": window}).text)
    assert page.current == [window] and set(page.windows.values()) == {window}
    truth = data.expected(WINDOW_MS[window])
    for hop in (hop for (stream, hop) in page.edges if stream == data.STREAM):
        counts = truth.get(hop, data.HopCounts())
        edge, row = page.edges[(data.STREAM, hop)], page.cells[(data.STREAM, hop)]
        for name, count in (("delivered", counts.delivered), ("lost", counts.lost),
                            ("confirmed_lost", counts.confirmed_lost), ("duplicate", counts.duplicate)):  # fmt: skip
            assert int(edge[f"data-{name.replace('_', '-')}"]) == count, (window, hop, name)
            assert int(row[name]) == count, (window, hop, name)
        assert int(edge["data-verdicts"]) == counts.judged, (window, hop)
        assert edge["data-p95-ms"] == (str(counts.latency_ms) if counts.delivered else ""), (window, hop)
        lost = counts.lost + counts.confirmed_lost
        rate = lost / counts.judged if counts.judged else 0.0
        assert float(edge["data-loss-rate"]) == pytest.approx(rate), (window, hop)
        assert row["loss_rate"] == f"{100 * rate:.2f} %"
    for hop in {r["hop"] for r in demo_rows}:  # the demo stream: what viewdata wrote in the window
        rows = in_window([r for r in demo_rows if r["hop"] == hop], WINDOW_MS[window])
        edge = page.edges[(DEMO, hop)]
        assert int(edge["data-lost"]) == sum(r["verdict"] == "LOST" for r in rows), (window, hop)
        assert int(edge["data-delivered"]) == sum(r["verdict"] == "DELIVERED" for r in rows), (window, hop)
        assert int(edge["data-duplicate"]) == sum(map(a_duplicate, rows)), (window, hop)


def test_each_edges_colour_is_its_state_against_the_streams_thresholds(
    client: tuple[TestClient, list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    web, _, _ = client
    edges = read_page(web.get("/", params={"window": "15m"}).text).edges
    state = {hop: edges[(data.STREAM, hop)]["data-state"] for (stream, hop) in edges if stream == data.STREAM}
    for hop, counts in data.RECENT.items():  # the thresholds: loss 2 %, duplicates 5 %
        loss = (counts.lost + counts.confirmed_lost) / counts.judged
        duplicates = counts.duplicate / counts.judged
        wanted = (
            "LOSS" if loss > data.LOSS_THRESHOLD
            else "DUPLICATES" if duplicates > data.DUPLICATE_THRESHOLD
            else "LOSS_WITHIN" if loss > 0
            else "OK"
        )  # fmt: skip
        assert state.pop(hop) == wanted, hop
    assert state == {data.BILLING: "IDLE", data.JOIN_INVOICES: "IDLE"}  # nothing in the last 15 minutes
    week = read_page(web.get("/", params={"window": "1w"}).text).edges
    assert week[(data.STREAM, data.BILLING)]["data-state"] == "OK"  # three days ago
    assert week[(data.STREAM, data.CHECKOUT)]["data-state"] == "LOSS"  # 100 lost three hours ago, of 400


@pytest.mark.parametrize("value", ["2h", "", "1H", "15m ", "week"])
def test_a_window_not_offered_is_refused_naming_those_that_are(
    client: tuple[TestClient, list[dict[str, Any]], list[dict[str, Any]]], value: str
) -> None:
    web, _, _ = client
    answer = web.get("/", params={"window": value})
    assert answer.status_code == 400
    assert f"query 'window': got {value!r}; expected one of 15m, 1h, 1d, 1w" in html.unescape(answer.text)


def test_an_edge_links_to_its_lost_messages_and_a_group_to_its_consumer_health_on_its_cluster(
    client: tuple[TestClient, list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    web, _, _ = client
    text = web.get("/").text
    for hop in (data.AUDIT, data.ENRICH_ORDERS, data.JOIN_WRITE):
        link = html.unescape(
            text.split(f'data-hop="{html.escape(hop)}"')[0].rsplit('<a class="edge-link" href="', 1)[1]
        )
        lost = web.get(link.split('"', 1)[0])
        assert lost.status_code == 200
        shown = sorted(set(re.findall(r'data-message="([^"]+)"', lost.text)))
        assert shown == sorted(data.lost_ids(hop)), hop
    node = read_page(text).nodes[(data.STREAM, "group:fraud-scorer")]
    assert (node["data-cluster"], node["data-health"]) == ("west", "STALL")
    health = web.get("/consumers", params={"cluster": "west", "group": "fraud-scorer"})
    assert health.status_code == 200 and "cluster west" in health.text
    statuses = re.findall(r'data-partition="fraud-scorer/payments/(\d)".*?data-field="status"[^>]*>(\w+)<',
                                        health.text, re.S)  # fmt: skip
    assert statuses == [("0", "OK"), ("1", "STALL"), ("2", "OK")]
    unknown = web.get("/consumers", params={"cluster": "nowhere"})
    assert unknown.status_code == 400 and "east, lake, local, west" in html.unescape(unknown.text)
