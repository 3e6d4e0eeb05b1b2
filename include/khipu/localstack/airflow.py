"""Airflow for the local stack: its environment, its connections, its users and teams, and standalone's health.

Airflow runs in multi-team mode with the SimpleAuthManager, so that the Khipu view shows each user their teams'
streams (docs/view.md#who-sees-which-streams), and Airflow itself each team's DAGs only: Khipu's own in a bundle of
the team khipu-every-stream, each team's manual resend DAG in a bundle of its own (khipu.access.dags). ``admin``
sees every stream, ``demo`` is in team-demo (the demo's ``demo.orders``), ``bursts`` in team-bursts
(``demo.bursts``). Their passwords are drawn here, before Airflow
starts, into the file the SimpleAuthManager reads them from (owner-only): Airflow then never prints them to its log.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url

from khipu.access import EVERY_STREAM_TEAM
from khipu.access.dags import bundle_setting, dag_bundles, write_team_dag_files
from khipu.config.model import LOCAL_MASTER
from khipu.files import tighten, write_owner_only
from khipu.registry.loader import load_registry
from khipu.settings import KhipuSettings, project_root

KAFKA_CONNECTION_ID = "khipu_kafka"
STORE_CONNECTION_ID = "khipu_store"
SPARK_CONNECTION_ID = "spark_default"
PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"  # in AIRFLOW_HOME, where Airflow keeps them


@dataclass(frozen=True, slots=True)
class StackUser:
    name: str
    role: str  # a SimpleAuthManager role: viewer, user (may trigger DAGs, so resend), op, admin
    teams: tuple[str, ...] = ()
    sees: str = ""  # what the view shows them, for `khipu status`


# The local stack's users: its admin, and one of each demo stream's team (config/registry.yaml's owners).
STACK_USERS = (
    StackUser("admin", "admin", (), "every stream"),
    StackUser("demo", "user", ("team-demo",), "team-demo: demo.orders"),
    StackUser("bursts", "user", ("team-bursts",), "team-bursts: demo.bursts"),
)


def users_setting(users: tuple[StackUser, ...] = STACK_USERS) -> str:
    """``[core] simple_auth_manager_users``: ``name:role[:team|team]`` per user."""
    return ",".join(":".join([u.name, u.role, *(["|".join(u.teams)] if u.teams else [])]) for u in users)


class AirflowSetupError(RuntimeError):
    """Airflow could not be prepared or started."""


def venv_bin() -> Path:
    return Path(sys.executable).parent


def airflow_env(settings: KhipuSettings, airflow_home: Path) -> dict[str, str]:
    """Environment for every Airflow process of the local stack (and for tests using ``dag.test()``)."""
    root = project_root()
    base_url = f"http://127.0.0.1:{settings.airflow_port}"
    return {
        **settings.as_env(),
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(root / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(root / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base_url}/execution/",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(settings.airflow_port),
        "AIRFLOW__CORE__MULTI_TEAM": "True",  # the view shows each user their teams' streams
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": users_setting(),
        # Khipu's own DAGs for whoever sees every stream, each team's resend DAG for the team (khipu.access.dags)
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": bundle_setting(
            dag_bundles(stream_owners(settings), root / "dags", team_dags_folder(airflow_home), multi_team=True)
        ),
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        # Local stack: judge consumer health over 5 snapshots (5 minutes) so a stalled demo consumer
        # shows within minutes; production keeps the default of 10.
        "KHIPU_HEALTH_WINDOW": os.environ.get("KHIPU_HEALTH_WINDOW", "5"),
        "PATH": f"{venv_bin()}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }


def stream_owners(settings: KhipuSettings) -> frozenset[str]:
    """The teams the registry's streams belong to: a DAG bundle each."""
    return load_registry(settings.registry_path).owners


def team_dags_folder(airflow_home: Path) -> Path:
    """Where each team's bundle (its manual resend DAG) is written: ``<airflow home>/team-dags/<team>``."""
    return airflow_home / "team-dags"


def connections(settings: KhipuSettings) -> dict[str, dict[str, object]]:
    """The Airflow connections Khipu needs, in ``airflow connections import`` JSON form."""
    return {
        KAFKA_CONNECTION_ID: {
            "conn_type": "kafka",
            "description": "Kafka cluster 'local' (the embedded broker) and its trace topic",
            "extra": json.dumps(
                {
                    "bootstrap.servers": settings.bootstrap_servers,
                    "khipu.cluster": settings.cluster,
                    "khipu.trace_topic": settings.trace_topic,
                }
            ),
        },
        SPARK_CONNECTION_ID: {
            "conn_type": "spark",
            "description": "Spark in local mode on this machine (a failed task tried up to 4 times)",
            "host": LOCAL_MASTER,
            "extra": json.dumps({"deploy-mode": "client", "spark-binary": "spark-submit"}),
        },
        STORE_CONNECTION_ID: _store_connection(settings.store_url),
    }


