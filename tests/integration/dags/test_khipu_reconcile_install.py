"""The hourly reconciliation around the install, under dag.test(): the first scheduled hours, whose windows (one
horizon back) lie before the install, are skipped by check_window without starting Spark; an hour after the install
that Airflow missed still reconciles its window when its run comes (the scheduler's side, that no hour before the
install gets a run and every missed one after it does: tests/dags/test_khipu_reconcile_schedule.py).

Real parts: Airflow's dag.test() on the session's metadata database, a SQLite store with the detector's
heartbeat and the install it keeps (the DAG's first run read from it at parse), the archive's hour folders as the
detector lays them out. reconcile_window (spark-submit) is marked done for the later hour: the Spark job over a
window is tested with the backfill (test_khipu_backfill.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pendulum
import pytest
from sqlalchemy import update

from khipu.detector.model import DETECTOR_QUERY
from khipu.reconcile.window import DEFAULT_HORIZON_MS, HOUR_MS, first_scheduled_hour_ms
from khipu.store import Store, schema
from khipu.trace.archive import hour_of

pytestmark = pytest.mark.integration
DAGS = Path(__file__).resolve().parents[3] / "dags"


def states(run: Any) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in run.get_task_instances()}


def test_hours_before_the_install_skip_without_spark_and_a_missed_hour_after_it_reconciles(
    airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization
    from airflow.utils.state import DagRunState

    now_ms = int(time.time() * 1000)
    installed_ms = now_ms - 5 * HOUR_MS - 600_000  # Khipu installed about five hours ago; Airflow down since
    state = tmp_path / "state"
    (state / "archive" / f"hour={hour_of(installed_ms)}").mkdir(parents=True)  # the detector archives from then on
    store_path = tmp_path / "khipu.db"
    store = Store(f"sqlite:///{store_path}")
    store.migrate()
    with store.engine.begin() as tx:  # the store keeps the install (migration 0014 wrote its own time)
        tx.execute(update(schema.installation).values(installed_ms=installed_ms))
    store.heartbeat.record({"query_name": DETECTOR_QUERY, "run_id": "r", "batch_id": 1, "at_ms": now_ms,
                            "input_rows": 0, "caught_up": True})  # fmt: skip
    store.close()
    monkeypatch.setenv("KHIPU_STATE_DIR", str(state))
    monkeypatch.setenv("AIRFLOW_CONN_KHIPU_STORE", json.dumps({"conn_type": "sqlite", "host": str(store_path)}))
    spark = {"conn_type": "spark", "host": "local[1]", "extra": {"spark-binary": str(tmp_path / "no-spark-here")}}
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(spark))  # a Spark job started here would fail
    assert os.environ.get("KHIPU_RECONCILE_HORIZON_MS") is None  # the default horizon: two hours
    dag = DagBag(dag_folder=str(DAGS)).get_dag("khipu_reconcile")
    scheduled = DagSerialization.from_dict(DagSerialization.to_dict(dag))  # as the scheduler holds it
    first = scheduled.next_dagrun_info(last_automated_run_info=None)  # the DAG's first scheduled run
    assert first is not None
    first_ms = int(first.run_after.timestamp() * 1000)
    assert first_ms == first_scheduled_hour_ms(installed_ms)  # the hour after the install the store keeps

    for hour_ms in (first_ms, first_ms + HOUR_MS):  # their windows end one horizon back: before the install
        assert hour_ms - DEFAULT_HORIZON_MS <= installed_ms
        run = dag.test(logical_date=pendulum.from_timestamp(hour_ms / 1000, tz="UTC"))
        assert run.state == DagRunState.SUCCESS, states(run)
        assert states(run) == {"check_window": "skipped", "reconcile_window": "skipped",
                               "announce_confirmed_losses": "skipped"}  # fmt: skip

    missed_ms = first_ms + 3 * HOUR_MS  # past, and its horizon too: the hour Airflow missed while it was down
    run = dag.test(
        logical_date=pendulum.from_timestamp(missed_ms / 1000, tz="UTC"),
        mark_success_pattern="reconcile_window|announce_confirmed_losses",
    )
    assert run.state == DagRunState.SUCCESS, states(run)
    assert states(run)["check_window"] == "success"
    window = run.get_task_instance("check_window").xcom_pull(task_ids="check_window")
    assert (window["start_ms"], window["end_ms"]) == (missed_ms - HOUR_MS - DEFAULT_HORIZON_MS,
                                                      missed_ms - DEFAULT_HORIZON_MS)  # fmt: skip
