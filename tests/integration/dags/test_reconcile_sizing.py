"""Reconciliation sized by its DAGs' Params and the Spark connection's extra: each reaches the spark-submit command of
the job the backfill DAG runs (read from the running process, not from the hook), and a bad one is refused before
anything is submitted.

Real parts: the backfill DAG's environment of test_khipu_backfill.py (the session's broker, an archive written by
Spark, a SQLite store), spark-submit of spark/reconcile.py in local mode under dag.test().
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from khipu.detector.sizing import RESOURCES
from tests.integration.dags.test_khipu_backfill import backfill_env, run_backfill, states  # noqa: F401 (a fixture)
from tests.integration.detector.conftest import SPARK_SUBMIT

pytestmark = pytest.mark.integration
DAGS = Path(__file__).resolve().parents[3] / "dags"
LAUNCHER = "org.apache.spark.launcher.Main"


def spark_connection(extra: dict[str, Any]) -> str:
    return json.dumps(
        {
            "conn_type": "spark",
            "host": "local[2]",
            "extra": {"deploy-mode": "client", "spark-binary": "spark-submit", **extra},
        }
    )


class SubmittedCommands:
    """The command lines of spark-submit JVMs running spark/reconcile.py below this process, as the OS has them (not
    spark-submit's scripts, nor the short-lived launcher JVM they run first to build that command)."""

    def __init__(self) -> None:
        self.found: list[list[str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> SubmittedCommands:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _watch(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            for process in psutil.process_iter(["cmdline"]):
                command = process.info["cmdline"] or []
                if (
                    command
                    and Path(command[0]).name == "java"
                    and SPARK_SUBMIT in command
                    and LAUNCHER not in command
                    and any(p.endswith("spark/reconcile.py") for p in command)
                ):
                    try:
                        ours = any(parent.pid == me for parent in process.parents())
                    except psutil.NoSuchProcess:
                        continue
                    if ours and command not in self.found:
                        self.found.append(command)
            time.sleep(0.2)


def pairs_of(command: list[str], flags: tuple[str, ...]) -> dict[str, str]:
    return {flag: command[command.index(flag) + 1] for flag in flags if flag in command}


def test_each_resource_param_and_the_connections_extra_reach_the_reconcile_jobs_spark_submit_command(
    backfill_env: dict[str, Any],  # noqa: F811 (the fixture imported above)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", spark_connection({"khipu.reconcile": {"executor_memory": "600m"}}))
    window = {"start": backfill_env["start"], "end": backfill_env["end"], "dry_run": True}
    params = {"driver_memory": "800m", "executor_cores": 1, "total_executor_cores": 2, "num_executors": 1}
    with SubmittedCommands() as seen:
        run = run_backfill({**window, **params})
    assert run.state == DagRunState.SUCCESS, states(run)
    [command] = seen.found  # one job, one spark-submit
    submitted = command[command.index(SPARK_SUBMIT) + 1 :]
    assert pairs_of(
        submitted, ("--executor-memory", "--executor-cores", "--total-executor-cores", "--num-executors")
    ) == {
        "--executor-memory": "600m",  # from the connection's extra: no Param set it
        "--executor-cores": "1",
        "--total-executor-cores": "2",
        "--num-executors": "1",
    }
    # spark-submit's launcher turns --driver-memory into the driver JVM's heap and the setting it reports
    assert "-Xmx800m" in command[: command.index(SPARK_SUBMIT)] and "spark.driver.memory=800m" in submitted
    # the hourly DAG takes the same Params (its scheduled runs: unset, so the extra decides)
    hourly = DagBag(dag_folder=str(DAGS)).get_dag("khipu_reconcile")
    assert {name: hourly.params[name] for name in RESOURCES} == dict.fromkeys(RESOURCES)


def test_a_bad_size_in_the_connections_extra_refuses_the_reconciliation_before_it_is_submitted(
    backfill_env: dict[str, Any],  # noqa: F811 (the fixture imported above)
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    from airflow.utils.state import DagRunState

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", spark_connection({"khipu.reconcile": {"executor_cores": 0}}))
    window = {"start": backfill_env["start"], "end": backfill_env["end"], "dry_run": True}
    capfd.readouterr()
    with SubmittedCommands() as seen:
        run = run_backfill(window)
    out, err = capfd.readouterr()
    assert run.state == DagRunState.FAILED
    assert states(run)["reconcile_window"] == "failed"
    assert "executor_cores (spark_default's extra khipu.reconcile)': got 0; expected an integer >= 1" in out + err
    assert seen.found == []  # nothing submitted
