"""The detector DAG under dag.test(): a running, reporting detector is left alone; the spark-submit command
carries no secret, the connections file does (readable by its owner only).

The full cycle (submit, SIGSTOP, replaced from the checkpoint, alert fired and resolved) runs for real
in tests/integration/detector/test_supervision.py.
"""

from __future__ import annotations

import json
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from khipu.detector.driver import DRIVER_FILE
from khipu.detector.model import DETECTOR_QUERY
from khipu.store import Store

pytestmark = pytest.mark.integration
DAGS = Path(__file__).resolve().parents[3] / "dags"
SECRET = "kafka-pw-7d1e"


@pytest.fixture
def detector_env(airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    store_path = tmp_path / "khipu.db"
    monkeypatch.setenv("KHIPU_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("AIRFLOW_CONN_KHIPU_STORE", json.dumps({"conn_type": "sqlite", "host": str(store_path)}))
    monkeypatch.setenv(
        "AIRFLOW_CONN_KHIPU_KAFKA",
        json.dumps(
            {
                "conn_type": "kafka",
                "login": "khipu",
                "password": SECRET,
                "extra": {
                    "bootstrap.servers": "127.0.0.1:1",
                    "security.protocol": "SASL_PLAINTEXT",
                    "khipu.cluster": "local",
                },
            }
        ),
    )
    store = Store(f"sqlite:///{store_path}")
    store.migrate()
    return store


def beat(at_ms: int) -> dict[str, object]:
    return {
        "query_name": DETECTOR_QUERY,
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


def test_a_running_reporting_detector_is_left_alone_and_nothing_alerts(detector_env: Store, tmp_path: Path) -> None:
    import psutil

    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    threading.Thread(target=driver.wait, daemon=True).start()
    try:
        checkpoint = tmp_path / "state" / "detector" / "checkpoint"
        checkpoint.mkdir(parents=True)
        (checkpoint / DRIVER_FILE).write_text(
            json.dumps(
                {
                    "pid": driver.pid,
                    "create_time": psutil.Process(driver.pid).create_time(),
                    "host": socket.gethostname(),
                    "started_ms": time.time_ns() // 1_000_000 - 60_000,
                }
            )
        )
        detector_env.heartbeat.record(beat(time.time_ns() // 1_000_000 - 5_000))
        from airflow.dag_processing.dagbag import DagBag

        run = DagBag(dag_folder=str(DAGS)).get_dag("khipu_detector").test()
        states = {ti.task_id: ti.state for ti in run.get_task_instances()}
        assert driver.poll() is None  # untouched
    finally:
        driver.kill()
    assert states == {
        "check_detector": "success",
        "check_trace_trail": "success",  # no trail recorded yet: nothing to judge, nothing asked of the broker
        "choose": "success",
        "detector_is_running": "success",
        "restart_detector": "skipped",
        "send_alerts": "success",
    }
    assert detector_env.alerts.read() == []


def test_spark_submit_arguments_name_paths_only_and_the_secrets_go_to_an_owner_only_file(
    detector_env: Store, tmp_path: Path
) -> None:
    """What the launcher hands SparkSubmitHook's constructor (the command is read from the started process in
    test_khipu_detector_sizing.py) names paths and counts, never a secret."""
    from khipu.detector.sizing import SparkResources
    from khipu_airflow.detector import application_args, hook_arguments
    from khipu_airflow.spark_submit import spark_target

    args = application_args("khipu_kafka", "khipu_store", 32, 4)
    pairs = dict(zip(args[::2], args[1::2], strict=True))
    assert pairs["--checkpoint"] == f"file://{tmp_path / 'state' / 'detector' / 'checkpoint'}"
    assert pairs["--trace-topic"] == "khipu.traces"
    assert (pairs["--buckets"], pairs["--shuffle-partitions"]) == ("32", "4")
    arguments = hook_arguments(spark_target("spark_default"), args, SparkResources())
    shown = json.dumps(arguments)
    assert SECRET not in shown and str(tmp_path / "khipu.db") not in shown
    assert any(Path(jar).name.startswith("spark-sql-kafka-0-10") for jar in arguments["jars"].split(","))
    java_options = arguments["conf"]["spark.driver.extraJavaOptions"]
    assert "-Dlog4j2.configurationFile=file:" in java_options and java_options.endswith(" -XX:+UseParallelGC")
    connections = Path(pairs["--connections-file"])
    assert stat.S_IMODE(connections.stat().st_mode) == 0o600
    body = json.loads(connections.read_text())
    assert body["trace"]["settings"]["sasl.password"] == SECRET
    assert body["store_url"] == f"sqlite:///{tmp_path / 'khipu.db'}"
    assert set(body["clusters"]) == {"local"}
