"""Each team sees its own streams, with real Airflow users: Airflow's api-server in multi-team mode, the
SimpleAuthManager's users in Airflow's teams, this checkout's plugin asking Airflow's auth manager.

The store holds two teams' streams (tests/viewdata.py's demo.orders of team-demo, tests/teamsdata.py's
demo.bursts of team-bursts; config/registry.yaml names the owners). Every route of the view's app (listed from
the app, so routes added later are asked too) is asked about the other team's stream, messages, hop, group and
recovery attribute, with each team's user's own Airflow token; an admin, and a member of the every-stream team,
see both. Then a team's user logs in with Chromium and sees their stream only.
"""

from __future__ import annotations

import html
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import pytest
from playwright.sync_api import Browser

from khipu.access import EVERY_STREAM_TEAM
from khipu.localstack.airflow import StackUser
from khipu.registry.loader import load_registry
from khipu.store import Store
from khipu_airflow.view.app import ViewSources, create_app
from tests.integration.view.airflowteams import RunningAirflow, airflow_with_teams
from tests.teamsdata import BURSTS, BURSTS_TEAM, ORDERS_TEAM, SecondTeam, markers, seed_second_team
from tests.teamsdata import ENRICH_WRITE as BURSTS_ENRICH_WRITE
from tests.viewaccess import Foreign, Probe, leaked, probes
from tests.viewdata import AUDIT_READ, STREAM, Seeded, seed

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
ORDERS_USER, BURSTS_USER, PLATFORM_USER, NO_TEAM_USER = "orders-owner", "bursts-owner", "platform", "no-team"
USERS = (
    StackUser("admin", "admin"),
    StackUser(ORDERS_USER, "user", (ORDERS_TEAM,)),
    StackUser(BURSTS_USER, "viewer", (BURSTS_TEAM,)),
    StackUser(PLATFORM_USER, "viewer", (EVERY_STREAM_TEAM,)),
    StackUser(NO_TEAM_USER, "viewer"),
)


@dataclass
class Served:
    airflow: RunningAirflow
    orders: Seeded
    bursts: SecondTeam
    tokens: dict[str, str]

    def ask(self, user: str, method: str, path: str, form: dict[str, str] | None = None) -> tuple[int, str]:
        data = urlencode(form).encode() if form else None
        headers = {"Authorization": f"Bearer {self.tokens[user]}"}
        if data is not None:  # a POST: with the Origin the view's own page sends (khipu_airflow.view.guard)
            headers.update({"Content-Type": "application/x-www-form-urlencoded", "Origin": self.airflow.base})
        request = urllib.request.Request(f"{self.airflow.base}/khipu{path}", data=data, headers=headers, method=method)
        opener = urllib.request.build_opener(_NoRedirect())
        try:
            with opener.open(request, timeout=60) as answer:
                return int(answer.status), html.unescape(answer.read().decode())
        except urllib.error.HTTPError as refused:
            return refused.code, html.unescape(refused.read().decode())


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    work = tmp_path_factory.mktemp("teams")
    store_url = f"sqlite:///{work / 'khipu.db'}"
    store = Store(store_url)
    store.migrate()
    registry = load_registry(ROOT / "config" / "registry.yaml")
    now_ms = _now_ms()
    orders = seed(store, work / "state" / "archive", registry, now_ms)
    bursts = seed_second_team(store, work / "state" / "archive", registry, now_ms)
    store.close()
    env = {"KHIPU_STORE_URL": store_url, "KHIPU_STATE_DIR": str(work / "state")}
    with airflow_with_teams(work, USERS, env) as airflow:
        yield Served(airflow, orders, bursts, {user.name: airflow.token(user.name) for user in USERS})


def the_apps_routes_probed(foreign: Foreign) -> list[Probe]:
    """Every route of the view's app, from the app itself (its sources are never read here), asked about
    ``foreign``."""
    registry = load_registry(ROOT / "config" / "registry.yaml")
    app = create_app(ViewSources(lambda: None, lambda: registry, None, "local"), _never, lambda _: "/")  # type: ignore[arg-type, return-value]
    return list(probes(app, foreign))


async def _never(_request: object) -> object:
    raise AssertionError("the route table is only read")


def bursts_foreign(team: SecondTeam) -> Foreign:
    return Foreign(BURSTS, (team.dropped, team.skipped), BURSTS_ENRICH_WRITE, team.stalled.group,
                   "order_id=bursts-9001", markers(team))  # fmt: skip


def orders_foreign(data: Seeded) -> Foreign:
    marks = ("demo.orders", "demo-sink-", "demo-producer", data.order_id, data.dropped, data.skipped, data.retracted)
    return Foreign(STREAM, (data.dropped, data.skipped), AUDIT_READ, "demo-sink-audit", f"order_id={data.order_id}",
                   marks)  # fmt: skip


@pytest.mark.parametrize(("user", "other"), [(ORDERS_USER, "bursts"), (BURSTS_USER, "orders")])
def test_a_teams_user_gets_nothing_of_the_other_teams_on_any_route(served: Served, user: str, other: str) -> None:
    foreign = bursts_foreign(served.bursts) if other == "bursts" else orders_foreign(served.orders)
    asked = the_apps_routes_probed(foreign)
    for probe in asked:
        status, body = served.ask(user, probe.method, probe.path, probe.form or None)
        assert status < 500, (probe, status, body[:400])
        assert leaked(probe, body, foreign) == [], (probe, status)
        if probe.names_foreign_in_path:  # the other team's stream or message: 404, as one that does not exist
            assert status == 404, (probe, status, body[:400])
    assert {p.path.split("?")[0] for p in asked} >= {f"/messages/{foreign.message_ids[0]}", "/api/v1/verdicts"}


