"""The detector DAG under dag.test(): a healthy detector is left alone; a stale one's hung driver is stopped
and the job submitted again.

The submit task itself is marked successful here (``mark_success_pattern``): run for real it is the
detector, which runs until stopped. ``make up`` runs it for real (docs/detector.md), and
``test_spark_submit_arguments_come_from_the_connections`` checks what it would submit.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from khipu.detector.job import VERDICT_QUERY
from khipu.store import Store

pytestmark = pytest.mark.integration
DAGS = Path(__file__).resolve().parents[3] / "dags"


@pytest.fixture
def detector_env(airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    store_path = tmp_path / "khipu.db"
    monkeypatch.setenv("KHIPU_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("AIRFLOW_CONN_KHIPU_STORE", json.dumps({"conn_type": "sqlite", "host": str(store_path)}))
    monkeypatch.setenv(
        "AIRFLOW_CONN_KHIPU_KAFKA",
        json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": "127.0.0.1:1", "khipu.cluster": "local"}}),
    )
    store = Store(f"sqlite:///{store_path}")
    store.migrate()
    return store


def beat(at_ms: int) -> dict[str, object]:
    return {
        "query_name": VERDICT_QUERY,
        "run_id": "r1",
        "batch_id": 7,
        "at_ms": at_ms,
        "input_rows": 10,
        "input_rows_per_s": 5.0,
        "processed_rows_per_s": 9.0,
        "batch_duration_ms": 300,
        "state_rows": 3,
        "state_bytes": 900,
        "caught_up": True,
    }


def run_states() -> dict[str, str | None]:
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(DAGS)).get_dag("khipu_detector")
    run = dag.test(mark_success_pattern="submit_detector")
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


def test_a_healthy_detector_is_left_alone(detector_env: Store) -> None:
    detector_env.record_heartbeat(beat(time.time_ns() // 1_000_000 - 5_000))
    states = run_states()
    assert states == {
        "check_detector": "success",
        "detector_is_healthy": "success",
        "stop_hung_detector": "skipped",
        "submit_detector": "skipped",
    }


def test_a_stale_detector_has_its_hung_driver_stopped_and_is_submitted_again(
    detector_env: Store, tmp_path: Path
) -> None:
    detector_env.record_heartbeat(beat(time.time_ns() // 1_000_000 - 600_000))  # ten minutes silent
    hung = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    threading.Thread(target=hung.wait, daemon=True).start()  # reaped as it ends, as by its real parent
    try:
        checkpoint = tmp_path / "state" / "detector" / "checkpoint"
        checkpoint.mkdir(parents=True)
        (checkpoint / "driver.json").write_text(json.dumps({"pid": hung.pid, "host": socket.gethostname()}))
        started = time.monotonic()
        states = run_states()
        assert hung.wait(timeout=10) == -15  # the hung driver is gone: stopped by SIGTERM
        assert time.monotonic() - started < 30  # ... at once, not after the kill timeout
    finally:
        if hung.poll() is None:
            hung.kill()
    assert states == {
        "check_detector": "success",
        "detector_is_healthy": "skipped",
        "stop_hung_detector": "success",
        "submit_detector": "success",
    }


def test_spark_submit_arguments_come_from_the_connections(detector_env: Store, tmp_path: Path) -> None:
    from khipu_airflow.detector import application_args

    args = application_args("khipu_kafka", "khipu_store")
    pairs = dict(zip(args[::2], args[1::2], strict=True))
    assert pairs["--bootstrap-servers"] == "127.0.0.1:1"
    assert pairs["--store-url"] == f"sqlite:///{tmp_path / 'khipu.db'}"
    assert pairs["--checkpoint"] == str(tmp_path / "state" / "detector" / "checkpoint")
    assert pairs["--trace-topic"] == "khipu.traces"
