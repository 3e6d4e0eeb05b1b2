"""Each team sees its own streams, on every route of the view's app, over a real SQLite store and archive holding
two teams' streams (tests/viewdata.py's demo.orders of team-demo, tests/teamsdata.py's demo.bursts of team-bursts).

Here what the auth manager said of a person arrives as a :class:`khipu.access.Viewer` picked by a token of the
test's own: what is tested is what the app shows each of them, route by route, including routes added after these
tests were written (the routes come from the app). Real Airflow users, from the SimpleAuthManager in multi-team
mode, are in tests/integration/view/test_view_teams.py.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import pytest
from fastapi import HTTPException, Request
from fastapi.testclient import TestClient

from khipu.access import Viewer
from khipu.registry.loader import load_registry
from khipu.registry.model import Registry
from khipu.store import Store
from khipu_airflow.view.app import ViewSources, create_app
from tests.teamsdata import BURSTS, BURSTS_TEAM, ORDERS_TEAM, SecondTeam, markers, seed_second_team
from tests.teamsdata import ENRICH_WRITE as BURSTS_ENRICH_WRITE
from tests.viewaccess import Foreign, first_dependency_is_the_caller_scope, leaked, probes, routes_of
from tests.viewdata import AUDIT_READ, STREAM, Seeded, seed

ROOT = Path(__file__).resolve().parents[3]
NOW_MS = 1_795_000_000_000
VIEWERS = {
    "orders-token": Viewer("orders-user", frozenset({ORDERS_TEAM})),
    "bursts-token": Viewer("bursts-user", frozenset({BURSTS_TEAM})),
    "both-token": Viewer("both-teams", frozenset({ORDERS_TEAM, BURSTS_TEAM})),
    "admin-token": Viewer("admin", every_stream=True),
    "nobody-token": Viewer("nobody"),
}


async def token_check(request: Request) -> Any:
    token = request.headers.get("authorization", "").removeprefix("Bearer ")
    if token not in VIEWERS:
        raise HTTPException(status_code=401, detail="Not authenticated")
    return token


def viewer_of(user: Any, _registry: Registry) -> Viewer:
    return VIEWERS[str(user)]


@pytest.fixture
def two_teams(tmp_path: Path) -> tuple[TestClient, Seeded, SecondTeam]:
    url = f"sqlite:///{tmp_path / 'khipu.db'}"
    store = Store(url)
    store.migrate()
    registry = load_registry(ROOT / "config" / "registry.yaml")
    orders = seed(store, tmp_path / "archive", registry, NOW_MS)
    bursts = seed_second_team(store, tmp_path / "archive", registry, NOW_MS)
    view_store = Store(url)
    sources = ViewSources(
        store=lambda: view_store,
        load_registry=lambda: registry,
        archive_dir=tmp_path / "archive",
        cluster="local",
        now_ms=lambda: NOW_MS,
        verdict_archive_dir=tmp_path / "verdicts",
    )
    app = create_app(sources, token_check, lambda next_url: f"/auth/login?next={next_url}", viewer_of)
    return TestClient(app), orders, bursts


def as_(client: TestClient, token: str) -> TestClient:
    return TestClient(  # with the Origin a browser sends with a POST (khipu_airflow.view.guard)
        client.app, headers={"Authorization": f"Bearer {token}", "Origin": "http://testserver"}, follow_redirects=False
    )


def bursts_foreign(team: SecondTeam) -> Foreign:
    return Foreign(
        stream=BURSTS,
        message_ids=(team.dropped, team.skipped),
        hop=BURSTS_ENRICH_WRITE,
        group=team.stalled.group,
        attribute="order_id=bursts-9001",
        markers=markers(team),
    )


def orders_foreign(data: Seeded) -> Foreign:
    return Foreign(
        stream=STREAM,
        message_ids=(data.dropped, data.skipped),
        hop=AUDIT_READ,
        group="demo-sink-audit",
        attribute=f"order_id={data.order_id}",
        markers=(
            "demo.orders",
            "demo-sink-",
            "demo-enricher",
            "demo-producer",
            data.order_id,
            data.dropped,
            data.skipped,
            data.retracted,
            data.duplicated,
        ),
    )


def test_every_route_goes_first_through_the_callers_scope(two_teams: tuple[TestClient, Seeded, SecondTeam]) -> None:
    """The app's own dependency runs before anything of a route's, on every route the app has: none can skip the
    login or read another registry than the one its caller sees."""
    client, _, _ = two_teams
    routes = routes_of(client.app)  # type: ignore[arg-type]
    assert len(routes) >= 19  # the 10 API answers, 8 pages and the resend of issue 21; more may come
    assert [route.path for route in routes if not first_dependency_is_the_caller_scope(route)] == []


def test_the_route_check_above_can_fail() -> None:
    """A route the probe did not find the caller scope on is reported (an app built without it)."""
    from fastapi import FastAPI

    bare = FastAPI()

    @bare.get("/x")
    def x() -> str:
        return "x"

    assert [r.path for r in routes_of(bare) if not first_dependency_is_the_caller_scope(r)] == ["/x"]


@pytest.mark.parametrize(("token", "other"), [("orders-token", "bursts"), ("bursts-token", "orders")])
def test_every_route_asked_about_the_other_teams_things_shows_none_of_them(
    two_teams: tuple[TestClient, Seeded, SecondTeam], token: str, other: str
) -> None:
    client, orders, bursts = two_teams
    foreign = bursts_foreign(bursts) if other == "bursts" else orders_foreign(orders)
    user = as_(client, token)
    answered = 0
    for probe in probes(client.app, foreign):  # type: ignore[arg-type]
        answer = user.request(probe.method, probe.path, data=probe.form or None)
        body = html.unescape(answer.text)
        assert answer.status_code < 500, (probe, answer.status_code, body[:300])
        assert leaked(probe, body, foreign) == [], (probe, answer.status_code)
        if probe.names_foreign_in_path:  # another team's stream or message: as one that does not exist
            assert answer.status_code == 404, (probe, answer.status_code, body[:300])
        answered += 1
    assert answered > len(routes_of(client.app))  # type: ignore[arg-type]  # every route, some several times


def test_another_teams_stream_and_message_answer_as_ones_that_do_not_exist(
    two_teams: tuple[TestClient, Seeded, SecondTeam],
) -> None:
    client, _, bursts = two_teams
    user = as_(client, "orders-token")
    for known, unknown in (
        (f"/api/v1/messages/{bursts.dropped}", "/api/v1/messages/never-seen-1"),
        (f"/messages/{bursts.dropped}", "/messages/never-seen-1"),
        (f"/api/v1/streams/{BURSTS}/metrics", "/api/v1/streams/no.such.stream/metrics"),
        (f"/api/v1/verdicts?stream={BURSTS}", "/api/v1/verdicts?stream=no.such.stream"),
    ):
        theirs, nothing = user.get(known), user.get(unknown)
        assert (theirs.status_code, nothing.status_code) == (404, 404), known
        assert theirs.text.replace(BURSTS, "X").replace(bursts.dropped, "Y") == nothing.text.replace(
            "no.such.stream", "X"
        ).replace("never-seen-1", "Y")


def test_each_team_sees_its_own_stream_and_an_admin_sees_both(
    two_teams: tuple[TestClient, Seeded, SecondTeam],
) -> None:
    client, orders, bursts = two_teams
    for token, streams in (
        ("orders-token", {STREAM}),
        ("bursts-token", {BURSTS}),
        ("both-token", {STREAM, BURSTS}),
        ("admin-token", {STREAM, BURSTS}),
        ("nobody-token", set()),
    ):
        user = as_(client, token)
        assert {s["stream"] for s in user.get("/api/v1/streams").json()} == streams, token
        losses = {row["stream"] for row in user.get("/api/v1/verdicts").json()["rows"]}
        assert losses == streams, token
        alerts = user.get("/api/v1/alerts").json()
        assert {a["details"].get("stream") for a in alerts if "stream" in a["details"]} == streams, token
        groups = {p["group"] for p in user.get("/api/v1/health/consumers").json()["partitions"]}
        assert groups == {
            g
            for g, s in (
                ("demo-sink-store", STREAM),
                ("demo-sink-audit", STREAM),
                ("demo-burst-sink-audit", BURSTS),
            )
            if s in streams
        }, token
        gaps = {g["location"] for g in user.get("/api/v1/health/khipu").json()["emitters_with_gaps"]}
        assert gaps == {loc for loc, s in (("demo-enricher", STREAM), ("demo-burst-enricher", BURSTS)) if s in streams}
        for message_id, stream in ((orders.dropped, STREAM), (bursts.dropped, BURSTS)):
            status = user.get(f"/api/v1/messages/{message_id}").status_code
            assert status == (200 if stream in streams else 404), (token, message_id)
        page = html.unescape(user.get("/").text)
        assert {name for name in (STREAM, BURSTS) if f'data-stream="{name}"' in page} == streams, token


def test_a_page_names_who_is_asking_and_their_teams(two_teams: tuple[TestClient, Seeded, SecondTeam]) -> None:
    client, _, _ = two_teams
    shown = html.unescape(as_(client, "bursts-token").get("/alerts").text)
    assert "bursts-user ·\n    team-bursts" in shown


def test_without_a_login_the_resend_route_sends_to_the_login_too(
    two_teams: tuple[TestClient, Seeded, SecondTeam],
) -> None:
    client, orders, _ = two_teams
    anonymous = TestClient(client.app, headers={"Origin": "http://testserver"}, follow_redirects=False)
    answer = anonymous.post(f"/messages/{orders.dropped}/resend", data={"hop": "x"})
    assert answer.status_code == 303 and answer.headers["location"].startswith("/auth/login?next=")
