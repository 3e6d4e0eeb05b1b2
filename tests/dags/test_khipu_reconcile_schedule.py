"""The hourly reconciliation never overlaps itself, and a slow or missed hour does not pile up the next ones.

Airflow runs the DAG: what is proven here is what the DAG asks of it (one run at a time, missed hours caught
up, a run bounded below the hour, no hour waiting on the previous one's success) and that the runs of a
catch-up, taken in the order Airflow's timetable gives them, reconcile every hour exactly once, each its own
hour whenever it starts. The install: the first run Airflow schedules for a DAG that never ran is the next full
hour after the install, never an hour before (a fresh stack once queued ~320 runs from a fixed start date), even
when a backfill of earlier hours came first; every hour after the install runs, each once, in order, whether
Airflow was down before the first run or after it. The install is kept in the store and read when the DAG is
parsed; the scheduler decides from the serialized DAG alone. A store that cannot be read at parse fails nothing.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from datetime import timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pendulum
import pytest
from sqlalchemy import update

from khipu.reconcile.window import DEFAULT_HORIZON_MS, HOUR_MS, hourly_window
from khipu.store import Store, schema

ROOT = Path(__file__).resolve().parents[2]
DAG_FILE = ROOT / "dags" / "khipu_reconcile.py"


@pytest.fixture(scope="module")
def dag():  # type: ignore[no-untyped-def]
    from airflow.dag_processing.dagbag import DagBag

    assert "AIRFLOW_CONN_KHIPU_STORE" not in os.environ  # no store: the install is unknown at this parse
    bag = DagBag(dag_folder=str(DAG_FILE))
    assert bag.import_errors == {}
    return bag.dags["khipu_reconcile"]


def ms(moment: pendulum.DateTime) -> int:
    return int(moment.timestamp() * 1000)


def test_one_run_at_a_time_so_a_slow_hour_never_runs_beside_the_next(dag) -> None:  # type: ignore[no-untyped-def]
    assert dag.max_active_runs == 1


def test_missed_hours_are_caught_up(dag) -> None:  # type: ignore[no-untyped-def]
    assert dag.catchup is True


def scheduler_view(dag):  # type: ignore[no-untyped-def]
    """The DAG as the scheduler holds it (serialized and read back): its next run comes from here."""
    from airflow.serialization.serialized_objects import DagSerialization

    return DagSerialization.from_dict(DagSerialization.to_dict(dag))


def test_with_the_install_unknown_the_first_run_is_the_next_full_hour(dag) -> None:  # type: ignore[no-untyped-def]
    before_ms = int(time.time() * 1000)
    first = scheduler_view(dag).next_dagrun_info(last_automated_run_info=None)  # a DAG that never ran
    after_ms = int(time.time() * 1000)
    assert first is not None
    # the next full hour after the scheduler asks: no hour before it gets a run at all
    due = {(moment // HOUR_MS + 1) * HOUR_MS for moment in (before_ms, after_ms)}
    assert ms(first.run_after) in due, (first.run_after, sorted(due))


def test_hours_missed_after_the_install_still_run_each_once_in_order(dag) -> None:  # type: ignore[no-untyped-def]
    from airflow.timetables.base import DagRunInfo

    scheduled = scheduler_view(dag)
    first = scheduled.next_dagrun_info(last_automated_run_info=None)
    assert first is not None
    runs = [first]
    for _ in range(6):  # Airflow was down for six hours after the first run: it comes back hours behind
        last = runs[-1]
        following = scheduled.next_dagrun_info(last_automated_run_info=DagRunInfo.interval(*last.data_interval))
        assert following is not None
        runs.append(following)
    assert [ms(r.run_after) - ms(first.run_after) for r in runs] == [n * HOUR_MS for n in range(7)]


def migrated_store(folder: Path, installed_ms: int | None = None) -> Path:
    """A SQLite store as `make up` leaves it (migrated: the migration keeps its own time as the install); with
    ``installed_ms``, one installed then."""
    path = folder / "khipu.db"
    store = Store(f"sqlite:///{path}")
    try:
        store.migrate()
        if installed_ms is not None:
            with store.engine.begin() as tx:
                tx.execute(update(schema.installation).values(installed_ms=installed_ms))
    finally:
        store.close()
    return path


def parsed(monkeypatch: pytest.MonkeyPatch, connection: dict[str, Any] | None) -> dict[str, Any]:
    """khipu_reconcile parsed as Airflow's dag-processor parses it, its ``khipu_store`` connection as given (None: no
    such connection), serialized as the dag-processor hands it to the scheduler."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    if connection is None:
        monkeypatch.delenv("AIRFLOW_CONN_KHIPU_STORE", raising=False)
    else:
        monkeypatch.setenv("AIRFLOW_CONN_KHIPU_STORE", json.dumps(connection))
    bag = DagBag(dag_folder=str(DAG_FILE))
    assert bag.import_errors == {}  # whatever the store says, the parse succeeds
    return dict(DagSerialization.to_dict(bag.dags["khipu_reconcile"]))


