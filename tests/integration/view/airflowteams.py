"""A real Airflow for the view's access tests: its own metadata database, multi-team mode, the SimpleAuthManager
with the users a test names (each a role and teams), and this checkout's plugins: the api-server alone, or with a
scheduler and a dag-processor when the test runs DAGs.

The teams are created and the passwords drawn by the local stack's own code (:func:`khipu.localstack.airflow.
ensure_teams`, :func:`ensure_passwords`): into an owner-only file, never printed. Every process is stopped by its
process group at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from khipu.access import EVERY_STREAM_TEAM
from khipu.access.dags import bundle_setting, dag_bundles, write_team_dag_files
from khipu.localstack.airflow import StackUser, ensure_passwords, ensure_teams, run_airflow_cli, users_setting
from khipu.localstack.processes import free_port, stop_process_group
from khipu.registry.loader import load_registry

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_REGISTRY = ROOT / "config" / "registry.yaml"
AIRFLOW = Path(sys.executable).parent / "airflow"


@dataclass
class RunningAirflow:
    base: str  # http://127.0.0.1:PORT
    home: Path
    passwords_file: Path
    logs: Path

    def password(self, user: str) -> str:
        return str(json.loads(self.passwords_file.read_text())[user])

    def token(self, user: str) -> str:
        """A JWT from Airflow's own ``POST /auth/token``, as a script would get one."""
        body = json.dumps({"username": user, "password": self.password(user)}).encode()
        request = urllib.request.Request(
            f"{self.base}/auth/token", data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return str(json.loads(answer.read())["access_token"])

    def log_tail(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2500:]}" for p in sorted(self.logs.glob("*.log")))


@contextmanager
def airflow_with_teams(
    work: Path,
    users: tuple[StackUser, ...],
    env: Mapping[str, str],
    *,
    dags: tuple[Path, ...] | None = None,
    home: Path | None = None,
) -> Iterator[RunningAirflow]:
    """Airflow in ``work``: its api-server, and with ``dags`` (copied into its own DAG folder, unpaused) its
    scheduler and dag-processor too, with the DAG bundles a deployment has (``khipu airflow-bundles``): that folder
    for the team khipu-every-stream, and each registry team's manual resend DAG for the team (in multi-team mode;
    without it, bundles without teams). ``env`` adds to this test session's environment (Khipu's settings, Airflow
    connections). ``home``: an Airflow home (and metadata database) an earlier one left, served again."""
    home, logs, dag_folder = home or work / "airflow", work / "logs", work / "dags"
    for folder in (home, logs, dag_folder):
        folder.mkdir(parents=True, exist_ok=True)
    for dag in dags or ():
        (dag_folder / dag.name).write_text(dag.read_text())
    port = free_port()
    passwords = work / "passwords.json"
    full_env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dag_folder),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__MULTI_TEAM": "True",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": users_setting(users),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        **env,
    }
    full_env.pop("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", None)  # its own SQLite database, under its own home
    multi_team = full_env["AIRFLOW__CORE__MULTI_TEAM"] == "True"
    teams = {team for user in users for team in user.teams}
    if dags:  # as a deployment sets them up (khipu.access.dags): Khipu's DAGs, then each registry team's resend DAG
        registry = load_registry(Path(full_env.get("KHIPU_REGISTRY") or DEFAULT_REGISTRY))
        owners = registry.owners
        write_team_dag_files(owners, work / "team-dags")
        bundles = dag_bundles(owners, dag_folder, work / "team-dags", multi_team)
        full_env["AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"] = bundle_setting(bundles)
        teams |= {EVERY_STREAM_TEAM, *owners} if multi_team else set()
    run_airflow_cli(["db", "migrate"], full_env, logs / "setup.log")
    ensure_teams(sorted(teams), full_env, logs / "setup.log")
    ensure_passwords(passwords, [user.name for user in users])
    commands = [["api-server", "--port", str(port)]]
    if dags:
        commands += [["scheduler"], ["dag-processor"]]
    started: list[int] = []
    try:
        for command in commands:
            with open(logs / f"{command[0]}.log", "wb") as out:
                started.append(
                    subprocess.Popen(
                        [str(AIRFLOW), *command],
                        env=full_env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    ).pid
                )
        running = RunningAirflow(f"http://127.0.0.1:{port}", home, passwords, logs)
        deadline = time.monotonic() + 180
        while not _healthy(running.base, scheduler=bool(dags)):
            assert time.monotonic() < deadline, f"Airflow did not come up in 180 s:\n{running.log_tail()}"
            time.sleep(1)
        yield running
    finally:
        for pid in started:
            stop_process_group(pid)


def _healthy(base: str, scheduler: bool) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/api/v2/monitor/health", timeout=3) as answer:
            health: dict[str, Any] = json.loads(answer.read())
    except (urllib.error.URLError, OSError, ValueError):
        return False
    parts = ("metadatabase", "scheduler") if scheduler else ("metadatabase",)
    return all(health.get(part, {}).get("status") == "healthy" for part in parts)
