"""Each team's data is private on every surface of Airflow itself, not only in the Khipu view
(docs/view.md#airflows-own-surfaces).

A real Airflow (api-server, scheduler, dag-processor) runs every Khipu DAG of this checkout in the bundles
`khipu airflow-bundles` gives it, against the session's Kafka broker and a store holding two teams' streams
(tests/viewdata.py's demo.orders of team-demo, tests/teamsdata.py's demo.bursts of team-bursts). An admin triggers
each of Khipu's DAGs once (offset snapshots and threshold alerts, a demo burst of demo.bursts, resends, retention,
reconciliation, a backfill, the detector); each team's user triggers their team's resend DAG. Then every run's
conf, every task's XCom, log and rendered template, the audit log and the Asset events are listed as the admin,
and each is asked for again as each team's user: an answer is refused, or names none of the other team's streams,
topics, groups or message ids. The admin's answers name them (the surfaces are not empty).

Then the same Airflow database is served by an api-server whose auth manager has no teams and grants DAGs one by
one, as FAB grants ``DAG:<dag id>`` to roles (tests/integration/view/customviews_auth.py, KHIPU_VIEW_ACCESS
custom-views): the same questions, the same answers.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from khipu.access import EVERY_STREAM_RESOURCE, EVERY_STREAM_TEAM, resend_dag_of, team_resource
from khipu.localstack.airflow import StackUser
from khipu.localstack.broker import BrokerProcess
from khipu.registry.loader import load_registry
from khipu.store import Store
from tests.integration.view.airflowteams import RunningAirflow, airflow_with_teams
from tests.teamsdata import BURSTS_TEAM, ORDERS_TEAM, markers, seed_second_team
from tests.viewdata import seed

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
DAG_FILES = tuple(sorted((ROOT / "dags").glob("khipu_*.py")))
# user names hold no team's marker ("bursts-" is one): the answers that name the asker are not leaks
ORDERS_USER, BURSTS_USER, PLATFORM_USER = "olga", "rita", "pat"
USERS = (
    StackUser("admin", "admin"),
    StackUser(ORDERS_USER, "user", (ORDERS_TEAM,)),
    StackUser(BURSTS_USER, "user", (BURSTS_TEAM,)),
    StackUser(PLATFORM_USER, "viewer", (EVERY_STREAM_TEAM,)),
)
ORDERS_MARKERS = ("demo.orders", "demo-sink-", "demo-enricher", "demo-producer", "view-", "order-4711")
FINISHED = {"success", "failed"}
STARTED = {"success", "failed", "skipped", "upstream_failed", "up_for_retry", "removed"}
WAIT_S = 600


@dataclass
class Surfaces:
    airflow: RunningAirflow
    tokens: dict[str, str]
    foreign: dict[str, tuple[str, ...]]  # user -> the other team's markers
    paths: list[str]  # every surface, as the admin listed it
    admin_answers: dict[str, str]
    env: dict[str, str]  # Khipu's settings and connections

    def get(self, user: str, path: str) -> tuple[int, str]:
        request = urllib.request.Request(
            f"{self.airflow.base}{path}",
            headers={"Authorization": f"Bearer {self.tokens[user]}", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return int(answer.status), answer.read().decode(errors="replace")
        except urllib.error.HTTPError as refused:
            return refused.code, refused.read().decode(errors="replace")


def call(airflow: RunningAirflow, token: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{airflow.base}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Accept": "application/json"},
        method=method,
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return int(answer.status), json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode(errors="replace")


def trigger(airflow: RunningAirflow, token: str, dag_id: str, conf: dict[str, Any]) -> tuple[int, Any]:
    """Trigger a run; a 5xx (SQLite's metadata database locked by the scheduler a moment) is asked again."""
    for _ in range(5):
        status, answer = call(
            airflow, token, "POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf}
        )
        if status < 500:
            return status, answer
        time.sleep(3)
    return status, f"{answer}\n{airflow.log_tail()}"


def wait_for_dags(airflow: RunningAirflow, token: str, dag_ids: set[str]) -> None:
    deadline = time.monotonic() + 300
    while True:
        _, listed = call(airflow, token, "GET", "/api/v2/dags?limit=100")
        found = {d["dag_id"] for d in listed["dags"]} if isinstance(listed, dict) else set()
        if dag_ids <= found:
            return
        assert time.monotonic() < deadline, f"DAGs not parsed in 300 s: {sorted(dag_ids - found)}\n{airflow.log_tail()}"
        time.sleep(3)


def has_run(airflow: RunningAirflow, token: str, dag_id: str, run_id: str) -> bool:
    """The run ended, or each of its tasks that ran has a try behind it (a task waiting on a retry has its log)."""
    _, run = call(airflow, token, "GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}")
    if isinstance(run, dict) and run.get("state") in FINISHED:
        return True
    _, tis = call(airflow, token, "GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances")
    states = [ti.get("state") for ti in tis.get("task_instances", [])] if isinstance(tis, dict) else []
    return bool(states) and "up_for_retry" in states and not {"running", "queued", "scheduled"} & set(states)


def listed_surfaces(airflow: RunningAirflow, token: str) -> list[str]:
    """Every surface Airflow has of Khipu's DAGs, as the admin lists them: each DAG's details, each run (its conf),
    each task instance (its rendered template), each try's log, each XCom; the lists across DAGs; the audit log;
    the Asset events."""
    paths = [
        "/api/v2/dags?limit=100",
        "/api/v2/dags/~/dagRuns?limit=200",
        "/api/v2/dags/~/dagRuns/~/taskInstances?limit=500",
        "/api/v2/dags/~/dagRuns/~/taskInstances/~/xcomEntries?limit=500",
        "/api/v2/eventLogs?limit=500",
        "/api/v2/assets/events?limit=200",
        "/api/v2/assets?limit=100",
    ]
    _, dags = call(airflow, token, "GET", "/api/v2/dags?limit=100")
    for dag_id in sorted(d["dag_id"] for d in dags["dags"] if d["dag_id"].startswith("khipu")):
        base = f"/api/v2/dags/{dag_id}"
        paths += [f"{base}/details", f"{base}/dagRuns?limit=100"]
        _, runs = call(airflow, token, "GET", f"{base}/dagRuns?limit=100")
        for run in runs["dag_runs"]:
            run_path = f"{base}/dagRuns/{quote(run['dag_run_id'], safe='')}"
            paths += [run_path, f"{run_path}/taskInstances"]
            _, tis = call(airflow, token, "GET", f"{run_path}/taskInstances")
            for ti in tis["task_instances"]:
                ti_path = f"{run_path}/taskInstances/{ti['task_id']}"
                paths += [ti_path, f"{ti_path}/xcomEntries"]
                paths += [f"{ti_path}/logs/{n}?full_content=true" for n in range(1, int(ti.get("try_number") or 0) + 1)]
                _, xcoms = call(airflow, token, "GET", f"{ti_path}/xcomEntries")
                paths += [f"{ti_path}/xcomEntries/{quote(x['key'], safe='')}" for x in xcoms.get("xcom_entries", [])]
    return paths


@pytest.fixture(scope="module")
def surfaces(broker: BrokerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Surfaces]:
    work = tmp_path_factory.mktemp("airflow-surfaces")
    store_path = work / "khipu.db"
    store = Store(f"sqlite:///{store_path}")
    store.migrate()
    registry = load_registry(ROOT / "config" / "registry.yaml")
    now_ms = time.time_ns() // 1_000_000
    orders = seed(store, work / "state" / "archive", registry, now_ms)
    bursts = seed_second_team(store, work / "state" / "archive", registry, now_ms)
    store.close()
    env = {
        "KHIPU_STORE_URL": f"sqlite:///{store_path}",
        "KHIPU_STATE_DIR": str(work / "state"),
        "KHIPU_REGISTRY": str(ROOT / "config" / "registry.yaml"),
        "AIRFLOW_CONN_KHIPU_KAFKA": json.dumps(
            {"conn_type": "kafka", "extra": {"bootstrap.servers": broker.bootstrap_servers, "khipu.cluster": "local"}}
        ),
        "AIRFLOW_CONN_KHIPU_STORE": json.dumps({"conn_type": "sqlite", "host": str(store_path)}),
        # the detector DAG's restart fails at once, naming the binary, rather than starting Spark here
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(
            {"conn_type": "spark", "host": "local[1]", "extra": {"spark-binary": "not-spark-submit"}}
        ),
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", ""),
    }
    hour = time.strftime("%Y-%m-%dT%H:00:00+00:00", time.gmtime(now_ms / 1000 - 6 * 3600))
    later = time.strftime("%Y-%m-%dT%H:00:00+00:00", time.gmtime(now_ms / 1000 - 5 * 3600))
    by_admin = {
        "khipu_snapshot_offsets": {},
        "khipu_demo_burst": {"count": 40, "rate_per_s": 400, "faults": {"consumer_skip": 0.1, "processor_drop": 0.1}},
        "khipu_resend_manual": {"streams": ["demo.orders", "demo.bursts"]},  # a dry run
        "khipu_resend": {},
        "khipu_retention": {},
        "khipu_reconcile": {},
        "khipu_backfill": {"start": hour, "end": later, "streams": ["demo.bursts"], "dry_run": True},
        "khipu_detector": {},
    }
    by_team = {
        ORDERS_USER: (resend_dag_of(ORDERS_TEAM), {"streams": ["demo.orders"], "message_ids": [orders.dropped]}),
        BURSTS_USER: (resend_dag_of(BURSTS_TEAM), {"streams": ["demo.bursts"], "message_ids": [bursts.dropped]}),
    }
    with airflow_with_teams(work, USERS, env, dags=DAG_FILES) as airflow:
        tokens = {user.name: airflow.token(user.name) for user in USERS}
        wait_for_dags(airflow, tokens["admin"], {*by_admin, *(dag for dag, _ in by_team.values())})
        started: list[tuple[str, str]] = []
        for dag_id, conf in by_admin.items():
            status, run = trigger(airflow, tokens["admin"], dag_id, conf)
            assert status == 200, (dag_id, run)
            started.append((dag_id, run["dag_run_id"]))
        for user, (dag_id, conf) in by_team.items():
            other = next(d for u, (d, _) in by_team.items() if u != user)
            refused, _ = trigger(airflow, tokens[user], other, conf)
            assert refused in (403, 404), (user, other, refused)  # another team's DAG is not theirs to trigger
            for operators in ("khipu_resend_manual", "khipu_snapshot_offsets"):
                refused, _ = trigger(airflow, tokens[user], operators, {})
                assert refused in (403, 404), (user, operators, refused)
            status, run = trigger(airflow, tokens[user], dag_id, conf)
            assert status == 200, (user, dag_id, run)
            started.append((dag_id, run["dag_run_id"]))
        deadline = time.monotonic() + WAIT_S
        while not all(has_run(airflow, tokens["admin"], dag_id, run_id) for dag_id, run_id in started):
            assert time.monotonic() < deadline, f"runs not done in {WAIT_S} s: {started}\n{airflow.log_tail()}"
            time.sleep(5)
        paths = listed_surfaces(airflow, tokens["admin"])
        admin_answers = {path: _get(airflow, tokens["admin"], path) for path in paths}
        burst_ids = _burst_message_prefix(admin_answers)
        foreign = {
            ORDERS_USER: (*markers(bursts), burst_ids),
            BURSTS_USER: (*ORDERS_MARKERS, orders.dropped, orders.skipped, orders.retracted),
        }
        yield Surfaces(airflow, tokens, foreign, paths, admin_answers, env)


def _get(airflow: RunningAirflow, token: str, path: str) -> str:
    _, body = call(airflow, token, "GET", path)
    return body if isinstance(body, str) else json.dumps(body)


def _burst_message_prefix(answers: dict[str, str]) -> str:
    """The burst's own run id (its message ids start with it), from its task's return value as the admin reads it."""
    for path, body in answers.items():
        if "khipu_demo_burst" in path and path.endswith("/xcomEntries/return_value"):
            value = json.loads(body)["value"]
            value = json.loads(value) if isinstance(value, str) else value
            return str(value["run_id"])
    raise AssertionError("the demo burst returned nothing")


@pytest.mark.parametrize("user", [ORDERS_USER, BURSTS_USER])
def test_no_airflow_surface_shows_a_team_the_other_teams_stream_data(surfaces: Surfaces, user: str) -> None:
    foreign = surfaces.foreign[user]
    leaks = []
    for path in surfaces.paths:
        status, body = surfaces.get(user, path)
        assert status < 500, (path, status, body[:300])
        named = [marker for marker in foreign if marker in body]
        if status < 400 and named:
            leaks.append((path, named[:3]))
    assert leaks == []


def test_the_surfaces_are_not_empty_the_admin_reads_each_teams_data_there(surfaces: Surfaces) -> None:
    """What the teams' users were refused is there: the admin's answers name both teams' streams and messages, in
    run confs, XComs and task logs."""
    for user, foreign in surfaces.foreign.items():
        kinds = {
            kind
            for path, body in surfaces.admin_answers.items()
            for kind in ("/logs/", "/xcomEntries/", "/dagRuns/")
            if kind in path and any(marker in body for marker in foreign)
        }
        assert kinds == {"/logs/", "/xcomEntries/", "/dagRuns/"}, user


def test_each_team_reads_its_own_resend_run_and_an_every_stream_member_khipus_own_dags(surfaces: Surfaces) -> None:
    for user, team in ((ORDERS_USER, ORDERS_TEAM), (BURSTS_USER, BURSTS_TEAM)):
        status, runs = surfaces.get(user, f"/api/v2/dags/{resend_dag_of(team)}/dagRuns")
        assert status == 200 and len(json.loads(runs)["dag_runs"]) == 1, (user, runs[:300])
        status, listed = surfaces.get(user, "/api/v2/dags?limit=100")
        assert [d["dag_id"] for d in json.loads(listed)["dags"]] == [resend_dag_of(team)]
    status, listed = surfaces.get(PLATFORM_USER, "/api/v2/dags?limit=100")
    seen = {d["dag_id"] for d in json.loads(listed)["dags"]}
    assert seen == {path.stem for path in DAG_FILES}  # Khipu's own, no team's resend DAG


def test_asset_events_name_no_stream_for_anyone(surfaces: Surfaces) -> None:
    for user in (ORDERS_USER, BURSTS_USER, PLATFORM_USER):
        status, body = surfaces.get(user, "/api/v2/assets/events?limit=200")
        assert status == 200
        assert [m for m in (*ORDERS_MARKERS, *surfaces.foreign[ORDERS_USER]) if m in body] == []


CUSTOM_USERS = (
    StackUser("admin", "admin"),
    StackUser(ORDERS_USER, "user"),
    StackUser(BURSTS_USER, "user"),
    StackUser(PLATFORM_USER, "viewer"),
)


def test_with_an_auth_manager_granting_dags_one_by_one_as_fab_does_the_same_holds(
    surfaces: Surfaces, tmp_path: Path
) -> None:
    """KHIPU_VIEW_ACCESS=custom-views, no Airflow teams: each team's role is granted its team's custom view and its
    resend DAG (``DAG:khipu_resend_manual__<team>``), the operators' role every stream and Khipu's own DAGs
    (docs/view.md#airflows-own-surfaces). Served from the same database the DAGs ran in."""
    own = [path.stem for path in DAG_FILES]
    grants = {
        ORDERS_USER: [team_resource(ORDERS_TEAM)],
        BURSTS_USER: [team_resource(BURSTS_TEAM)],
        PLATFORM_USER: [EVERY_STREAM_RESOURCE],
    }
    dags = {ORDERS_USER: [resend_dag_of(ORDERS_TEAM)], BURSTS_USER: [resend_dag_of(BURSTS_TEAM)], PLATFORM_USER: own}
    env = {
        **surfaces.env,
        "PYTHONPATH": str(ROOT),  # the api-server imports the auth manager from tests/
        "AIRFLOW__CORE__AUTH_MANAGER": "tests.integration.view.customviews_auth.CustomViewsAuthManager",
        "AIRFLOW__CORE__MULTI_TEAM": "False",
        "KHIPU_VIEW_ACCESS": "custom-views",
        "KHIPU_TEST_CUSTOM_VIEWS": json.dumps(grants),
        "KHIPU_TEST_DAGS": json.dumps(dags),
    }
    with airflow_with_teams(tmp_path, CUSTOM_USERS, env, home=surfaces.airflow.home) as airflow:
        tokens = {user.name: airflow.token(user.name) for user in CUSTOM_USERS}
        served = Surfaces(airflow, tokens, surfaces.foreign, surfaces.paths, surfaces.admin_answers, env)
        for user in (ORDERS_USER, BURSTS_USER):
            test_no_airflow_surface_shows_a_team_the_other_teams_stream_data(served, user)
        test_each_team_reads_its_own_resend_run_and_an_every_stream_member_khipus_own_dags(served)
        status, listed = served.get(ORDERS_USER, "/khipu/api/v1/streams")
        assert status == 200 and {s["stream"] for s in json.loads(listed)} == {"demo.orders"}  # and the view agrees
