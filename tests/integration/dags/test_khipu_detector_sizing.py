"""The detector DAG sizes the detector from its Params and the Spark connection's extra, through SparkSubmitHook's
public API: each setting reaches the spark-submit command of the process it starts (read from the process, not from
the hook), and the detector runs with them (its checkpoint says so); a checkpoint's bucket count is kept, and a bad
size is refused with its name before anything is stopped or started.

Real parts: the session's Kafka broker and a demo run's traces, spark-submit of spark/detector.py in local mode
started by the DAG under dag.test(), Airflow's Param validation, a SQLite store.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from khipu.detector.checkpoint import CheckpointSizing, checkpoint_sizing
from khipu.detector.driver import read_driver_record
from khipu.detector.model import DETECTOR_QUERY
from khipu.localstack.broker import BrokerProcess
from khipu.process_group import ProcessTable
from khipu.store import Store
from tests.integration.detector.conftest import demo_traces, driver_jvm

pytestmark = pytest.mark.integration
DAGS = Path(__file__).resolve().parents[3] / "dags"
SPARK_PASSWORD = "spark-pw-91c2"  # SparkSubmitHook ignores it; it must never reach a command line


def spark_connection(extra: dict[str, Any]) -> str:
    return json.dumps(
        {
            "conn_type": "spark",
            "host": "local[2]",
            "password": SPARK_PASSWORD,
            "extra": {"deploy-mode": "client", "spark-binary": "spark-submit", **extra},
        }
    )


@pytest.fixture
def sizing_env(airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The detector DAG's environment, its state folder returned; the trace cluster is set by each test."""
    state = tmp_path / "state"
    store_path = tmp_path / "khipu.db"
    for variable, value in {
        "KHIPU_STATE_DIR": str(state),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # spark-submit, as make up has it
        "AIRFLOW_CONN_KHIPU_STORE": json.dumps({"conn_type": "sqlite", "host": str(store_path)}),
        "KHIPU_DETECTOR_TRIGGER_S": "1",
    }.items():
        monkeypatch.setenv(variable, value)
    store = Store(f"sqlite:///{store_path}")
    store.migrate()
    store.close()
    return state


def run_detector_dag(conf: dict[str, Any] | None = None) -> dict[str, str | None]:
    from airflow.dag_processing.dagbag import DagBag

    run = DagBag(dag_folder=str(DAGS)).get_dag("khipu_detector").test(run_conf=conf)
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


def pairs_of(command: list[str], flags: tuple[str, ...]) -> dict[str, str]:
    """The value after each of ``flags`` in ``command`` (a flag absent: left out)."""
    return {flag: command[command.index(flag) + 1] for flag in flags if flag in command}


