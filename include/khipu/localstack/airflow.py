"""Airflow for the local stack: its environment, its connections, and standalone's health."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from sqlalchemy.engine import make_url

from khipu.settings import KhipuSettings, project_root

KAFKA_CONNECTION_ID = "khipu_kafka"
STORE_CONNECTION_ID = "khipu_store"
SPARK_CONNECTION_ID = "spark_default"


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
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        # Local stack: judge consumer health over 5 snapshots (5 minutes) so a stalled demo consumer
        # shows within minutes; production keeps the default of 10.
        "KHIPU_HEALTH_WINDOW": os.environ.get("KHIPU_HEALTH_WINDOW", "5"),
        "PATH": f"{venv_bin()}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }


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
            "description": "Spark in local mode on this machine",
            "host": "local[*]",
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
    """Migrate the metadata database and (re)register Khipu's connections. Safe to repeat."""
    airflow_home.mkdir(parents=True, exist_ok=True)
    run_airflow_cli(["db", "migrate"], env, log_path)
    connections_file = airflow_home / "khipu-connections.json"
    connections_file.write_text(json.dumps(connections(settings), indent=2))
    run_airflow_cli(["connections", "import", "--overwrite", str(connections_file)], env, log_path)


def airflow_healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=3) as response:
            health = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return all(health.get(part, {}).get("status") == "healthy" for part in ("metadatabase", "scheduler"))


def admin_password(airflow_home: Path) -> str | None:
    """The password standalone generated for user ``admin`` (kept in AIRFLOW_HOME, never logged)."""
    path = airflow_home / "simple_auth_manager_passwords.json.generated"
    try:
        return str(json.loads(path.read_text()).get("admin"))
    except (OSError, ValueError):
        return None
