"""The Khipu view's pages and JSON API, served by its FastAPI app over a real SQLite store and archive.

Airflow's login is replaced here by a token check of the test's own (``authenticate``): what is tested
is what the app shows and refuses. The real Airflow login in front of it is tested in a browser
(tests/integration/view/test_view_browser.py).
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import pytest
from fastapi import HTTPException, Request
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from khipu.detector.model import DETECTOR_QUERY
from khipu.registry.loader import load_registry
from khipu.store import Store
from khipu_airflow.view.app import ViewSources, create_app
from tests.archived import seed_archived
from tests.viewdata import (
    AUDIT_READ,
    ENRICH_READ,
    ENRICH_WRITE,
    PRODUCE,
    STORE_READ,
    STREAM,
    Seeded,
    a_duplicate,
    a_latency,
    judged,
    seed,
)

ROOT = Path(__file__).resolve().parents[3]
NOW_MS = 1_795_000_000_000
TOKEN = "test-token"


async def token_check(request: Request) -> Any:
    if request.headers.get("authorization") != f"Bearer {TOKEN}" and request.cookies.get("_token") != TOKEN:
        raise HTTPException(status_code=401, detail="Not authenticated")
    return "tester"


@pytest.fixture
def seeded(tmp_path: Path) -> tuple[TestClient, Seeded, Store]:
    url = f"sqlite:///{tmp_path / 'khipu.db'}"
    store = Store(url)
    store.migrate()
    registry = load_registry(ROOT / "config" / "registry.yaml")
    data = seed(store, tmp_path / "archive", registry, NOW_MS)
    view_store = Store(url)
    sources = ViewSources(
        store=lambda: view_store,
        load_registry=lambda: registry,
        archive_dir=tmp_path / "archive",
        cluster="local",
        now_ms=lambda: NOW_MS,
        verdict_archive_dir=tmp_path / "verdicts",  # empty unless a test seeds it (tests/archived.py)
    )
    app = create_app(sources, token_check, lambda next_url: f"/auth/login?next={next_url}")
    client = TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"})
    return client, data, store


def test_without_a_login_every_route_is_refused_and_pages_send_to_the_login(
    seeded: tuple[TestClient, Seeded, Store],
) -> None:
    client, data, _ = seeded
    anonymous = TestClient(client.app, headers={"Origin": "http://testserver"})  # as a browser sends with a POST
    routes = [route for route in client.app.routes if isinstance(route, APIRoute)]
    assert len(routes) == 19  # 10 API answers (with the OpenAPI description), 8 pages, a resend: each one tried below
    for route in routes:
        path = route.path_format.replace("{stream}", STREAM).replace("{message_id}", data.skipped)
        method = sorted(route.methods)[0]
        answer = anonymous.request(method, path, follow_redirects=False)
        if "/api/v1/" in route.path:
            assert answer.status_code == 401, path
        else:
            assert answer.status_code == 303, path
            back_to = path if method == "GET" else "/"  # a POST without a Referer: the home page, not a POST address
            assert answer.headers["location"] == f"/auth/login?next={back_to}", path


def test_the_login_returns_to_a_path_of_this_site_whatever_host_the_request_named(
    seeded: tuple[TestClient, Seeded, Store],
) -> None:
    client, _, _ = seeded
    anonymous = TestClient(client.app)
    answer = anonymous.get("/lost?stream=demo.orders", headers={"Host": "evil.example"}, follow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["location"] == "/auth/login?next=/lost?stream=demo.orders"  # no host: this site's path


def test_a_resend_whose_session_expired_returns_after_the_login_to_the_message_page(
    seeded: tuple[TestClient, Seeded, Store],
) -> None:
    client, data, _ = seeded
    page = f"http://testserver/messages/{data.skipped}"
    expired = TestClient(client.app, headers={"Origin": "http://testserver", "Referer": page})
    answer = expired.post(f"/messages/{data.skipped}/resend", data={"hop": "x"}, follow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["location"] == f"/auth/login?next=/messages/{data.skipped}"  # a page, not the POST address
    elsewhere = TestClient(client.app, headers={"Origin": "http://testserver", "Referer": "http://evil.example/x"})
    answer = elsewhere.post(f"/messages/{data.skipped}/resend", data={"hop": "x"}, follow_redirects=False)
    assert answer.status_code == 303  # the Origin is ours; the Referer names another site: never returned to
    assert answer.headers["location"] == "/auth/login?next=/"


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        ({}, "carried neither"),
        ({"Origin": "http://evil.example"}, "Origin names evil.example"),
        ({"Origin": "null"}, "Origin is null"),  # a sandboxed frame's, or a redirect's from another site
        ({"Origin": "null", "Referer": "http://testserver/messages/x"}, "Origin is null"),  # not made up by a Referer
        ({"Origin": "http://testserver", "X-Forwarded-Host": "evil.example"}, "never"),  # ours: accepted (below)
        ({"Referer": "http://evil.example/page"}, "Referer names evil.example"),
        ({"Origin": "http://evil.example", "Referer": "http://testserver/messages/x"}, "Origin names evil.example"),
    ],
)
def test_a_state_changing_request_not_from_the_views_own_pages_is_refused_logged_in_or_not(
    seeded: tuple[TestClient, Seeded, Store], headers: dict[str, str], why: str
) -> None:
    client, data, _ = seeded
    for caller in (client, TestClient(client.app)):  # with a session, and without one
        answer = caller.post(f"/messages/{data.skipped}/resend", data={"hop": "x"}, headers=headers,
                             follow_redirects=False)  # fmt: skip
        if why == "never":  # the Origin names the Host: not refused as cross-site (400: no such loss; 303: login)
            assert answer.status_code in (400, 303), (headers, answer.text)
            continue
        assert answer.status_code == 403, (headers, answer.text)
        assert why in html.unescape(answer.text)


def test_behind_a_proxy_the_forwarded_host_is_the_views_own() -> None:
    """A proxy that sends its own name as Host (nginx's default) and the browser's in X-Forwarded-Host: the view's
    own pages still POST; another site still does not."""
    from starlette.requests import Request

    from khipu_airflow.view.guard import CrossSiteRefused, check_same_origin, login_return_path

    def request(method: str, path: str, **headers: str) -> Request:
        raw = [(k.lower().replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
        return Request({"type": "http", "method": method, "path": path, "query_string": b"", "headers": raw,
                        "scheme": "http", "server": ("backend", 8080), "root_path": ""})  # fmt: skip

    proxied = {"host": "backend:8080", "x_forwarded_host": "khipu.example.org"}
    check_same_origin(request("POST", "/messages/m/resend", origin="http://khipu.example.org", **proxied))
    with pytest.raises(CrossSiteRefused):
        check_same_origin(request("POST", "/messages/m/resend", origin="http://evil.example", **proxied))
    page = login_return_path(
        request("POST", "/m/resend", referer="http://khipu.example.org/messages/m", **proxied), "/"
    )
    assert page == "/messages/m"
    # a path that reads as a host ('//evil.example/...'), sent raw: the login returns to a path of this site
    assert login_return_path(request("GET", "//evil.example/lost", host="testserver"), "/") == "/evil.example/lost"


def test_every_answer_forbids_framing_by_another_site(seeded: tuple[TestClient, Seeded, Store]) -> None:
    client, data, _ = seeded
    answers = [
        client.get("/"),
        client.get(f"/messages/{data.skipped}"),
        client.get("/api/v1/streams"),
        client.get("/nowhere"),  # a 404
        TestClient(client.app).get("/", follow_redirects=False),  # the login redirect
        client.post(f"/messages/{data.skipped}/resend", data={"hop": "x"}),  # refused: no Origin
    ]
    for answer in answers:
        assert answer.headers["x-frame-options"] == "SAMEORIGIN", answer.url
        assert answer.headers["content-security-policy"] == "frame-ancestors 'self'", answer.url
        assert answer.headers["x-content-type-options"] == "nosniff", answer.url


def test_streams_api_sums_the_stored_minutes_per_hop(seeded: tuple[TestClient, Seeded, Store]) -> None:
    client, _, store = seeded
    streams = {s["stream"]: s for s in client.get("/api/v1/streams").json()}
    assert set(streams) == {"demo.orders", "demo.bursts"}
    hops = {h["hop"]: h for h in streams[STREAM]["hops"]}
    hour_ago, day_ago = NOW_MS - 3_600_000, NOW_MS - 86_400_000
    for hop in hops:
        stored = [r for r in store.verdicts.rows() if r["hop"] == hop]
        for window, since in (("last_hour", hour_ago), ("last_day", day_ago)):
            figures = hops[hop][window]
            in_window = [r for r in stored if r["decided_ms"] // 60_000 * 60_000 >= since]  # whole minutes
            assert figures["verdicts"] == len(judged(in_window)), (hop, window)
            assert figures["delivered"] == sum(r["verdict"] == "DELIVERED" for r in in_window)
            for kind in ("ABORTED", "SUPERSEDED"):  # shown apart from losses and from every rate
                assert figures[kind.lower()] == sum(r["verdict"] == kind for r in in_window), (hop, window, kind)
            assert figures["duplicate"] == sum(map(a_duplicate, in_window))
            assert figures["reprocessed"] == sum(r.get("cause") == "reprocessed_after_abort" for r in in_window)
            skewed = sum(r["latency_ms"] is not None and not a_latency(r) for r in in_window)
            assert figures["skewed"] == skewed, (hop, window)
    audit = hops[AUDIT_READ]["last_hour"]
    assert audit["lost"] == 1 and audit["loss_rate"] == pytest.approx(1 / audit["verdicts"])
    assert audit["superseded"] == 1 and hops[ENRICH_READ]["last_hour"]["aborted"] == 1  # the seed's
    assert hops[STORE_READ]["last_hour"]["skewed"] == 1
    assert hops[AUDIT_READ]["last_day"]["verdicts"] > audit["verdicts"]  # the day holds the earlier messages too
    assert hops[ENRICH_WRITE]["last_hour"]["confirmed_lost"] == 1
    series = hops[AUDIT_READ]["series"]
    charted = judged(
        [r for r in store.verdicts.rows() if r["hop"] == AUDIT_READ and r["decided_ms"] >= series[0]["at_ms"]]
    )
    assert len(series) == 48 and sum(p["verdicts"] for p in series) == len(charted)
    lost_at = next(r["decided_ms"] for r in charted if r["verdict"] == "LOST")
    bucket = next(p for p in series if p["at_ms"] <= lost_at < p["at_ms"] + 30 * 60_000)
    minutes = [r["decided_ms"] // 60_000 * 60_000 for r in charted]
    in_bucket = [m for m in minutes if bucket["at_ms"] <= m < bucket["at_ms"] + 1_800_000]
    assert [p["loss_rate"] for p in series if p["loss_rate"]] == [pytest.approx(1 / len(in_bucket))]


def test_verdicts_api_pages_filters_and_carries_history_and_recovery_attributes(
    seeded: tuple[TestClient, Seeded, Store],
) -> None:
    client, data, _ = seeded
    losses = client.get("/api/v1/verdicts").json()
    assert {(r["message_id"], r["verdict"]) for r in losses["rows"]} == {
        (data.skipped, "LOST"),
        (data.dropped, "CONFIRMED_LOST"),
    }
    skipped = next(r for r in losses["rows"] if r["message_id"] == data.skipped)
    assert skipped["attributes"] == {"order_id": data.order_id} and skipped["cause"] == "skipped_by_consumer"
    dropped = next(r for r in losses["rows"] if r["message_id"] == data.dropped)
    assert [h["to_verdict"] for h in dropped["history"]] == ["LOST", "CONFIRMED_LOST"]

    delivered = [r for r in data.verdicts if r["verdict"] == "DELIVERED" and r["hop"] == STORE_READ]
    seen, cursor = [], None
    while True:
        params: dict[str, Any] = {"verdict": "DELIVERED", "hop": STORE_READ, "limit": 7}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/api/v1/verdicts", params=params).json()
        seen += [r["message_id"] for r in page["rows"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == len(delivered)  # every row once, across pages
    ordered = sorted(delivered, key=lambda r: (r["decided_ms"], r["message_id"]), reverse=True)
    assert seen == [r["message_id"] for r in ordered]

    by_cause = client.get("/api/v1/verdicts", params={"cause": "dropped_in_processor"}).json()["rows"]
    assert [r["message_id"] for r in by_cause] == [data.dropped]
    early = client.get("/api/v1/verdicts", params={"until": str(data.now_ms - 10 * 60_000)}).json()["rows"]
    assert [r["message_id"] for r in early] == [data.dropped]


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"stream": "nope"}, "demo.bursts, demo.orders"),
        ({"hop": "x -> y"}, "demo-producer -> local/demo.orders"),
        ({"verdict": "GONE"}, "CONFIRMED_LOST"),
        ({"since": "yesterday"}, "ISO time"),
        ({"cursor": "%%%"}, "next_cursor"),
        ({"limit": "0"}, "1 to 500"),
    ],
)
def test_bad_filters_are_refused_naming_what_is_known(
    seeded: tuple[TestClient, Seeded, Store], params: dict[str, str], named: str
) -> None:
    client, _, _ = seeded
    answer = client.get("/api/v1/verdicts", params=params)
    assert answer.status_code in (400, 404) and named in answer.json()["detail"]
    if "limit" in params:
        return  # the page has a fixed page size
    page = client.get("/lost", params=params)
    assert page.status_code == 400 and named in html.unescape(page.text)  # the page says what was wrong


def test_message_api_lays_the_message_along_its_route(seeded: tuple[TestClient, Seeded, Store]) -> None:
    client, data, _ = seeded
    report = client.get(f"/api/v1/messages/{data.skipped}").json()
    assert report["stream"] == STREAM and report["attributes"] == {"order_id": data.order_id}
    hops = [h["hop"] for h in report["hops"]]
    assert hops == [hop.id for hop in load_registry(ROOT / "config" / "registry.yaml").stream(STREAM).route.hops]
    audit = report["hops"][-1]
    assert audit["verdict"]["verdict"] == "LOST" and audit["traces"] == []
    assert [t["type"] for h in report["hops"][:-1] for t in h["traces"]] == ["SENT", "RECEIVED", "SENT", "RECEIVED"]
    missing = client.get("/api/v1/messages/never-seen")
    assert missing.status_code == 404 and "never-seen" in missing.json()["detail"]


def test_a_message_shows_its_archived_delivered_hops_beside_the_stores_loss_in_the_api_and_page(
    seeded: tuple[TestClient, Seeded, Store], tmp_path: Path
) -> None:
    client, _, store = seeded
    archived = seed_archived(store, tmp_path / "verdicts", NOW_MS)
    expected = {
        r["hop"]: r["verdict"] for r in archived.archived + archived.sql if r["message_id"] == archived.partly_lost
    }
    report = client.get(f"/api/v1/messages/{archived.partly_lost}").json()
    assert {h["hop"]: (h["verdict"] or {}).get("verdict") for h in report["hops"]} == expected
    assert set(expected.values()) == {"DELIVERED", "LOST"} and report["verdicts_note"] is None
    produce = next(h for h in report["hops"] if h["hop"] == PRODUCE)  # archived: its decision is its history
    assert [(c["from_verdict"], c["to_verdict"]) for c in produce["history"]] == [(None, "DELIVERED")]

    page = html.unescape(client.get(f"/messages/{archived.partly_lost}").text)
    shown = dict(re.findall(r'data-hop="([^"]+)".*?data-field="verdict"[^>]*>(\w+)<', page, re.S))
    assert shown == expected


def test_an_archived_delivered_changed_later_shows_the_stores_row(
    seeded: tuple[TestClient, Seeded, Store], tmp_path: Path
) -> None:
    client, _, store = seeded
    archived = seed_archived(store, tmp_path / "verdicts", NOW_MS)
    report = client.get(f"/api/v1/messages/{archived.changed}").json()
    hops = {h["hop"]: h for h in report["hops"]}
    stored = next(r for r in archived.sql if r["message_id"] == archived.changed)
    assert (hops[STORE_READ]["verdict"]["verdict"], hops[STORE_READ]["verdict"]["count"]) == (
        stored["verdict"],
        stored["count"],
    )
    assert [c["to_verdict"] for c in hops[STORE_READ]["history"]] == ["DUPLICATE"]
    assert {h["verdict"]["verdict"] for hop, h in hops.items() if hop != STORE_READ} == {"DELIVERED"}


def test_health_and_alert_apis_answer_from_the_store(seeded: tuple[TestClient, Seeded, Store]) -> None:
    client, data, store = seeded
    consumers = client.get("/api/v1/health/consumers").json()
    stalled = next(p for p in consumers["partitions"] if p["status"] == "STALL")
    assert (stalled["group"], stalled["lag"], stalled["time_lag_ms"]) == ("demo-sink-audit", 40, 180_000)
    assert stalled["evidence_from_ms"] == NOW_MS - 240_000 and "unchanged" in stalled["reason"]
    key = next(k for k in store.snapshots.histories("local", 0) if k.group == "demo-sink-audit")
    assert stalled["lag_history"] == [s.lag for s in store.snapshots.histories("local", 0)[key]] == [10, 25, 40]
    assert [w["kind"] for w in consumers["windows"]] == ["skip"]
    assert [t["to_status"] for t in consumers["transitions"]] == ["STALL"]
    unknown = client.get("/api/v1/health/consumers", params={"group": "nobody"})
    assert unknown.status_code == 400 and "demo-sink-audit" in unknown.json()["detail"]

    khipu = client.get("/api/v1/health/khipu").json()
    verdict_query = next(q for q in khipu["queries"] if q["query"] == DETECTOR_QUERY)
    newest = store.heartbeat.latest(DETECTOR_QUERY)
    assert newest is not None and verdict_query["batch_id"] == newest["batch_id"]
    assert verdict_query["age_s"] == pytest.approx((NOW_MS - newest["at_ms"]) / 1000) and not verdict_query["stale"]
    assert len(verdict_query["series"]) == len(store.heartbeat.series(DETECTOR_QUERY, NOW_MS - 3_600_000))
    assert khipu["quarantined"] == data.quarantined == 3
    stored = {(q["source_offset"], q["source_line"], q["reason"]) for q in store.channel.quarantined()}
    assert {(q["source_offset"], q["source_line"], q["reason"]) for q in khipu["quarantine"]} == stored
    assert {(offset, line) for offset, line, _ in stored} == {(77, 0), (77, 1), (78, 0)}  # a position has its line
    assert [(g["emitter_id"], g["missing"]) for g in khipu["emitters_with_gaps"]] == [("demo-enricher-e1", data.gaps)]

    alerts = client.get("/api/v1/alerts").json()
    assert [(a["state"], a["deliveries"]["webhook"]) for a in alerts] == [("firing", "HTTP 500 from the receiver")]
    assert client.get("/api/v1/alerts", params={"minutes": "-5"}).status_code == 400


def test_openapi_documents_every_endpoint(seeded: tuple[TestClient, Seeded, Store]) -> None:
    client, _, _ = seeded
    spec = client.get("/api/v1/openapi.json").json()
    paths = set(spec["paths"])
    documented = {"StreamOverview", "WindowFigures", "VerdictPage", "MessageReport", "HopLine", "TraceLine"}
    assert documented | {"ConsumerReport", "PartitionHealthLine", "KhipuHealth", "QueryBeat"} <= set(
        spec["components"]["schemas"]
    )
    assert paths == {
        "/api/v1/streams",
        "/api/v1/streams/{stream}/metrics",
        "/api/v1/verdicts",
        "/api/v1/messages/{message_id}",
        "/api/v1/health/consumers",
        "/api/v1/health/khipu",
        "/api/v1/alerts",
        "/api/v1/search",
        "/api/v1/at-risk",
    }


def test_pages_show_what_the_store_holds(seeded: tuple[TestClient, Seeded, Store]) -> None:
    client, data, _ = seeded
    overview = client.get("/").text
    registry = load_registry(ROOT / "config" / "registry.yaml")
    hops = sum(len(stream.route.hops) for stream in registry.streams.values())
    assert overview.count('class="spark"') == 2 * hops  # loss rate and p99 per hop of every stream
    lost = client.get("/lost").text
    assert f"/messages/{data.skipped}" in lost and "order_id=order-4711" in lost and "LOST → CONFIRMED_LOST" in lost
    message = client.get(f"/messages/{data.skipped}").text
    assert len(re.findall(r'data-trace="(SENT|RECEIVED)"', message)) == 4
    assert "STALL" in client.get("/consumers").text
    health = html.unescape(client.get("/self").text)
    assert "field 'timestamp_ms': expected an integer" in health
    assert {"khipu.traces[1]@77 line 0", "khipu.traces[1]@77 line 1", "khipu.traces[1]@78 line 0"} == set(
        re.findall(r'data-field="position">([^<]*)<', health)
    )
    assert "HTTP 500 from the receiver" in client.get("/alerts").text


def test_an_unreadable_store_answers_503_saying_so(tmp_path: Path) -> None:
    registry = load_registry(ROOT / "config" / "registry.yaml")
    never_migrated = f"sqlite:///{tmp_path / 'empty.db'}"
    empty = Store(never_migrated)
    sources = ViewSources(lambda: empty, lambda: registry, None, "local", lambda: NOW_MS)
    client = TestClient(create_app(sources, token_check, lambda n: n), headers={"Authorization": f"Bearer {TOKEN}"})
    answer = client.get("/api/v1/streams")
    assert answer.status_code == 503
    assert "never migrated" in answer.json()["detail"] and "khipu store migrate" in answer.json()["detail"]


def test_each_confirmed_loss_shows_its_resend_state_and_ledger(seeded: tuple[TestClient, Seeded, Store]) -> None:
    """The resend task's ledger as the view shows it: the lost page's last attempt, the message's every attempt."""
    from khipu.registry.model import TopicRef
    from khipu.resend.ledger import ledger_entry
    from khipu.resend.plan import Position, ResendPlan, SourceKind, resend_id
    from tests.viewdata import verdict

    client, _, store = seeded
    at = NOW_MS - 5 * 60_000
    store.verdicts.upsert(
        [
            verdict("view-resent-1", AUDIT_READ, "RESENT", at, cause="skipped_by_consumer", decided_by="detector"),
            verdict("view-gone-1", AUDIT_READ, "UNRECOVERABLE", at + 1, cause="expired", decided_by="resend"),
        ]
    )
    enriched = TopicRef("local", "demo.orders-enriched")
    for attempt, (landed, error) in enumerate([(None, "recovery hook raised"), ((1, 42), None)], 1):
        plan = ResendPlan(
            "view-resent-1", STREAM, AUDIT_READ, attempt, resend_id("view-resent-1", AUDIT_READ, attempt),
            SourceKind.TOPIC, Position("local", "demo.orders-enriched", 1, 7), enriched, "demo-sink-audit",
            "the skipped record -> demo.orders-enriched for demo-sink-audit only",
        )  # fmt: skip
        store.resends.record_intent(ledger_entry(plan, (1, 40)), at + attempt)
        if landed:
            store.resends.mark_produced(plan.resend_id, *landed, at + 10)
        else:
            store.resends.mark(plan.resend_id, "failed", at + 5, error)

    rows = client.get("/api/v1/verdicts", params={"stream": STREAM}).json()["rows"]
    resent = next(r for r in rows if r["message_id"] == "view-resent-1")  # listed with the losses by default
    assert [(e["attempt"], e["state"]) for e in resent["resends"]] == [(1, "failed"), (2, "produced")]
    assert {r["message_id"]: r["verdict"] for r in rows}["view-gone-1"] == "UNRECOVERABLE"

    lost = html.unescape(client.get("/lost").text)
    cell = re.search(r'data-message="view-resent-1".*?data-field="resend">(.*?)</td>', lost, re.S)
    assert cell is not None
    assert "attempt 2: produced → local/demo.orders-enriched[1]@42 for demo-sink-audit" in cell.group(1)

    page = html.unescape(client.get("/messages/view-resent-1").text)
    states = re.findall(r'data-field="state"[^>]*>(\w+)<', page)
    assert states == ["failed", "produced"] and "recovery hook raised" in page and "for demo-sink-audit only" in page
    api = client.get("/api/v1/messages/view-resent-1").json()
    assert [e["state"] for e in api["resends"]] == ["failed", "produced"]


class _AirflowSlowOnce:
    """The resend DAG's runs as Airflow's API would give them, but its first answer never comes (the API timing out
    under load, as the view's own client reports it). A fake: a real Airflow cannot be made to time out on one
    request at will; the real one behind the page is tested in a browser
    (tests/integration/view/test_view_resend.py)."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf, self.asked = conf, 0

    def trigger(self, request: Request, dag_id: str, conf: Any, note: str) -> str:
        raise AssertionError("nothing is triggered here")

    def run(self, request: Request, dag_id: str, run_id: str) -> Any:
        from khipu.report.resending import RunSeen
        from khipu_airflow.view.resending import ResendRefused

        self.asked += 1
        if self.asked == 1:
            raise ResendRefused(503, "Airflow's API did not answer (ReadTimeout: timed out)")
        state = "running" if self.asked == 2 else "success"
        result = {"summary": "1 would_resend", "outcomes": []} if state == "success" else None
        return RunSeen(run_id, state, self.conf, result, dag_id)


def test_a_followed_run_airflow_does_not_answer_for_is_still_followed(tmp_path: Path) -> None:
    """The page follows a resend run by reloading itself until it ends. When Airflow's API does not answer one of
    those reloads, the page says so and keeps reloading (before, it answered an error page with no reload: the
    person following the run was left on it)."""
    from khipu.report.resending import Loss, run_conf

    url = f"sqlite:///{tmp_path / 'khipu.db'}"
    store = Store(url)
    store.migrate()
    registry = load_registry(ROOT / "config" / "registry.yaml")
    data = seed(store, tmp_path / "archive", registry, NOW_MS)
    runs = _AirflowSlowOnce(run_conf(Loss(data.dropped, STREAM, ENRICH_WRITE), dry_run=True))
    sources = ViewSources(lambda: store, lambda: registry, tmp_path / "archive", "local", lambda: NOW_MS)
    app = create_app(sources, token_check, lambda n: n, resend_runs=runs)
    client = TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"})
    reloads = "location.reload()"

    pages = [client.get(f"/messages/{data.dropped}", params={"resend_run": "manual__1"}) for _ in range(3)]
    assert [page.status_code for page in pages] == [200, 200, 200]
    unread, running, ended = (page.text for page in pages)
    assert 'data-testid="resend-run-unread"' in unread and "did not answer (ReadTimeout" in unread
    assert reloads in unread and 'data-testid="resend-run"' not in unread  # still following, though not read
    assert 'data-state="running"' in running and reloads in running
    assert 'data-state="success"' in ended and reloads not in ended and "resend-run-unread" not in ended
    assert runs.asked == 3