def test_each_param_and_the_connections_extra_reach_the_spark_submit_command_and_the_detector_runs_with_them(
    broker: BrokerProcess,
    sizing_env: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    state = sizing_env
    traces = demo_traces(broker, tmp_path, "size1", count=20, seed=5)
    monkeypatch.setenv(
        "AIRFLOW_CONN_KHIPU_KAFKA",
        json.dumps(
            {
                "conn_type": "kafka",
                "extra": {
                    "bootstrap.servers": broker.bootstrap_servers,
                    "khipu.cluster": "local",
                    "khipu.trace_topic": traces.trace_topic,
                },
            }
        ),
    )
    # what the scheduled runs take: the extra's executor memory; the run's Params set the rest. The connection is in
    # Airflow's database, as in production: a process outside the task gets it only from the launcher
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_DEFAULT", raising=False)
    stored = json.loads(spark_connection({"khipu.detector": {"executor_memory": "700m"}}))
    params = {
        "buckets": 8,
        "shuffle_partitions": 3,
        "driver_memory": "900m",
        "executor_cores": 1,
        "total_executor_cores": 2,
        "num_executors": 1,
    }
    table = ProcessTable(state)
    query = state / "detector" / "checkpoint" / DETECTOR_QUERY
    try:
        airflow_connection("spark_default", stored)
        states = run_detector_dag(params)  # never ran: submitted, and the task returns once the driver is up
        assert (states["restart_detector"], states["detector_is_running"]) == ("success", "skipped"), states
        launcher = table.running("detector")
        driver = read_driver_record(state / "detector" / "checkpoint")
        assert launcher is not None and driver is not None and driver.alive()
        jvm, submitted = driver_jvm(driver.pid)  # the spark-submit JVM the driver runs in, as the OS has it
        group = [p for p in psutil.process_iter(["pid", "cmdline"]) if _group_of(p.pid) == launcher.pid]
        launcher_command = psutil.Process(launcher.pid).cmdline()
        launcher_env = psutil.Process(launcher.pid).environ()
        deadline = time.monotonic() + 180
        while checkpoint_sizing(query).shuffle_partitions is None and time.monotonic() < deadline:
            time.sleep(1)  # Spark records the shuffle partitions with the first batch's offsets
        kept = checkpoint_sizing(query)
    finally:
        table.stop("detector", timeout_s=30)
        airflow_connection("spark_default", None)

    assert pairs_of(
        submitted,
        ("--master", "--executor-memory", "--executor-cores", "--total-executor-cores", "--num-executors",
         "--deploy-mode"),
    ) == {
        "--master": "local[2]",  # the connection's host, as the launcher resolved it too
        "--executor-memory": "700m",  # from the connection's extra: no Param set it
        "--executor-cores": "1",
        "--total-executor-cores": "2",
        "--num-executors": "1",
        "--deploy-mode": "client",
    }  # fmt: skip
    application = submitted[next(i for i, part in enumerate(submitted) if part.endswith("spark/detector.py")) :]
    assert pairs_of(application, ("--buckets", "--shuffle-partitions")) == {
        "--buckets": "8",
        "--shuffle-partitions": "3",
    }
    # spark-submit's launcher turns --driver-memory into the driver JVM's heap and the setting it reports
    assert "-Xmx900m" in jvm and "spark.driver.memory=900m" in submitted
    # the detector ran with them: its checkpoint keeps 8 buckets, and Spark recorded 3 shuffle partitions
    assert kept == CheckpointSizing(str(query), 8, 3)
    # the launcher is the hook's submit() in a process group of its own; the connection reached it by environment
    assert launcher_command[1:3] == ["-m", "khipu_airflow.spark_submit"]
    assert SPARK_PASSWORD in launcher_env["AIRFLOW_CONN_SPARK_DEFAULT"]  # from the launcher: the test set none
    assert len(group) >= 3  # the launcher, spark-submit's JVM, the Python driver
    assert all(SPARK_PASSWORD not in " ".join(p.info["cmdline"] or []) for p in group)

    # a restart asking for another bucket count than the checkpoint keeps is refused, and nothing is started
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", spark_connection({}))
    capfd.readouterr()
    states = run_detector_dag({"buckets": 16})
    out, err = capfd.readouterr()
    assert states["restart_detector"] == "failed", states
    assert "'buckets': got 16; expected 8, the count the checkpoint" in out + err
    assert "Rescaling to another bucket count" in out + err
    assert table.running("detector") is None
    assert checkpoint_sizing(query) == kept


def airflow_connection(conn_id: str, body: dict[str, Any] | None) -> None:
    """Keep ``body`` as the connection ``conn_id`` in Airflow's database (None: remove it)."""
    from airflow.models import Connection
    from airflow.utils.session import create_session

    with create_session() as session:
        session.query(Connection).filter(Connection.conn_id == conn_id).delete()
        if body is not None:
            extra = json.dumps(body.pop("extra", {}))
            session.add(Connection(conn_id=conn_id, extra=extra, **body))


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_a_param_out_of_range_is_refused_at_the_trigger_naming_it(sizing_env: Path) -> None:
    from airflow.sdk.definitions.param import ParamValidationError

    for conf, named in (({"buckets": 0}, "buckets"), ({"executor_memory": "lots"}, "executor_memory")):
        with pytest.raises(ParamValidationError, match=named):
            run_detector_dag(conf)


def test_a_bad_size_in_the_connections_extra_fails_the_restart_naming_it_and_stops_nothing(
    sizing_env: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A hung detector (it never reported) would be stopped and started again; with a size that cannot be used, the
    refusal comes first, and the running process is left alone."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_KHIPU_KAFKA",
        json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": "127.0.0.1:1", "khipu.cluster": "local"}}),
    )
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", spark_connection({"khipu.detector": {"executor_memory": "lots"}}))
    monkeypatch.setenv("KHIPU_DETECTOR_STARTUP_GRACE_S", "1")
    table = ProcessTable(sizing_env)
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    running = table.spawn("detector", sleeper, dict(os.environ), sizing_env / "logs" / "detector.log", "a hung driver")
    try:
        time.sleep(2)  # past its startup grace, never reported: hung
        capfd.readouterr()
        states = run_detector_dag()
        out, err = capfd.readouterr()
        assert states["restart_detector"] == "failed", states
        assert "executor_memory (spark_default's extra khipu.detector)': got 'lots'; expected a JVM memory" in out + err
        assert running.alive() and table.running("detector") == running  # not stopped, nothing else started
    finally:
        table.stop("detector", timeout_s=10)
