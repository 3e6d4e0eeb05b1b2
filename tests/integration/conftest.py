"""Real parts for integration tests: the embedded broker (Tansu) and a migrated Airflow database."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from khipu.localstack.broker import BrokerProcess, free_port, start_broker, stop_process_group


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    log_path = tmp_path_factory.mktemp("broker") / "tansu.log"
    process = start_broker(free_port(), log_path)
    try:
        yield process
    finally:
        stop_process_group(process.pid)


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """Migrate this session's Airflow metadata database (AIRFLOW_HOME from tests/conftest.py)."""
    home = Path(os.environ["AIRFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    airflow = Path(sys.executable).parent / "airflow"
    result = subprocess.run([str(airflow), "db", "migrate"], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, f"airflow db migrate failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    return home
