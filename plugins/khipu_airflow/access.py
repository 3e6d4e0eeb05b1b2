"""The Khipu view's questions to Airflow: what the auth manager says of the person asking, and the manual resend
DAG's runs, triggered and read through Airflow's own API as that person.

**Which streams** (``KHIPU_VIEW_ACCESS``, docs/view.md#who-sees-which-streams). A stream's ``owner`` names a team.

- ``teams`` (the default): Airflow's teams. The person is in the teams the auth manager authorizes for them
  (``filter_authorized_teams``, which asks ``is_authorized_team`` per team): with the SimpleAuthManager in
  multi-team mode, the teams listed with the user in ``[core] simple_auth_manager_users``, and every team for
  its admins. Whoever is in the team ``khipu-every-stream`` sees every stream: Airflow's admins are.
- ``custom-views``: for auth managers without teams (FAB's): a custom view per team,
  ``is_authorized_custom_view(method="GET", resource_name="Khipu team <owner>")``, and one for every stream,
  ``"Khipu every stream"``. (The SimpleAuthManager grants every custom view to every user: not this mode.)

**The resend button** is for whoever may trigger runs of the stream's team's manual resend DAG
(``khipu_resend_manual__<team>``, :mod:`khipu.access.dags`), or, for whoever sees every stream, of
``khipu_resend_manual``: ``is_authorized_dag(method="POST", access_entity=RUN)`` on it, as Airflow's own trigger
endpoint asks. The trigger itself goes through that
endpoint with the person's own token, so Airflow checks it again, logs it, and names them as the run's trigger.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import httpx
from fastapi import Request

from khipu.access import (
    EVERY_STREAM_RESOURCE,
    EVERY_STREAM_TEAM,
    MANUAL_DAG,
    AccessUnanswered,
    Viewer,
    resend_dag_of,
    team_resource,
)
from khipu.report.resending import RESEND_TASK, RunSeen
from khipu_airflow.view.resending import ResendRefused

TEAMS, CUSTOM_VIEWS = "teams", "custom-views"
API_TIMEOUT_S = 10.0


def airflow_viewer(user: Any, owners: Collection[str], mode: str) -> Viewer:
    """What the auth manager says of ``user``: which of ``owners`` (the registry's teams) they are in, whether they
    see every stream, whether they may trigger the manual resend DAG."""
    from airflow.api_fastapi.app import get_auth_manager

    manager = get_auth_manager()
    every_stream = False
    if mode == TEAMS:
        try:
            found = manager.filter_authorized_teams(teams_names={*owners, EVERY_STREAM_TEAM}, user=user, method="GET")
        except NotImplementedError:
            raise AccessUnanswered(
                f"KHIPU_VIEW_ACCESS is {TEAMS!r}, but {type(manager).__name__} has no Airflow teams: set "
                f"KHIPU_VIEW_ACCESS={CUSTOM_VIEWS} and grant the custom views (docs/view.md#who-sees-which-streams)"
            ) from None
        every_stream, teams = EVERY_STREAM_TEAM in found, set(found) & set(owners)
    else:
        every_stream = bool(
            manager.is_authorized_custom_view(method="GET", resource_name=EVERY_STREAM_RESOURCE, user=user)
        )
        teams = {
            owner
            for owner in owners
            if manager.is_authorized_custom_view(method="GET", resource_name=team_resource(owner), user=user)
        }
    seen = set(owners) if every_stream else teams
    return Viewer(
        name=str(user.get_name()),
        teams=frozenset(teams),
        every_stream=every_stream,
        resend_dags=triggerable_dags(user, {MANUAL_DAG, *(resend_dag_of(owner) for owner in seen)}),
    )


def triggerable_dags(user: Any, dag_ids: Collection[str]) -> frozenset[str]:
    """Which of ``dag_ids`` ``user`` may trigger runs of: the question Airflow's trigger endpoint asks
    (``is_authorized_dag(method="POST", access_entity=RUN)``), with each DAG's team (its bundle's). A DAG Airflow
    does not have is asked about as one of no team; triggering it, Airflow answers that it does not exist."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
    from airflow.models.dag import DagModel

    teams = DagModel.get_dag_id_to_team_name_mapping(sorted(dag_ids))  # one query
    manager = get_auth_manager()
    return frozenset(
        dag_id
        for dag_id in dag_ids
        if manager.is_authorized_dag(
            method="POST",
            access_entity=DagAccessEntity.RUN,
            details=DagDetails(id=dag_id, team_name=teams.get(dag_id)),
            user=user,
        )
    )


