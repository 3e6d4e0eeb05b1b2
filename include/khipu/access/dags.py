"""Which Khipu DAGs a person sees in Airflow itself, so that no team reads another's stream data there.

Khipu's DAGs carry stream data on Airflow's own surfaces: a run's conf, a task's return value (XCom), its log, its
rendered template. Airflow scopes those by DAG: a person reads them for the DAGs the auth manager lets them read. So
each DAG's data belongs to exactly one audience:

- **Khipu's own DAGs** (offset snapshots and alerts, the detector, reconciliation and backfill, retention, resend of
  every stream, the demo's bursts) read and write every team's streams: they are for whoever sees every stream. They
  live in one DAG bundle, :data:`OPERATORS_BUNDLE`, owned by the Airflow team :data:`EVERY_STREAM_TEAM` in
  multi-team mode; its members and Airflow's admins see them, nobody else.
- **One manual resend DAG per team** (:func:`resend_dag_of`), in a bundle of that team's own, resends that team's
  streams only. Its runs (which name the team's messages) are the team's; the view triggers it for a loss of the
  team's stream, as the person asking, so Airflow itself checks they may.

Asset events are not scoped by team in Airflow: what Khipu puts on them names no stream (a count only).

What is decided here is pure: the DAG ids, the bundles (``[dag_processor] dag_bundle_config_list``), and the one
file of each team's bundle; :func:`write_team_dag_files` writes those files (``khipu airflow-bundles``, ``make up``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from khipu.access.scope import EVERY_STREAM_TEAM, Viewer
from khipu.errors import InvalidSetting
from khipu.registry.model import OWNER_PATTERN, OWNER_RULE, Registry, ResendMode

MANUAL_DAG = "khipu_resend_manual"  # every stream's: Khipu's operators'
TEAM_DAG_SEPARATOR = "__"  # khipu_resend_manual__team-orders
OPERATORS_BUNDLE = "khipu"  # dags/: every Khipu DAG but the teams' own
TEAM_BUNDLE_PREFIX = "khipu-"  # khipu-team-orders
LOCAL_BUNDLE = "airflow.dag_processing.bundles.local.LocalDagBundle"


class DagAccessError(InvalidSetting):
    kind = "stream owner"


def resend_dag_of(owner: str | None) -> str:
    """The manual resend DAG of ``owner``'s streams; None: the one of every stream (Khipu's operators')."""
    return MANUAL_DAG if owner is None else f"{MANUAL_DAG}{TEAM_DAG_SEPARATOR}{owner}"


def resend_dag_for(viewer: Viewer, owner: str) -> str | None:
    """The resend DAG the view triggers for a loss of ``owner``'s stream as ``viewer``: the team's own, else, for
    whoever sees every stream, the operators' one; None when they may trigger neither."""
    if resend_dag_of(owner) in viewer.resend_dags:
        return resend_dag_of(owner)
    if viewer.every_stream and MANUAL_DAG in viewer.resend_dags:
        return MANUAL_DAG
    return None


def resend_refusal(viewer: Viewer, registry: Registry, stream: str) -> str | None:
    """Why ``viewer`` may not resend a loss of ``stream`` from the view (None: they may). ``registry`` is the one
    they see: a stream not in it is not theirs."""
    if stream not in registry.streams:
        return f"stream {stream!r} is not one of yours"
    found = registry.streams[stream]
    if found.resend.mode is ResendMode.OFF:
        return f"stream {stream!r} is never resent (its resend mode is off)"
    if resend_dag_for(viewer, found.owner) is None:
        return f"you may not trigger the DAG {resend_dag_of(found.owner)}"
    return None


@dataclass(frozen=True, slots=True)
class TeamDagFile:
    """The one file of a team's bundle: its manual resend DAG."""

    owner: str
    name: str  # the file's name: the DAG id, as every Khipu DAG's
    text: str


def team_dag_file(owner: str) -> TeamDagFile:
    """The file that declares ``owner``'s manual resend DAG (:func:`khipu_airflow.resend.manual_resend_dag`)."""
    _check_team(owner)
    dag_id = resend_dag_of(owner)
    text = (
        f'"""{owner}\'s manual resend DAG ({dag_id}): written by `khipu airflow-bundles`; do not edit.\n\n'
        f"Resends confirmed losses of {owner}'s streams only; its runs are {owner}'s to read "
        '(docs/view.md#airflows-own-surfaces)."""\n\n'
        "from khipu_airflow.resend import manual_resend_dag\n\n"
        f"dag = manual_resend_dag(team={owner!r})\n"
    )
    return TeamDagFile(owner, f"{dag_id}.py", text)


def dag_bundles(owners: Iterable[str], dags_folder: Path, teams_folder: Path, multi_team: bool) -> list[dict[str, Any]]:
    """``[dag_processor] dag_bundle_config_list``: Khipu's own DAGs (``dags_folder``), then one bundle per owner
    (``teams_folder/<owner>``, holding :func:`team_dag_file`). In multi-team mode each bundle is its audience's
    team's; without it (an auth manager that grants DAGs one by one, FAB's) the bundles have no team, and the
    DAGs are granted by id."""
    bundles = [_bundle(OPERATORS_BUNDLE, dags_folder, EVERY_STREAM_TEAM if multi_team else None)]
    for owner in sorted(set(owners)):
        _check_team(owner)
        bundles.append(_bundle(f"{TEAM_BUNDLE_PREFIX}{owner}", teams_folder / owner, owner if multi_team else None))
    return bundles


def write_team_dag_files(owners: Iterable[str], teams_folder: Path) -> list[Path]:
    """Write each owner's :func:`team_dag_file` into ``teams_folder/<owner>/`` (the folder of its bundle); the files
    written (a file already holding the same text is left as it is)."""
    written = []
    for owner in sorted(set(owners)):
        file = team_dag_file(owner)
        path = teams_folder / owner / file.name
        if not path.exists() or path.read_text() != file.text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(file.text)
        written.append(path)
    return written


def bundle_setting(bundles: list[dict[str, Any]]) -> str:
    """The bundles as Airflow reads them (``AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST``)."""
    return json.dumps(bundles, separators=(",", ":"))


def _bundle(name: str, path: Path, team: str | None) -> dict[str, Any]:
    bundle: dict[str, Any] = {"name": name, "classpath": LOCAL_BUNDLE, "kwargs": {"path": str(path)}}
    if team is not None:
        bundle["team_name"] = team
    return bundle


def _check_team(owner: str) -> None:
    """An owner not from a registry (which refuses such an owner at load) is checked against the same rule."""
    if not OWNER_PATTERN.match(owner):
        raise DagAccessError(owner, owner, OWNER_RULE)
