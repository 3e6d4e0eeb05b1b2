"""``KHIPU_VIEW_ACCESS=custom-views``: the view asks an auth manager without Airflow's teams for custom views, as a
deployment with the FAB auth manager does (docs/view.md#who-sees-which-streams). Airflow's api-server runs an
auth manager whose custom views are granted per user as FAB grants permissions to roles
(tests/integration/view/customviews_auth.py); the store holds two teams' streams. A user granted
``Khipu team team-demo`` sees that team's stream only, one granted ``Khipu every stream`` sees both, one granted
nothing sees none; with ``KHIPU_VIEW_ACCESS=teams`` the same auth manager cannot answer, and every page and API
call says so (503), showing nothing.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from khipu.access import EVERY_STREAM_RESOURCE, team_resource
from khipu.localstack.airflow import StackUser
from khipu.registry.loader import load_registry
from khipu.store import Store
from tests.integration.view.airflowteams import RunningAirflow, airflow_with_teams
from tests.teamsdata import BURSTS, ORDERS_TEAM, seed_second_team
from tests.viewdata import STREAM, seed

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
USERS = (
    StackUser("admin", "admin"),
    StackUser("orders-reader", "viewer"),
    StackUser("platform", "viewer"),
    StackUser("plain", "viewer"),
)
GRANTS = {
    "admin": [EVERY_STREAM_RESOURCE],  # as `airflow roles add-perms Admin -r "Khipu every stream" -a can_read`
    "orders-reader": [team_resource(ORDERS_TEAM)],
    "platform": [EVERY_STREAM_RESOURCE],
    "plain": ["Khipu team team-nobody-owns"],
}


@pytest.fixture(scope="module")
def store_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    work = tmp_path_factory.mktemp("custom-views-store")
    url = f"sqlite:///{work / 'khipu.db'}"
    store = Store(url)
    store.migrate()
    registry = load_registry(ROOT / "config" / "registry.yaml")
    now_ms = time.time_ns() // 1_000_000
    seed(store, work / "state" / "archive", registry, now_ms)
    seed_second_team(store, work / "state" / "archive", registry, now_ms)
    store.close()
    return {
        "KHIPU_STORE_URL": url,
        "KHIPU_STATE_DIR": str(work / "state"),
        "PYTHONPATH": str(ROOT),  # the api-server imports the auth manager from tests/
        "AIRFLOW__CORE__AUTH_MANAGER": "tests.integration.view.customviews_auth.CustomViewsAuthManager",
        "AIRFLOW__CORE__MULTI_TEAM": "False",
        "KHIPU_TEST_CUSTOM_VIEWS": json.dumps(GRANTS),
    }


@pytest.fixture(scope="module")
def custom_views(store_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAirflow]:
    work = tmp_path_factory.mktemp("custom-views")
    with airflow_with_teams(work, USERS, {**store_env, "KHIPU_VIEW_ACCESS": "custom-views"}) as airflow:
        yield airflow


def ask(airflow: RunningAirflow, user: str, path: str) -> tuple[int, str]:
    request = urllib.request.Request(
        f"{airflow.base}/khipu{path}", headers={"Authorization": f"Bearer {airflow.token(user)}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


@pytest.mark.parametrize(
    ("user", "streams"),
    [("orders-reader", {STREAM}), ("platform", {STREAM, BURSTS}), ("admin", {STREAM, BURSTS}), ("plain", set())],
)
def test_custom_views_say_which_teams_streams_a_user_sees(
    custom_views: RunningAirflow, user: str, streams: set[str]
) -> None:
    status, body = ask(custom_views, user, "/api/v1/streams")
    assert status == 200 and {s["stream"] for s in json.loads(body)} == streams
    status, body = ask(custom_views, user, "/api/v1/verdicts")
    assert {row["stream"] for row in json.loads(body)["rows"]} == streams
    status, _ = ask(custom_views, user, "/api/v1/messages/bursts-drop-1")
    assert status == (200 if BURSTS in streams else 404)


def test_an_auth_manager_without_teams_asked_for_teams_shows_nothing_and_says_why(
    store_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    work = tmp_path_factory.mktemp("teams-without-teams")
    with airflow_with_teams(work, USERS, {**store_env, "KHIPU_VIEW_ACCESS": "teams"}) as airflow:
        for path in ("/api/v1/streams", "/", "/messages/view-drop-1"):
            status, body = ask(airflow, "admin", path)
            assert status == 503, (path, body[:300])
            assert "CustomViewsAuthManager has no Airflow teams: set KHIPU_VIEW_ACCESS=custom-views" in body
            assert "view-drop-1" not in body.replace("/messages/view-drop-1", "") and STREAM not in body