class AirflowResendRuns:
    """The manual resend DAG's runs through Airflow's REST API (``/api/v2``), as the person asking: their JWT (the
    ``Authorization`` header, or the UI's session cookie) goes with each call. Airflow's answer stands: a 403 from
    it is the person's 403 (:class:`ResendRefused`)."""

    def __init__(self, api_base: str | None = None) -> None:
        self._api_base = api_base

    def api_base(self) -> str:
        """This api-server's own address: ``[api] base_url``, else its host and port."""
        if self._api_base is not None:
            return self._api_base.rstrip("/")
        from airflow.configuration import conf

        base = conf.get("api", "base_url", fallback="") or ""
        if not base:
            host = conf.get("api", "host", fallback="127.0.0.1") or "127.0.0.1"
            host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
            base = f"http://{host}:{conf.getint('api', 'port', fallback=8080)}"
        return base.rstrip("/")

    def trigger(self, request: Request, dag_id: str, conf: Mapping[str, Any], note: str) -> str:
        """Trigger a run of ``dag_id`` with ``conf``; its run id."""
        body = {"logical_date": None, "conf": conf, "note": note}
        answer = self._call(request, "POST", f"/api/v2/dags/{_quoted(dag_id)}/dagRuns", body)
        return str(answer["dag_run_id"])

    def run(self, request: Request, dag_id: str, run_id: str) -> RunSeen:
        """The run ``run_id`` of ``dag_id``: its state, its conf, and the resend task's return value once it
        succeeded."""
        path = f"/api/v2/dags/{_quoted(dag_id)}/dagRuns/{_quoted(run_id)}"
        run = self._call(request, "GET", path)
        state, result = str(run.get("state")), None
        if state == "success":
            xcom = self._call(request, "GET", f"{path}/taskInstances/{RESEND_TASK}/xcomEntries/return_value")
            value = xcom.get("value")
            result = value if isinstance(value, Mapping) else None
        conf = run.get("conf")
        return RunSeen(run_id, state, conf if isinstance(conf, Mapping) else {}, result, dag_id)

    def _call(self, request: Request, method: str, path: str, body: Any = None) -> dict[str, Any]:
        token = caller_token(request)
        if token is None:
            raise ResendRefused(401, "Not authenticated")
        try:
            answer = httpx.request(
                method,
                f"{self.api_base()}{path}",
                json=body,
                headers={"Authorization": f"Bearer {token}"},
                timeout=API_TIMEOUT_S,
            )
        except httpx.HTTPError as exc:
            raise ResendRefused(503, f"Airflow's API did not answer ({type(exc).__name__}: {exc})") from None
        if answer.status_code >= 400:
            detail = _detail(answer)
            raise ResendRefused(answer.status_code, f"Airflow answered {answer.status_code}: {detail}")
        found = answer.json()
        return found if isinstance(found, dict) else {}


def caller_token(request: Request) -> str | None:
    """The JWT the caller sent: an ``Authorization: Bearer`` header, else the Airflow UI's session cookie."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN

    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token:
        return token
    return request.cookies.get(COOKIE_NAME_JWT_TOKEN) or None


def _quoted(run_id: str) -> str:
    from urllib.parse import quote

    return quote(run_id, safe="")


def _detail(answer: httpx.Response) -> str:
    try:
        found = answer.json()
    except ValueError:
        return answer.text[:300]
    detail = found.get("detail") if isinstance(found, dict) else None
    return str(detail if detail is not None else found)[:300]
