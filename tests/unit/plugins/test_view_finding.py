"""The search and the messages at risk as the view serves them: the search box on every page, the search page and
API, the at-risk page and API, over a real SQLite store and archives (tests/viewdata.py)."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pyarrow as pa
import pytest
from fastapi.testclient import TestClient

from khipu.offsets.model import PartitionSnapshot, SnapshotRun
from khipu.registry.loader import load_registry
from khipu.store import Store
from khipu.trace.archive import SCHEMA, write_batch
from khipu_airflow.view.app import ViewSources, create_app
from tests.unit.plugins.test_view_app import NOW_MS, ROOT, TOKEN, token_check
from tests.viewdata import AUDIT_READ, Seeded, seed


@pytest.fixture
def view(tmp_path: Path) -> tuple[TestClient, Seeded, Store]:
    """The view over tests/viewdata.py's store, its trace archive at tmp_path/archive and an empty verdict archive."""
    store = Store(f"sqlite:///{tmp_path / 'khipu.db'}")
    store.migrate()
    registry = load_registry(ROOT / "config" / "registry.yaml")
    data = seed(store, tmp_path / "archive", registry, NOW_MS)
    sources = ViewSources(
        lambda: store, lambda: registry, tmp_path / "archive", "local", lambda: NOW_MS, tmp_path / "verdicts"
    )
    app = create_app(sources, token_check, lambda next_url: f"/auth/login?next={next_url}")
    return TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}), data, store


def test_every_page_carries_the_search_box_and_the_at_risk_link(view: tuple[TestClient, Seeded, Store]) -> None:
    client, data, _ = view
    for path in ("/", "/lost", f"/messages/{data.skipped}", "/consumers", "/self", "/alerts", "/search", "/at-risk"):
        page = client.get(path).text
        assert 'action="/search"' in page and 'data-testid="search-box"' in page, path
        assert 'href="/at-risk"' in page, path


def test_the_search_page_and_api_find_a_message_by_attribute_and_link_to_it(
    view: tuple[TestClient, Seeded, Store],
) -> None:
    client, data, store = view
    found = client.get("/api/v1/search", params={"q": f"order_id={data.order_id}"}).json()
    assert [m["message_id"] for m in found["messages"]] == [data.skipped] and found["complete"]
    stored = {r["hop"]: r["verdict"] for r in store.verdicts.read_messages([data.skipped])}
    assert found["messages"][0]["verdicts"] == stored and stored[AUDIT_READ] == "LOST"
    page = html.unescape(client.get("/search", params={"q": f"order_id={data.order_id}"}).text)
    assert re.findall(r'<tr data-message="([^"]+)"', page) == [data.skipped]
    assert f'href="/messages/{data.skipped}"' in page and "store, trace archive" in page
    refused = client.get("/search", params={"q": "orderid=1"})
    assert refused.status_code == 400 and "order_id" in html.unescape(refused.text)
    assert client.get("/search").status_code == 200  # an empty box: the form only


def test_the_at_risk_api_and_page_name_the_unconsumed_messages_of_a_stopped_group(
    view: tuple[TestClient, Seeded, Store], tmp_path: Path
) -> None:
    client, _, store = view
    retention = 600_000
    written = [NOW_MS - 590_000 + i * 1_000 for i in range(5)]  # offsets 0..4, the oldest leaving in 10 s
    for at, committed, state in ((NOW_MS - 60_000, 2, "STABLE"), (NOW_MS, 2, "EMPTY")):  # read 2, then stopped
        store.snapshots.write(
            SnapshotRun(at, "local", 1, 1, 5),
            [PartitionSnapshot(at, "local", "risk-group", "risk.topic", 0, committed, 0, 5, state, retention)],
        )
    rows = [
        {**{name: None for name in SCHEMA.names}, "message_id": f"risk-{i}", "stream": "demo.orders", "type": "SENT",
         "location": "p", "cluster": "local", "topic": "risk.topic", "partition": 0, "offset": i, "timestamp_ms": at,
         "emitter_id": "p-1", "emitter_seq": i, "attributes": "{}", "kafka_timestamp_ms": at}
        for i, at in enumerate(written)
    ]  # fmt: skip
    write_batch(tmp_path / "archive", 90, pa.Table.from_pylist(rows, schema=SCHEMA))  # the archive the view reads

    report = client.get("/api/v1/at-risk", params={"minutes": "60"}).json()
    named = [(m["message_id"], m["offset"], m["time_left_ms"], m["reached_ms"]) for m in report["messages"]]
    assert named == [(f"risk-{i}", i, written[i] + retention - NOW_MS, None) for i in (2, 3, 4)]
    (line,) = [p for p in report["partitions"] if p["group"] == "risk-group"]
    assert (line["unconsumed"], line["at_risk"], line["gone"], line["pace_per_s"]) == (3, 3, 0, 0.0)
    soon = client.get("/api/v1/at-risk", params={"minutes": "0.21"}).json()  # 12.6 s ahead: risk-2 leaves in 12 s
    assert [m["message_id"] for m in soon["messages"]] == ["risk-2"]

    page = html.unescape(client.get("/at-risk").text)
    assert re.findall(r'<tr data-message="([^"]+)" data-group="risk-group"', page) == ["risk-2", "risk-3", "risk-4"]
    assert 'href="/messages/risk-2"' in page and "not moving" in page
    assert client.get("/at-risk", params={"minutes": "-1"}).status_code == 400