def test_another_teams_message_answers_as_a_message_that_does_not_exist(served: Served) -> None:
    theirs = served.ask(ORDERS_USER, "GET", f"/api/v1/messages/{served.bursts.dropped}")
    nothing = served.ask(ORDERS_USER, "GET", "/api/v1/messages/never-seen-0")
    assert theirs[0] == nothing[0] == 404
    assert theirs[1].replace(served.bursts.dropped, "X") == nothing[1].replace("never-seen-0", "X")
    page, unknown = (served.ask(ORDERS_USER, "GET", f"/messages/{m}") for m in (served.bursts.dropped, "never-seen-0"))
    assert page[0] == unknown[0] == 404
    resend = served.ask(ORDERS_USER, "POST", f"/messages/{served.bursts.dropped}/resend", {"hop": BURSTS_ENRICH_WRITE})
    assert resend[0] == 404  # may trigger DAGs (role user), but not about another team's message


@pytest.mark.parametrize(
    ("user", "streams"),
    [
        (ORDERS_USER, {STREAM}),
        (BURSTS_USER, {BURSTS}),
        ("admin", {STREAM, BURSTS}),
        (PLATFORM_USER, {STREAM, BURSTS}),
        (NO_TEAM_USER, set()),
    ],
)
def test_each_user_sees_the_streams_of_their_teams_and_an_admin_every_stream(
    served: Served, user: str, streams: set[str]
) -> None:
    status, body = served.ask(user, "GET", "/api/v1/streams")
    assert status == 200 and {s["stream"] for s in json.loads(body)} == streams
    status, body = served.ask(user, "GET", "/api/v1/verdicts")
    assert {row["stream"] for row in json.loads(body)["rows"]} == streams
    for message_id, stream in ((served.orders.dropped, STREAM), (served.bursts.dropped, BURSTS)):
        status, _ = served.ask(user, "GET", f"/api/v1/messages/{message_id}")
        assert status == (200 if stream in streams else 404), message_id
    status, body = served.ask(user, "GET", f"/api/v1/search?{urlencode({'q': 'order_id=bursts-9001'})}")
    if streams:  # the attribute is declared by the streams they see: found in theirs only
        found = [m["message_id"] for m in json.loads(body)["messages"]]
        assert (status, found) == (200, [served.bursts.skipped] if BURSTS in streams else [])
    else:  # no stream of theirs declares it
        assert status == 400 and "(none declared)" in body
    _, body = served.ask(user, "GET", "/lost")
    shown = {name for name in (STREAM, BURSTS) if f'<option value="{name}"' in body or f">{name}<" in body}
    assert shown == streams


def test_the_resend_button_is_for_whoever_may_trigger_the_dag_and_sees_the_stream(served: Served) -> None:
    _, page = served.ask(ORDERS_USER, "GET", f"/messages/{served.orders.dropped}")
    assert 'data-testid="dry-run"' in page  # role user in the stream's team
    _, page = served.ask(BURSTS_USER, "GET", f"/messages/{served.bursts.dropped}")
    assert 'data-testid="dry-run"' not in page
    assert "you may not trigger the DAG khipu_resend_manual__team-bursts" in page
    status, body = served.ask(BURSTS_USER, "POST", f"/messages/{served.bursts.dropped}/resend",
                              {"hop": BURSTS_ENRICH_WRITE})  # fmt: skip
    assert status == 403 and "you may not trigger the DAG khipu_resend_manual__team-bursts" in body


def test_a_second_user_in_another_team_logs_in_and_sees_only_their_stream(
    served: Served, browser: Browser, shots: Path
) -> None:
    page = browser.new_page(viewport={"width": 1500, "height": 950})
    try:
        target = f"{served.airflow.base}/khipu/"
        page.goto(target)
        page.wait_for_url("**/auth/login**")
        page.get_by_label("Username").fill(BURSTS_USER)
        page.get_by_label("Password").fill(served.airflow.password(BURSTS_USER))
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(target, timeout=30_000)
        page.get_by_role("heading", name="Streams").wait_for()
        assert page.locator("[data-stream]").evaluate_all("els => [...new Set(els.map(e => e.dataset.stream))]") == [
            BURSTS
        ]
        assert page.get_by_test_id("viewer").inner_text().split() == [BURSTS_USER, "·", BURSTS_TEAM]
        page.screenshot(path=str(shots / "streams-team-bursts.png"), full_page=True)
        page.goto(f"{served.airflow.base}/khipu/lost")
        shown = page.locator("tr[data-message]").evaluate_all("rows => rows.map(r => r.dataset.message)")
        assert shown == [served.bursts.skipped, served.bursts.dropped]  # newest first: only team-bursts' losses
        page.goto(f"{served.airflow.base}/khipu/messages/{served.orders.dropped}")
        assert "no verdict and no archived trace" in page.get_by_test_id("problem").inner_text()
    finally:
        page.close()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *_args: object, **_kwargs: object) -> None:
        return None
