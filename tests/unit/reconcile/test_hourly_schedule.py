"""When the hourly reconciliation runs next: a numbered table of cases, each with the reason its answer is right.

A run is named by its logical date, a full hour (UTC): the hour ending there, reconciled one horizon back. ``last``
is the logical date of Airflow's latest automated run (scheduled or backfill: Airflow counts both), ``installed``
when the store was created (kept in it, read when Airflow parses the DAG; None: it could not be read), ``now`` the
clock when the scheduler asks. Khipu is installed on 2026-12-06 at 10:20 in most cases; its first hour is 11:00.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import NamedTuple

import pytest

from khipu.reconcile.window import HOUR_MS, next_scheduled_hour_ms


def at(day: int, hour: int, minute: int = 0, month: int = 12) -> int:
    return int(datetime(2026, month, day, hour, minute, tzinfo=UTC).timestamp() * 1000)


INSTALLED = at(6, 10, 20)
BACKFILLED_TO = at(23, 6, month=11)  # the DAG doc's own backfill: 2026-11-23T00 .. 06, before the install


class Case(NamedTuple):
    number: int
    last_ms: int | None
    installed_ms: int | None
    now_ms: int
    not_before_ms: int | None
    catchup: bool
    expected_ms: int
    reason: str


# fmt: off
CASES = [
    Case(1, None, INSTALLED, at(6, 10, 40), None, True, at(6, 11),
         "never ran: the first full hour after the install; no hour before it, whatever the start date"),
    Case(2, None, INSTALLED, at(7, 8, 30), None, True, at(6, 11),
         "Airflow down from 10:50 to the next morning, before the first run: the first run is still the hour after "
         "the install (not the hour after the restart), and the hours since follow it, each once (case 6)"),
    Case(3, BACKFILLED_TO, INSTALLED, at(6, 10, 40), None, True, at(6, 11),
         "a backfill of hours before the install counts as Airflow's latest run; catching up from its end would "
         "queue every hour from 2026-11-23 on: the schedule starts at the install's first hour"),
    Case(4, BACKFILLED_TO, INSTALLED, at(7, 8, 30), None, True, at(6, 11),
         "the same backfill, and Airflow down since: the missed hours after the install still run, from the first"),
    Case(5, at(6, 13), INSTALLED, at(6, 13, 10), None, True, at(6, 14),
         "after a run: the next hour"),
    Case(6, at(6, 13), INSTALLED, at(6, 19, 30), None, True, at(6, 14),
         "Airflow down after a run: the missed hours come one by one from the last run, oldest first (catchup)"),
    Case(7, at(6, 10), INSTALLED, at(6, 10, 25), None, True, at(6, 11),
         "a store upgraded while the old schedule ran (its last run 10:00, the upgrade 10:20): it goes on at 11:00, "
         "nothing skipped, nothing run twice"),
    Case(8, at(6, 14), INSTALLED, at(6, 14, 5), None, True, at(6, 15),
         "a backfill reaching past the install's first hours ran them: they are not run again"),
    Case(9, None, at(6, 11), at(6, 11, 5), None, True, at(6, 12),
         "installed on the hour: the 11:00 run stands for the hour ending at 11:00, all of it before the install"),
    Case(10, None, None, at(6, 10, 40), None, True, at(6, 11),
         "install unknown (the store could not be read at parse), never ran: the next full hour after now"),
    Case(11, BACKFILLED_TO, None, at(6, 10, 40), None, True, BACKFILLED_TO + HOUR_MS,
         "install unknown: Airflow's own hourly rule, from the latest run (the store keeps the install to avoid this)"),
    Case(12, None, INSTALLED, at(6, 10, 40), at(8, 0, 30), True, at(8, 1),
         "a start date after the install still bounds the schedule: its next full hour"),
    Case(13, at(6, 13), INSTALLED, at(6, 19, 30), None, False, at(6, 19),
         "without catchup Airflow runs only the latest hour due, not the missed ones"),
    Case(14, None, INSTALLED, at(7, 8, 30), None, False, at(7, 8),
         "without catchup, never ran, Airflow down since the install: the latest hour due only"),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=[f"case{c.number}" for c in CASES])
def test_next_scheduled_hour_rule_table(case: Case) -> None:
    found = next_scheduled_hour_ms(
        case.last_ms, case.installed_ms, case.now_ms, not_before_ms=case.not_before_ms, catchup=case.catchup
    )
    assert found == case.expected_ms, case.reason


def test_the_cases_are_numbered_in_order_once() -> None:
    assert [case.number for case in CASES] == list(range(1, len(CASES) + 1))


def test_a_catch_up_after_an_outage_runs_every_hour_since_the_install_once_in_order() -> None:
    # Airflow down from before the first run until the next morning: each run the scheduler creates is the last one
    now, hours, last = at(7, 8, 30), [], None
    while (following := next_scheduled_hour_ms(last, INSTALLED, now)) <= now:
        hours.append(following)
        last = following
    assert hours == list(range(at(6, 11), at(7, 8) + 1, HOUR_MS))  # 11:00 .. 08:00 the next day: 22 runs
