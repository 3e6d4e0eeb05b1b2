"""The hourly reconciliation never overlaps itself, and a slow or missed hour does not pile up the next ones.

Airflow runs the DAG: what is proven here is what the DAG asks of it (one run at a time, missed hours caught
up, a run bounded below the hour, no hour waiting on the previous one's success) and that the runs of a
catch-up, taken in the order Airflow's timetable gives them, reconcile every hour exactly once, each its own
hour whenever it starts. The install: the first run Airflow schedules for a DAG that never ran is the next full
hour, never an hour before (a fresh stack once queued ~320 runs from a fixed start date); hours missed after
that first run are still caught up, each once.
"""

from __future__ import annotations

import time
from datetime import timedelta
from itertools import pairwise
from pathlib import Path

import pendulum
import pytest

from khipu.reconcile.window import DEFAULT_HORIZON_MS, HOUR_MS, hourly_window

DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "khipu_reconcile.py"


@pytest.fixture(scope="module")
def dag():  # type: ignore[no-untyped-def]
    from airflow.dag_processing.dagbag import DagBag

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


def test_a_fresh_install_schedules_no_hour_before_it(dag) -> None:  # type: ignore[no-untyped-def]
    before_ms = int(time.time() * 1000)
    first = scheduler_view(dag).next_dagrun_info(last_automated_run_info=None)  # a DAG that never ran
    after_ms = int(time.time() * 1000)
    assert first is not None
    # the next full hour after the scheduler first sees it: no hour before the install gets a run at all
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