def read_back(serialized: dict[str, Any]) -> Any:
    from airflow.serialization.serialized_objects import DagSerialization

    return DagSerialization.from_dict(serialized)


def sqlite(path: Path) -> dict[str, Any]:
    return {"conn_type": "sqlite", "host": str(path)}


def at_hour(hour_ms: int) -> Any:
    from airflow.timetables.base import DagRunInfo

    moment = pendulum.from_timestamp(hour_ms / 1000, tz="UTC")
    return DagRunInfo.interval(moment, moment)  # an hourly run's interval: empty at its logical date


def test_a_backfill_before_the_first_run_never_queues_the_hours_since_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before_ms = int(time.time() * 1000)
    store = migrated_store(tmp_path)  # a fresh install
    after_ms = int(time.time() * 1000)
    scheduled = read_back(parsed(monkeypatch, sqlite(store)))
    # `airflow backfill create ... --from-date 2026-11-23T00:00:00 --to-date 2026-11-23T06:00:00` (the DAG doc's
    # example) ran before the first scheduled run: Airflow hands its last run to the timetable as the latest one
    backfilled = scheduled.next_dagrun_info(last_automated_run_info=at_hour(ms(pendulum.datetime(2026, 11, 23, 6))))
    assert backfilled is not None
    due = {(moment // HOUR_MS + 1) * HOUR_MS for moment in (before_ms, after_ms)}  # the first hour after the install
    assert ms(backfilled.run_after) in due, (backfilled.run_after, sorted(due))


def test_airflow_down_since_before_the_first_run_runs_every_hour_since_the_install_once_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now_ms = int(time.time() * 1000)
    installed_ms = now_ms - 5 * HOUR_MS - 600_000  # installed five hours ago; Airflow down since, before any run
    serialized = parsed(monkeypatch, sqlite(migrated_store(tmp_path, installed_ms)))
    (tmp_path / "khipu.db").unlink()  # the scheduler decides from the serialized DAG alone: it never opens the store
    scheduled = read_back(serialized)
    runs = [scheduled.next_dagrun_info(last_automated_run_info=None)]
    while runs[-1] is not None and ms(runs[-1].run_after) <= now_ms:  # the scheduler creates each due run in turn
        runs.append(scheduled.next_dagrun_info(last_automated_run_info=runs[-1]))
    first_ms = (installed_ms // HOUR_MS + 1) * HOUR_MS
    # the first hour after the install, then every one since, each once, in order, and the next one due after now
    assert [ms(run.run_after) for run in runs if run is not None] == list(
        range(first_ms, (now_ms // HOUR_MS + 2) * HOUR_MS, HOUR_MS)
    )


def test_an_install_that_cannot_be_read_fails_no_parse_and_says_why_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    never_migrated = tmp_path / "empty.db"
    never_migrated.touch()
    unreachable = {"conn_type": "postgres", "host": "127.0.0.1", "port": 1, "schema": "khipu", "login": "khipu",
                   "password": "s3cret"}  # fmt: skip
    said = {}
    for name, connection, why in [
        ("no connection", None, "khipu_store"),
        ("store never migrated", sqlite(never_migrated), "khipu store migrate"),
        ("store unreachable", unreachable, "127.0.0.1:1/khipu"),
    ]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="khipu_airflow.reconcile"):
            before_ms = int(time.time() * 1000)
            first = read_back(parsed(monkeypatch, connection)).next_dagrun_info(last_automated_run_info=None)
            after_ms = int(time.time() * 1000)
        warnings = [r.getMessage() for r in caplog.records if r.name == "khipu_airflow.reconcile"]
        assert len(warnings) == 1 and why in warnings[0], (name, warnings)
        assert "s3cret" not in warnings[0]
        said[name] = warnings[0]
        due = {(moment // HOUR_MS + 1) * HOUR_MS for moment in (before_ms, after_ms)}  # as with no install: next hour
        assert first is not None and ms(first.run_after) in due, (name, first)
    assert len(set(said.values())) == 3, said  # each names its own reason


def test_the_schedule_is_registered_even_when_the_view_cannot_start() -> None:
    # a bad view setting breaks the Khipu view's plugin at import; the schedule has a plugin of its own, so the
    # scheduler still reads khipu_reconcile back from its serialized form
    script = """
import json, os
from airflow import plugins_manager
from airflow.dag_processing.dagbag import DagBag
from airflow.serialization.serialized_objects import DagSerialization
registered = sorted(plugins_manager.get_timetables_plugins())
errors = sorted(plugins_manager.get_import_errors())
dag = DagBag(dag_folder=os.environ["DAG_FILE"]).dags["khipu_reconcile"]
timetable = DagSerialization.from_dict(DagSerialization.to_dict(dag)).timetable
print(json.dumps({"registered": registered, "errors": errors, "read_back": type(timetable).__name__}))
"""
    env = {**os.environ, "KHIPU_VIEW_ACCESS": "everyone", "DAG_FILE": str(DAG_FILE),
           "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("plugins", "dags", "."))}  # fmt: skip
    env.pop("AIRFLOW_CONN_KHIPU_STORE", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert any(path.endswith("khipu_airflow/plugin.py") for path in found["errors"]), found  # the view did fail
    assert "khipu_airflow.timetables.HourlySinceInstall" in found["registered"], found
    assert found["read_back"] == "HourlySinceInstall", found


def test_a_run_gives_way_before_the_next_hour_is_due(dag) -> None:  # type: ignore[no-untyped-def]
    # a hung Spark job fails its run (retries included) within the hour, so the queue behind it moves hourly
    assert dag.dagrun_timeout is not None and dag.dagrun_timeout < timedelta(hours=1)


def test_no_hour_waits_on_the_previous_hours_success(dag) -> None:  # type: ignore[no-untyped-def]
    # depends_on_past would hold every later hour behind one failed hour: they would pile up unreconciled
    for task in dag.tasks:
        assert not task.depends_on_past, task.task_id
        assert not task.wait_for_downstream, task.task_id


def test_a_catch_up_reconciles_every_missed_hour_once_in_order_whenever_it_runs(dag) -> None:  # type: ignore[no-untyped-def]
    from airflow.serialization.decoders import decode_timetable
    from airflow.serialization.encoders import encode_timetable
    from airflow.timetables.base import TimeRestriction

    timetable = decode_timetable(encode_timetable(dag.timetable))  # the scheduler's own view of the schedule
    start = pendulum.datetime(2026, 11, 23, tz="UTC")
    restriction = TimeRestriction(earliest=start, latest=None, catchup=True)
    runs, last = [], None
    for _ in range(6):  # six hours missed: the scheduler was down, or one hour's run was slow
        info = timetable.next_dagrun_info(last_automated_data_interval=last, restriction=restriction)
        assert info is not None
        runs.append(info)
        last = info.data_interval
    # each run's window follows from its data interval alone, never from when it starts: a late run does its hour
    # (an hourly cron trigger's interval is empty at its logical date: the hour ending there, one horizon back)
    windows = [hourly_window(ms(r.data_interval.start), ms(r.data_interval.end), DEFAULT_HORIZON_MS) for r in runs]
    assert [w.end_ms - w.start_ms for w in windows] == [HOUR_MS] * 6
    assert [w.end_ms for w in windows] == [ms(r.run_after) - DEFAULT_HORIZON_MS for r in runs]
    assert all(a.end_ms == b.start_ms for a, b in pairwise(windows))  # no gap, no overlap