def _store_connection(url: str) -> dict[str, object]:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database:
        return {
            "conn_type": "sqlite",
            "description": "The Khipu store (SQLite file of the local stack)",
            "host": parsed.database,
        }
    return {"conn_type": "generic", "description": "The Khipu store", "extra": json.dumps({"url": url})}


def run_airflow_cli(args: list[str], env: dict[str, str], log_path: Path, timeout_s: float = 600) -> None:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        result = subprocess.run(
            [str(venv_bin() / "airflow"), *args],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=timeout_s,
            check=False,
        )
    if result.returncode != 0:
        raise AirflowSetupError(f"`airflow {' '.join(args)}` failed with exit code {result.returncode}; see {log_path}")


def prepare_airflow(settings: KhipuSettings, airflow_home: Path, env: dict[str, str], log_path: Path) -> None:
    """Migrate the metadata database, create the users' teams, draw their passwords, and (re)register Khipu's
    connections. Safe to repeat."""
    airflow_home.mkdir(parents=True, exist_ok=True)
    run_airflow_cli(["db", "migrate"], env, log_path)
    tighten(airflow_home / "airflow.db")  # SQLite's (if it is): DAG runs, XComs, run confs of every team
    owners = stream_owners(settings)
    write_team_dag_files(owners, team_dags_folder(airflow_home))
    # every bundle's team exists before the dag-processor reads the bundles; so does every user's
    ensure_teams(sorted({EVERY_STREAM_TEAM, *owners, *(team for user in STACK_USERS for team in user.teams)}), env,
                 log_path)  # fmt: skip
    ensure_passwords(airflow_home / PASSWORDS_FILE, [user.name for user in STACK_USERS])
    connections_file = airflow_home / "khipu-connections.json"
    write_owner_only(connections_file, json.dumps(connections(settings), indent=2))
    run_airflow_cli(["connections", "import", "--overwrite", str(connections_file)], env, log_path)


def ensure_teams(teams: list[str], env: dict[str, str], log_path: Path) -> None:
    """Create the Airflow teams not in its database yet (multi-team mode checks that each user's teams exist)."""
    listed = subprocess.run(
        [str(venv_bin() / "airflow"), "teams", "list", "--output", "json"],
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
        check=False,
    )
    if listed.returncode != 0:
        raise AirflowSetupError(
            f"`airflow teams list` failed with exit code {listed.returncode}: {listed.stderr[-500:]}"
        )
    start = listed.stdout.find("[")  # a "No teams found." line, or the JSON list
    existing = {str(t["name"]) for t in json.loads(listed.stdout[start:])} if start >= 0 else set()
    for team in teams:
        if team not in existing:
            run_airflow_cli(["teams", "create", team], env, log_path)


def ensure_passwords(path: Path, users: list[str]) -> None:
    """Draw a password for each user the file does not hold yet, in the SimpleAuthManager's file (owner-only)."""
    try:
        passwords = json.loads(path.read_text() or "{}")
    except FileNotFoundError:
        passwords = {}
    missing = [user for user in users if user not in passwords]
    if not missing:
        return
    passwords.update({user: secrets.token_urlsafe(12) for user in missing})
    write_owner_only(path, json.dumps(passwords) + "\n")


def airflow_healthy(port: int, timeout_s: float = 10.0) -> bool:
    """Whether Airflow's API server answers its health endpoint within ``timeout_s`` with its metadata database and
    its scheduler healthy."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=timeout_s) as response:
            health = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return all(health.get(part, {}).get("status") == "healthy" for part in ("metadatabase", "scheduler"))


def admin_password(airflow_home: Path) -> str | None:
    """The password of user ``admin`` (kept in AIRFLOW_HOME, never logged)."""
    return user_password(airflow_home, "admin")


def user_password(airflow_home: Path, user: str) -> str | None:
    """The password of one of the stack's users, from the SimpleAuthManager's file (never logged)."""
    try:
        found = json.loads((airflow_home / PASSWORDS_FILE).read_text()).get(user)
    except (OSError, ValueError):
        return None
    return None if found is None else str(found)
